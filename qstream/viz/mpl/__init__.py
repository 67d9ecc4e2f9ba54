"""matplotlib figures of the calibration views (``pip install 'qstream-zarr[plot]'``).

Imported only when a plot is asked for; without matplotlib every entry point raises an
``ImportError`` that says what to install. Charts on a given axes are in :mod:`.charts`, the
one-page figures of an output in :mod:`.pages`, those of a converted checkpoint in
:mod:`.checkpoint`.
"""

from __future__ import annotations

from .charts import (
    DPI,
    PAGE,
    plot_channels,
    plot_groups,
    plot_histogram,
    plot_predictions,
    plot_scales,
    plot_tail,
    plot_worst,
    plot_worst_groups,
    require_matplotlib,
)
from .checkpoint import checkpoint_figure, plot_checkpoint, plot_sizes, plot_worst_tensors
from .pages import figure, group_figure, plot_view, save_figure

# the names the folders above may use
__all__ = [
    "DPI",
    "PAGE",
    "checkpoint_figure",
    "figure",
    "group_figure",
    "plot_channels",
    "plot_checkpoint",
    "plot_groups",
    "plot_histogram",
    "plot_predictions",
    "plot_scales",
    "plot_sizes",
    "plot_tail",
    "plot_view",
    "plot_worst",
    "plot_worst_groups",
    "plot_worst_tensors",
    "require_matplotlib",
    "save_figure",
]
