"""The statistics passes' block work: exact ranges (pass 1) and histograms (pass 2)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...budget import Block
from ...kernels.numpy_twins import numpy_kernels
from ...spec import MergedStats, RangeStats
from ..run import SourceRef
from .blockmath import block_ranges
from .regions import JobPlan, channel_pieces, read_pieces


@dataclass(frozen=True, eq=False)
class RangesWork:
    """Pass 1: exact per-channel ranges and non-finite counts of a block."""

    plan: JobPlan
    source: SourceRef

    def __call__(self, b: Block) -> RangeStats:
        source = self.source.open()
        plan = self.plan
        merged = MergedStats(RangeStats, plan.block_channels(b))
        first = -1
        for region, x in read_pieces(source, b.key):
            part = block_ranges(x, plan.stat_axis)
            merged.add(part, plan.offset(region) - plan.offset(b.key))
            if part.first_nonfinite >= 0:  # as an index into the whole array
                local = np.unravel_index(part.first_nonfinite, x.shape)
                at = tuple(k.start + i for k, i in zip(region, local, strict=True))
                flat = int(np.ravel_multi_index(at, plan.shape)) if at else 0
                first = flat if first < 0 else min(first, flat)
        st = merged.total
        return RangeStats(st.min, st.max, st.count, st.nan, st.posinf, st.neginf, first)


@dataclass(frozen=True, eq=False)
class HistogramWork:
    """Pass 2: fixed-edge histograms of the channels ``lo_channel .. hi_channel`` of a block
    (``|x|`` over ``[0, edges_hi]`` when ``sym``, else ``x`` over ``[edges_lo, edges_hi]``);
    ``edges_*`` cover just those channels. Returns ``(first channel, counts)`` or None when
    the block holds none of them.

    With ``ranges`` (the channels' observed ``(lo, hi)``; only when every block holds whole
    channels), the block's histograms are searched here for the spec's method and
    ``(first channel, lo, hi)`` of its channels comes back instead of the counts."""

    plan: JobPlan
    source: SourceRef
    edges_lo: np.ndarray
    edges_hi: np.ndarray
    sym: bool
    lo_channel: int
    hi_channel: int
    ranges: tuple[np.ndarray, np.ndarray] | None = None

    def __call__(self, b: Block) -> tuple[Any, ...] | None:
        if numpy_kernels():
            from ...kernels.numpy_twins import channel_histograms
        else:
            from ...kernels.stats import channel_histograms

        plan = self.plan
        c0, c1 = plan.channels_of(b, self.lo_channel, self.hi_channel)
        if c1 <= c0:
            return None
        nbins = plan.spec.num_bins
        h = np.zeros((c1 - c0, nbins), np.int64)
        for v, p0, p1 in channel_pieces(plan, self.source.open(), b.key, c0, c1):
            e = slice(p0 - self.lo_channel, p1 - self.lo_channel)
            channel_histograms(
                v,
                np.ascontiguousarray(self.edges_lo[e]),
                np.ascontiguousarray(self.edges_hi[e]),
                self.sym,
                h[p0 - c0 : p1 - c0],
            )
        if self.ranges is None:
            return c0, h
        from ...calibration import method_range

        e = slice(c0 - self.lo_channel, c1 - self.lo_channel)
        counts = {"counts": h, "lo": self.edges_lo[e], "hi": self.edges_hi[e], "abs": self.sym}
        lo, hi = (r[e] for r in self.ranges)
        return (c0, *method_range(counts, lo, hi, plan.spec, plan.qt.bits))

    def combine(self, results: list[Any]) -> list[Any]:
        """The results of consecutive blocks with their histograms summed into the first
        (int64 sums: exact in any order) and None for the rest, so one partial travels back
        from a task; searched ranges are returned as they are."""
        parts = [p for p in results if p is not None]
        if self.ranges is not None or len(parts) < 2:
            return results
        c0 = min(at for at, _ in parts)
        c1 = max(at + h.shape[0] for at, h in parts)
        out = np.zeros((c1 - c0, parts[0][1].shape[1]), np.int64)
        for at, h in parts:
            out[at - c0 : at - c0 + h.shape[0]] += h
        return [(c0, out), *([None] * (len(results) - 1))]
