"""Drawing the calibration views: standalone SVG and HTML (no dependency; notebooks'
``_repr_html_``) in :mod:`qstream.viz.svg` and :mod:`qstream.viz.html`, matplotlib figures in
:mod:`qstream.viz.mpl` (``pip install 'qstream-zarr[plot]'``, matplotlib imported only when a
plot is asked for). The data they draw is in :mod:`qstream.spec.views`.

Importing this package registers the drawing of each view type with
:mod:`qstream.spec.views.display`, through which the data classes (calibrations,
reports, quantized outputs) draw themselves without importing this package.
"""

from __future__ import annotations

from ..spec.views import CheckpointView, Drawing, ReportView, register
from .cell_progress import NotebookProgress, notebook_progress, reporting
from .html import checkpoint_html, view_html
from .mpl import plot_checkpoint, plot_view

register(ReportView, Drawing(html=view_html, plot=plot_view))
register(CheckpointView, Drawing(html=checkpoint_html, plot=plot_checkpoint))


# the names the folders above may use; the submodules named here are loaded on demand
__all__ = [
    "NotebookProgress",
    "mpl",
    "notebook_progress",
    "reporting",
]
