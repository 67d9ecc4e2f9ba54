"""Calibration methods compared on one histogram (the pass is in
:mod:`qstream.engine.jobs.comparison`, the view data in :mod:`qstream.spec.views`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..engine.jobs import QuantizeJob
from ..io.storage import with_backend
from ..spec import Calibration, QuantSpec

if TYPE_CHECKING:
    from ..io.outputs import QuantizedArray, QuantizedCheckpoint
    from ..workflows import ArraySource, ExecutorLike, PathLike, Progress, StorageOptions


def compare_methods(
    src: ArraySource,
    spec: QuantSpec | None = None,
    methods: Sequence[str] | None = None,
    *,
    max_memory: int | None = None,
    progress: Progress | None = None,
    storage_options: StorageOptions | None = None,
    executor: ExecutorLike = None,
    store: str | None = None,
) -> Calibration:
    """Calibrate ``src`` under ``spec`` and set every method of ``methods`` (default: minmax,
    percentile, entropy, mse, l2) side by side, from one ranges pass and one histogram pass
    (writes nothing).

    Returns the :class:`~qstream.Calibration` of ``spec.method`` (the same ranges, scale and
    zero point as :func:`qstream.calibrate` gives) whose ``view`` holds the histogram (per
    tensor, at most 128 bins) and, in ``view.predictions``, each method's range, parameters,
    and the SQNR and clip fraction *predicted from the histogram* (values spread evenly in
    their 2048ths of the range; see :func:`qstream.spec.views.predict_error`), with
    per-channel summaries for a per-axis spec. ``view.best`` names the method with the highest
    predicted SQNR. Integer types, per tensor or per axis. ``max_memory``, ``executor`` and
    ``store``: see :func:`qstream.quantize_store` (per-axis histograms are built in groups of
    channels that fit in half of ``max_memory``; two histograms per channel).
    """
    from ..engine.jobs.comparison import check_comparable, compare

    spec = spec or QuantSpec()
    job = QuantizeJob(
        with_backend(src, store, storage_options, read_only=True),
        spec,
        max_memory=max_memory,
        storage_options=storage_options,
        executor=executor,
    )
    try:
        check_comparable(spec, job.plan)
        return compare(job, methods, progress)
    finally:
        job.close()


def save_plot(
    output: QuantizedArray | QuantizedCheckpoint, path: PathLike, *, title: str | None = None
) -> str:
    """Write the one-page figure of an opened output (:func:`qstream.open_quantized`) to
    ``path`` (``.png`` or ``.svg``; needs matplotlib): for a converted checkpoint its SQNR and
    sizes per tensor, read from the root's index (``title`` heads it); for a group-wise integer
    output the scales and errors per group; else the calibration view. Returns the path."""
    from ..io.outputs import QuantizedCheckpoint
    from ..viz import mpl

    if isinstance(output, QuantizedCheckpoint):
        rows = list(output.tensors.values())
        return mpl.save_figure(None, path, mpl.checkpoint_figure(rows, title))
    group_wise = output.spec.block_size and not output.qtype.is_float
    fig = mpl.group_figure(output.view, output.scale) if group_wise else None
    return mpl.save_figure(output.view, path, fig)
