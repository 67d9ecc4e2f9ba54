"""The statistics passes' block work: exact ranges (pass 1) and histograms (pass 2)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ... import budget
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
        plan = self.plan
        c0, c1 = plan.channels_of(b, self.lo_channel, self.hi_channel)
        if c1 <= c0:
            return None
        source = self.source.open()
        pieces: Iterable[tuple[np.ndarray, int, int]] = channel_pieces(plan, source, b.key, c0, c1)
        if self.ranges is not None and source.pieces(b.key) == [b.key]:
            pieces = list(pieces)  # (the block, read once: searched in groups or counted)
            ((v, p0, p1),) = pieces
            if v.shape[0] == 1 and (p0, p1) == (c0, c1):
                return self._searched(v, c0, c1)
        h = np.zeros((c1 - c0, plan.spec.num_bins), np.int64)
        for v, p0, p1 in pieces:
            self._count(v, p0, p1, h[p0 - c0 : p1 - c0])
        if self.ranges is None:
            return c0, h
        return (c0, *self._search(h, c0, c1))

    def _count(self, v: np.ndarray, p0: int, p1: int, h: np.ndarray) -> None:
        """Add the values ``v`` (an ``[O, C, I]`` view of the channels ``p0 .. p1``) to their
        channels' histograms ``h``."""
        if numpy_kernels():
            from ...kernels.numpy_twins import channel_histograms
        else:
            from ...kernels.stats import channel_histograms

        e = slice(p0 - self.lo_channel, p1 - self.lo_channel)
        lo, hi = (np.ascontiguousarray(a[e]) for a in (self.edges_lo, self.edges_hi))
        channel_histograms(v, lo, hi, self.sym, h)

    def _search(self, h: np.ndarray, c0: int, c1: int) -> tuple[np.ndarray, np.ndarray]:
        """The spec's ranges of the channels ``c0 .. c1`` from their histograms ``h``."""
        from ...calibration import method_range

        plan = self.plan
        e = slice(c0 - self.lo_channel, c1 - self.lo_channel)
        counts = {"counts": h, "lo": self.edges_lo[e], "hi": self.edges_hi[e], "abs": self.sym}
        assert self.ranges is not None  # (searched here: the caller's check)
        lo, hi = (r[e] for r in self.ranges)
        return method_range(counts, lo, hi, plan.spec, plan.qt.bits)

    def _searched(self, v: np.ndarray, c0: int, c1: int) -> tuple[Any, ...]:
        """``(c0, lo, hi)`` of a block read as one piece whose channels are its rows (``v``:
        ``[1, C, I]``), searched a group of channels at a time in one reused histogram of
        at most :data:`~qstream.budget.HISTOGRAM_GROUP_BYTES` (each channel's histogram and
        range are its own: the same as all at once). A block's channels all at once took
        ``channels x num_bins`` int64 counts (64 MiB for a 16 MiB block of 4096 rows at
        2048 bins), each page of it new memory for the process to fault in."""
        nbins = self.plan.spec.num_bins
        group = max(1, budget.HISTOGRAM_GROUP_BYTES // (nbins * 8))
        h = np.empty((min(group, c1 - c0), nbins), np.int64)
        out_lo, out_hi = np.empty(c1 - c0), np.empty(c1 - c0)
        for g0 in range(c0, c1, group):
            g1 = min(c1, g0 + group)
            hg = h[: g1 - g0]
            hg.fill(0)
            self._count(v[:, g0 - c0 : g1 - c0], g0, g1, hg)
            out_lo[g0 - c0 : g1 - c0], out_hi[g0 - c0 : g1 - c0] = self._search(hg, g0, g1)
        return c0, out_lo, out_hi

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
