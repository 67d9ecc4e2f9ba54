"""A job's statistics passes and the parameters they give.

:func:`calibration` runs what the spec needs: nothing for given or per-block (dynamic)
parameters; else the ranges pass (:func:`ranges`), then for histogram methods the histogram
pass and the threshold search (:func:`histogram_ranges`), and derives the parameters. A
per-tensor minmax job that draws its views makes one histogram pass for them
(:func:`view_histogram`). Every pass merges in block order (see
:mod:`qstream.engine.run.pipeline`), so its result never depends on how the work was cut.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from ...budget import Block, mib
from ...errors import InvalidParameterError
from ...spec import HISTOGRAM_METHODS, Calibration, MergedStats, QuantParams, RangeStats
from ...spec.views import Histogram
from ..blocks import HistogramWork, JobPlan, RangesWork
from .job_params import explicit_params, offset_params
from .passes import JobView, Progress, report_stage

HIST_SHARE = 2  # histograms may take 1/HIST_SHARE of the memory bound


def ranges(job: JobView, progress: Progress | None = None) -> RangeStats:
    """Pass 1: exact per-channel ranges, merged in block order (min/max and counts are
    exact, so the result never depends on how the work was cut)."""
    plan = job.plan
    total = MergedStats(RangeStats, plan.channels)
    first: list[int] = []

    def merge(b: Block, st: RangeStats) -> None:
        total.add(st, plan.offset(b.key))
        if st.first_nonfinite >= 0:
            first.append(st.first_nonfinite)

    job.scan(job.blocks, RangesWork(plan, job.ref), merge, progress, stage="ranges")
    return replace(total.total, first_nonfinite=min(first) if first else -1)


def check_nonfinite(job: JobView, st: RangeStats) -> None:
    """Refuse a source with NaN or infinite values when the spec's ``nan_policy`` is
    ``error``, naming the array, the count and the first index."""
    if job.spec.nan_policy == "error" and st.nonfinite:
        raise st.refusal(job.name, job.plan.shape)


def calibration(job: JobView, progress: Progress | None = None) -> Calibration:
    """The statistics passes the spec needs, and the parameters they give."""
    spec, plan = job.spec, job.plan
    if spec.scale is not None:
        return Calibration(spec, None, {}, explicit_params(plan, job.layout))
    if plan.dynamic:  # one pass: each block takes its own range while quantizing
        return Calibration(spec, None, {"method": "per-block ranges"}, None)
    return from_ranges(job, ranges(job, progress), progress)


def from_ranges(
    job: JobView,
    st: RangeStats,
    progress: Progress | None = None,
    params: tuple[np.ndarray, np.ndarray] | None = None,
) -> Calibration:
    """:func:`calibration` from the ranges pass's result ``st``: the refusal of non-finite
    values (``nan_policy="error"``), the method's passes and the parameters (``params``:
    ``(scale, zero_point)`` as ``params_from_range`` gives them, taken already with the
    ranges by a kernel that calibrates while it quantizes)."""
    spec, plan = job.spec, job.plan
    check_nonfinite(job, st)
    lo, hi = np.where(st.count > 0, st.min, 0.0), np.where(st.count > 0, st.max, 0.0)
    thresholds: dict[str, Any] = {"min": lo, "max": hi}
    view_hist = None  # the per-tensor histogram for the views (calibration views)
    if spec.method in HISTOGRAM_METHODS:
        lo, hi, view_hist = histogram_ranges(job, lo, hi, progress)
        thresholds = {"min": lo, "max": hi, "num_bins": spec.num_bins}
    elif job.view_histogram and plan.channels == 1:
        view_hist = view_histogram(job, lo, hi, progress)
    from ...calibration import params_from_range
    from ...spec.views import calibration_view

    view = calibration_view(spec, st, lo, hi, view_hist) if job.views else None
    if spec.float_offset:
        return Calibration(spec, st, thresholds, offset_params(lo, hi, plan, job.layout), view)
    scale, zp = params or params_from_range(
        lo,
        hi,
        plan.qt,
        symmetric=spec.symmetric,
        narrow_range=spec.narrow_range,
        scale_mode=spec.scale_mode,
        full_levels=spec.full_levels,
    )
    quant = QuantParams(
        scale.reshape(plan.param_shape), zp.reshape(plan.param_shape), plan.axis, None
    )
    return Calibration(spec, st, thresholds, quant, view)


def histogram_ranges(
    job: JobView, lo: np.ndarray, hi: np.ndarray, progress: Progress | None
) -> tuple[np.ndarray, np.ndarray, Histogram | None]:
    """Pass 2 and the threshold search: the method's ranges, and (per tensor) the histogram
    kept for the views. When every block holds whole channels (channels on the outermost
    axis), each block's histograms are searched as the block comes back (on a cluster, by
    the worker that built them: only the channels' ranges travel), with no histograms kept
    beyond the blocks in flight. Otherwise the histograms are merged here, over groups of
    channels that fit in the memory bound (``1/HIST_SHARE`` of it for the histograms being
    merged and one in-flight block's partial per worker); blocks that hold none of a group's
    channels are not read for it, and when every block holds every channel (channels on an
    inner axis) each group reads the source once more."""
    from ...calibration import method_range

    spec, plan = job.spec, job.plan
    sym = spec.method in ("entropy", "mse") or (spec.method == "percentile" and spec.symmetric)
    edges_lo = np.zeros(plan.channels) if sym else lo
    edges_hi = np.maximum(-lo, hi) if sym else hi
    out_lo, out_hi = np.array(lo, np.float64), np.array(hi, np.float64)
    view_hist = None
    budget = job.memory // HIST_SHARE
    if 2 * spec.num_bins * 8 > budget:
        raise InvalidParameterError(
            f"num_bins {spec.num_bins} needs {mib(2 * spec.num_bins * 8)} of histograms,"
            f" more than the memory bound ({mib(job.memory)}) allows; lower num_bins or"
            " raise max_memory"
        )
    workers = job.worker_count()
    per_block = plan.block_channels(job.blocks[0]) * spec.num_bins * 8  # (the largest)
    if whole_channels(plan) and workers * per_block <= budget:
        # each block's channels are searched by the worker that counted them (on a cluster,
        # in parallel processes; only the channels' ranges come back), a group of channels
        # at a time where the block is one piece (HistogramWork: one small histogram reused)
        work = HistogramWork(plan, job.ref, edges_lo, edges_hi, sym, 0, plan.channels, (lo, hi))

        def found(b: Block, part: tuple[Any, ...]) -> None:
            at, glo, ghi = part
            out_lo[at : at + glo.size], out_hi[at : at + ghi.size] = glo, ghi

        job.scan(job.blocks, work, found, progress, stage="histograms", workers=workers)
        return out_lo, out_hi, view_hist
    workers = job.worker_count(cap=2)
    row = spec.num_bins * 8
    group = max(1, budget // ((workers + 1) * row))
    n_groups = -(-plan.channels // group)
    for c0 in range(0, plan.channels, group):
        c1 = min(plan.channels, c0 + group)
        hist = np.zeros((c1 - c0, spec.num_bins), np.int64)

        def merge(b: Block, part: Any, hist: np.ndarray = hist, c0: int = c0) -> None:
            if part is not None:
                at, h = part
                hist[at - c0 : at - c0 + h.shape[0]] += h

        blocks = job.blocks.only(plan.stat_axis, c0, c1)
        work = HistogramWork(
            plan, job.ref, edges_lo[c0:c1].copy(), edges_hi[c0:c1].copy(), sym, c0, c1
        )
        # local: one partial per worker in flight; a cluster combines a task's partials
        inflight = None if job.executor.distributed else workers
        job.scan(
            blocks,
            work,
            merge,
            progress,
            stage="histograms"
            + (
                f" (channels {c0}-{c1 - 1}, group {c0 // group + 1}/{n_groups})"
                if n_groups > 1
                else ""
            ),
            workers=workers,
            inflight=inflight,
            new_pass=c0 == 0,
        )
        counts = {"counts": hist, "lo": edges_lo[c0:c1], "hi": edges_hi[c0:c1], "abs": sym}
        searching = None
        if progress is not None and c1 - c0 > 1:  # thousands of channels take seconds
            report_stage(progress, f"search (channels {c0}-{c1 - 1})", c1 - c0)
            searching = progress
        out_lo[c0:c1], out_hi[c0:c1] = method_range(
            counts, lo[c0:c1], hi[c0:c1], spec, plan.qt.bits, progress=searching
        )
        if plan.channels == 1:  # kept for the views, in bounded size
            view_hist = Histogram.from_counts(hist[0], edges_lo[0], edges_hi[0], abs=sym)
        del hist, counts
    return out_lo, out_hi, view_hist


def whole_channels(plan: JobPlan) -> bool:
    """Whether every block holds whole channels (all of the other axes)."""
    if plan.stat_axis is None:
        return False
    return all(
        c >= n
        for d, (c, n) in enumerate(zip(plan.chunks, plan.shape, strict=True))
        if d != plan.stat_axis
    )


def view_histogram(
    job: JobView, lo: np.ndarray, hi: np.ndarray, progress: Progress | None = None
) -> Histogram:
    """One histogram pass over a per-tensor source for the views (``|x|`` over ``[0,
    absmax]`` for a symmetric spec, else ``x`` over ``[min, max]``), in at most
    :data:`~qstream.spec.views.VIEW_BINS` bins."""
    plan = job.plan
    sym = job.spec.symmetric
    e_lo = np.zeros(1) if sym else np.asarray(lo, np.float64).reshape(1)
    e_hi = (
        np.maximum(-np.asarray(lo), np.asarray(hi)).reshape(1)
        if sym
        else np.asarray(hi, np.float64).reshape(1)
    )
    hist = np.zeros((1, plan.spec.num_bins), np.int64)

    def merge(b: Block, part: Any) -> None:
        if part is not None:
            hist[part[0] : part[0] + 1] += part[1]

    work = HistogramWork(plan, job.ref, e_lo, e_hi, sym, 0, 1)
    workers = job.worker_count(cap=2)
    job.scan(
        job.blocks,
        work,
        merge,
        progress,
        stage="histograms",
        workers=workers,
        inflight=None if job.executor.distributed else workers,
    )
    return Histogram.from_counts(hist[0], e_lo[0], e_hi[0], abs=sym)
