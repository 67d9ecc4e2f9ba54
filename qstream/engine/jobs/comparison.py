"""Calibration methods side by side, from one histogram pass (:func:`compare`).

:func:`compare` runs the ranges pass, then one pass that builds, from each block read once,
the two histograms the methods search: ``|x|`` over ``[0, absmax]`` (percentile when
symmetric, entropy, mse) and ``x`` over ``[min, max]`` (percentile when asymmetric, l2).
Their edges and the searches are the job's own, so every method's range is the one
``qstream.calibrate`` gives for that method, bit for bit. Each method's error is then
*predicted* from the signed histogram (:func:`qstream.spec.views.predict_error`).
Per channel the histograms are built in groups of channels that fit in the memory bound, as
the job does (a group reads only the blocks that hold its channels).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ...budget import Block, memory_limit
from ...calibration import method_range, params_from_range
from ...errors import InvalidParameterError
from ...spec import HISTOGRAM_METHODS, Calibration, QuantParams, QuantSpec
from ...spec.views import (
    ChannelSummary,
    Histogram,
    MethodPrediction,
    calibration_view,
    channel_sqnr,
    clip_ratio,
    clip_summary,
    total_sqnr,
)
from ..blocks import JobPlan, channel_pieces
from ..run import SourceRef
from .calibration_passes import HIST_SHARE, check_nonfinite
from .calibration_passes import ranges as ranges_pass
from .passes import JobView, Progress

COMPARED = ("minmax", "percentile", "entropy", "mse", "l2")
ABS_SEARCH = ("entropy", "mse")  # searched over |x| whatever the spec's symmetry


@dataclass(frozen=True, eq=False)
class DualHistogramWork:
    """One read of a block, two fixed-edge histograms of the channels ``lo_channel ..
    hi_channel``: ``|x|`` over ``[0, amax]`` and ``x`` over ``[lo, hi]`` (per channel).
    Returns ``(first channel, abs counts, signed counts)`` or None."""

    plan: JobPlan
    source: SourceRef
    amax: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    lo_channel: int
    hi_channel: int

    def __call__(self, b: Block) -> tuple[int, np.ndarray, np.ndarray] | None:
        from ...kernels.stats import channel_histograms

        plan = self.plan
        c0, c1 = plan.channels_of(b, self.lo_channel, self.hi_channel)
        if c1 <= c0:
            return None
        nbins = plan.spec.num_bins
        ha = np.zeros((c1 - c0, nbins), np.int64)
        hs = np.zeros((c1 - c0, nbins), np.int64)
        for v, p0, p1 in channel_pieces(plan, self.source.open(), b.key, c0, c1):
            e = slice(p0 - self.lo_channel, p1 - self.lo_channel)
            zeros = np.zeros(p1 - p0)
            amax = np.ascontiguousarray(self.amax[e])
            channel_histograms(v, zeros, amax, True, ha[p0 - c0 : p1 - c0])
            lo, hi = np.ascontiguousarray(self.lo[e]), np.ascontiguousarray(self.hi[e])
            channel_histograms(v, lo, hi, False, hs[p0 - c0 : p1 - c0])
        return c0, ha, hs

    def combine(self, results: list[Any]) -> list[Any]:
        """Consecutive blocks' histograms summed into the first (exact int64 sums)."""
        parts = [p for p in results if p is not None]
        if len(parts) < 2:
            return results
        c0 = min(p[0] for p in parts)
        c1 = max(p[0] + p[1].shape[0] for p in parts)
        nb = parts[0][1].shape[1]
        ha, hs = np.zeros((c1 - c0, nb), np.int64), np.zeros((c1 - c0, nb), np.int64)
        for at, a, s in parts:
            ha[at - c0 : at - c0 + a.shape[0]] += a
            hs[at - c0 : at - c0 + s.shape[0]] += s
        return [(c0, ha, hs), *([None] * (len(results) - 1))]


def check_comparable(spec: QuantSpec, plan: JobPlan) -> None:
    """Refuse what the comparison cannot do, naming the reason."""
    if spec.scale is not None:
        raise InvalidParameterError("methods are compared without an explicit scale")
    if spec.block_size is not None or plan.dynamic:
        raise InvalidParameterError(
            "methods are compared per tensor or per axis, not with block_size or method"
            " 'dynamic' (blocks take their own range)"
        )
    if plan.qt.is_float:
        raise InvalidParameterError(
            f"methods are compared for integer types, not {plan.qt.name} (its scale comes"
            " from the range alone)"
        )


def compare(
    job: JobView, methods: Sequence[str] | None = None, progress: Progress | None = None
) -> Calibration:
    """The calibration of ``job.spec`` with a :class:`CalibrationView` whose predictions hold
    every method of ``methods`` (default: minmax, percentile, entropy, mse, l2), all from one
    ranges pass and one histogram pass (see the module docstring)."""
    spec, plan = job.spec, job.plan
    check_comparable(spec, plan)
    methods = tuple(dict.fromkeys(methods or COMPARED))
    for m in methods:
        if m not in COMPARED:
            raise InvalidParameterError(
                f"unknown method {m!r} to compare; expected some of: {', '.join(COMPARED)}"
            )
    if spec.method not in methods:
        methods = (spec.method, *methods)
    st = ranges_pass(job, progress)
    check_nonfinite(job, st)
    lo = np.where(st.count > 0, st.min, 0.0)
    hi = np.where(st.count > 0, st.max, 0.0)
    amax = np.maximum(-lo, hi)
    n = plan.channels
    qmin, qmax = plan.qt.qrange(spec.narrow_range)
    ranges = {m: (np.array(lo, np.float64), np.array(hi, np.float64)) for m in methods}
    scale = {m: np.zeros(n, np.float64) for m in methods}
    zp = {m: np.zeros(n, np.float64) for m in methods}
    sums = {m: np.zeros((3, n)) for m in methods}  # sum_x2, sum_e2, clipped
    view_hist = None

    budget = memory_limit(job.max_memory) // HIST_SHARE
    workers = job.worker_count(cap=2)
    row = 2 * spec.num_bins * 8
    group = max(1, budget // ((workers + 1) * row))
    n_groups = -(-n // group)
    for c0 in range(0, n, group):
        c1 = min(n, c0 + group)
        ha = np.zeros((c1 - c0, spec.num_bins), np.int64)
        hs = np.zeros((c1 - c0, spec.num_bins), np.int64)

        def merge(b, part, ha=ha, hs=hs, c0=c0) -> None:
            if part is not None:
                at, a, s = part
                ha[at - c0 : at - c0 + a.shape[0]] += a
                hs[at - c0 : at - c0 + s.shape[0]] += s

        blocks = job.blocks.only(plan.stat_axis, c0, c1)
        g = slice(c0, c1)
        work = DualHistogramWork(plan, job.ref, amax[g].copy(), lo[g].copy(), hi[g].copy(), c0, c1)
        label = f" (channels {c0}-{c1 - 1}, group {c0 // group + 1}/{n_groups})"
        job.scan(
            blocks,
            work,
            merge,
            progress,
            stage="histograms" + (label if n_groups > 1 else ""),
            workers=workers,
            inflight=None if job.executor.distributed else workers,
            new_pass=c0 == 0,
        )
        h_abs = {"counts": ha, "lo": np.zeros(c1 - c0), "hi": amax[g], "abs": True}
        h_sig = {"counts": hs, "lo": lo[g], "hi": hi[g], "abs": False}
        nonzero = np.nonzero(hs)  # (once for every method's prediction)
        for m in methods:
            if m != "minmax":
                use_abs = m in ABS_SEARCH or (m == "percentile" and spec.symmetric)
                mspec = replace(spec, method=m)
                r = method_range(h_abs if use_abs else h_sig, lo[g], hi[g], mspec, plan.qt.bits)
                ranges[m][0][g], ranges[m][1][g] = r
            s, z = params_from_range(
                ranges[m][0][g],
                ranges[m][1][g],
                plan.qt,
                symmetric=spec.symmetric,
                narrow_range=spec.narrow_range,
                full_levels=spec.full_levels,
            )
            scale[m][g], zp[m][g] = s, z
            sums[m][:, g] = _predict(hs, lo[g], hi[g], s, z, qmin, qmax, nonzero)
        if n == 1:
            view_hist = (
                Histogram.from_counts(ha[0], 0.0, amax[0], abs=True)
                if spec.symmetric
                else Histogram.from_counts(hs[0], lo[0], hi[0])
            )
        del ha, hs

    total = st.count.astype(np.float64)
    preds = []
    for m in methods:
        sx2, se2, clipped = sums[m]
        frac = float(clipped.sum() / total.sum()) if total.sum() else 0.0
        ratio = clip_ratio(*ranges[m], lo, hi, symmetric=spec.symmetric)
        if n == 1:
            preds.append(
                MethodPrediction(
                    m,
                    total_sqnr(sx2, se2),
                    frac,
                    lo=float(ranges[m][0][0]),
                    hi=float(ranges[m][1][0]),
                    scale=float(np.float32(scale[m][0])),
                    zero_point=float(zp[m][0]),
                )
            )
        else:
            with np.errstate(invalid="ignore", divide="ignore"):
                cfrac = np.where(total > 0, clipped / np.maximum(total, 1), 0.0)
            preds.append(
                MethodPrediction(
                    m,
                    total_sqnr(sx2, se2),
                    frac,
                    clip_ratio=clip_summary(ratio),
                    channels=ChannelSummary.from_sqnr(channel_sqnr(sx2, se2), clip_fraction=cfrac),
                )
            )
    chosen_lo, chosen_hi = ranges[spec.method]
    thresholds: dict[str, Any] = {"min": chosen_lo, "max": chosen_hi}
    if spec.method in HISTOGRAM_METHODS:
        thresholds["num_bins"] = spec.num_bins
    s, z = params_from_range(
        chosen_lo,
        chosen_hi,
        plan.qt,
        symmetric=spec.symmetric,
        narrow_range=spec.narrow_range,
        full_levels=spec.full_levels,
    )
    params = QuantParams(s.reshape(plan.param_shape), z.reshape(plan.param_shape), plan.axis, None)
    view = calibration_view(spec, st, chosen_lo, chosen_hi, view_hist, preds)
    return Calibration(spec, st, thresholds, params, view)


def _predict(hs, lo, hi, scale, zp, qmin, qmax, nonzero):
    from ...spec.views import predict_error

    return np.stack(
        predict_error(hs, lo, hi, scale.astype(np.float64), zp, qmin, qmax, nonzero=nonzero)
    )
