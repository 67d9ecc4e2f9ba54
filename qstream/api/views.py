"""Calibration methods compared on one histogram (the pass is in
:mod:`qstream.engine.compare`, the view data in :mod:`qstream.calibration.views`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..engine.job import QuantizeJob
from ..io.stores import with_backend
from ..spec import Calibration, QuantSpec

if TYPE_CHECKING:
    from .types import ArraySource, ExecutorLike, Progress, StorageOptions


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
    their 2048ths of the range; see :func:`qstream.calibration.views.predict_error`), with
    per-channel summaries for a per-axis spec. ``view.best`` names the method with the highest
    predicted SQNR. Integer types, per tensor or per axis. ``max_memory``, ``executor`` and
    ``store``: see :func:`qstream.quantize_store` (per-axis histograms are built in groups of
    channels that fit in half of ``max_memory``; two histograms per channel).
    """
    from ..engine.compare import check_comparable, compare

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
