"""Per-channel and per-group quantities in bounded size: the per-channel SQNR
(:class:`ChannelSummary`, with the sums it comes from and the clip ratios of a calibration)
and the SQNR of a blocked output's parameter groups (:class:`GroupSummary`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from .histograms import Histogram, json_float, quantiles, read_float

WORST = 5  # worst channels listed


@dataclass(frozen=True)
class ChannelSummary:
    """Per-channel SQNR (dB) in bounded size: quantiles and a histogram of the finite values,
    how many channels are exact (no error: infinite SQNR), and the worst channels."""

    channels: int
    quantiles: dict[str, float] | None
    histogram: Histogram | None
    exact: int = 0
    # dicts: channel, sqnr_db, and clip_fraction / max_abs when known
    worst: tuple[dict[str, Any], ...] = ()

    @classmethod
    def from_sqnr(
        cls,
        sqnr: npt.ArrayLike,
        *,
        clip_fraction: np.ndarray | None = None,
        max_abs: np.ndarray | None = None,
        worst: int = WORST,
    ) -> ChannelSummary:
        """The summary of the per-channel SQNR ``sqnr`` (dB), the worst channels with their
        ``clip_fraction`` and ``max_abs`` (per channel) when given."""
        sqnr = np.asarray(sqnr, np.float64).reshape(-1)
        key = np.where(np.isnan(sqnr), -np.inf, sqnr)
        order = np.argsort(key, kind="stable")[:worst]
        rows = []
        for c in order:
            row: dict[str, Any] = {"channel": int(c), "sqnr_db": float(sqnr[c])}
            if clip_fraction is not None:
                row["clip_fraction"] = float(clip_fraction[c])
            if max_abs is not None:
                row["max_abs"] = float(max_abs[c])
            rows.append(row)
        return cls(
            channels=int(sqnr.size),
            quantiles=quantiles(sqnr),
            histogram=Histogram.of_values(sqnr),
            exact=int(np.count_nonzero(sqnr == np.inf)),
            worst=tuple(rows),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "channels": self.channels,
            "quantiles": self.quantiles,
            "histogram": None if self.histogram is None else self.histogram.to_dict(),
            "exact": self.exact,
            "worst": [
                {k: json_float(v) if k != "channel" else v for k, v in w.items()}
                for w in self.worst
            ],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ChannelSummary:
        return cls(
            channels=int(d["channels"]),
            quantiles=d.get("quantiles"),
            histogram=Histogram.from_dict(d["histogram"]) if d.get("histogram") else None,
            exact=int(d.get("exact", 0)),
            worst=tuple(
                {k: (int(v) if k == "channel" else read_float(v)) for k, v in w.items()}
                for w in d.get("worst", ())
            ),
        )


def channel_sqnr(sum_x2: npt.ArrayLike, sum_e2: npt.ArrayLike) -> np.ndarray:
    """Per-channel SQNR in dB from error sums: inf where there is no error, -inf where the
    signal is 0 and the error is not."""
    sx2 = np.asarray(sum_x2, np.float64)
    se2 = np.asarray(sum_e2, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = 10.0 * np.log10(sx2 / se2)
    out = np.where(se2 == 0, np.inf, out)
    return np.where((se2 > 0) & (sx2 == 0), -np.inf, out)


def total_sqnr(sum_x2: npt.ArrayLike, sum_e2: npt.ArrayLike) -> float:
    """The SQNR in dB of all the channels together, from their error sums."""
    sx2, se2 = float(np.sum(np.asarray(sum_x2))), float(np.sum(np.asarray(sum_e2)))
    if se2 == 0:
        return math.inf
    return -math.inf if sx2 == 0 else 10.0 * math.log10(sx2 / se2)


def clip_ratio(
    lo: npt.ArrayLike,
    hi: npt.ArrayLike,
    data_lo: npt.ArrayLike,
    data_hi: npt.ArrayLike,
    *,
    symmetric: bool,
) -> np.ndarray:
    """Per channel, how much of the observed range a calibration keeps: symmetric ranges
    ``max(-lo, hi) / max(-min, max)``; asymmetric ``(hi - lo) / (max - min)``; 1 means nothing
    is clipped (and for an all-zero channel)."""
    a, b = np.asarray(lo, np.float64), np.asarray(hi, np.float64)
    dlo, dhi = np.asarray(data_lo, np.float64), np.asarray(data_hi, np.float64)
    if symmetric:
        kept, seen = np.maximum(-a, b), np.maximum(-dlo, dhi)
    else:
        kept, seen = b - a, dhi - dlo
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(seen > 0, kept / seen, 1.0)
    return np.minimum(r, 1.0)


def clip_summary(ratio: npt.ArrayLike, worst: int = WORST) -> dict[str, Any]:
    """Quantiles of per-channel clip ratios and the channels that keep the least."""
    r = np.asarray(ratio, np.float64).reshape(-1)
    order = np.argsort(r, kind="stable")[:worst]
    return {
        "quantiles": quantiles(r),
        "lowest": [{"channel": int(c), "ratio": float(r[c])} for c in order],
    }


GROUP_ROWS = 48  # bins of a drawn per-group SQNR histogram (at most)


@dataclass(frozen=True)
class GroupSummary:
    """The SQNR of a group-wise (blocked) output's parameter groups: the distribution of
    every group's SQNR (``histogram``: the stored fixed bins over their occupied span, exact
    counts; None for outputs written before it was kept) and the worst groups.

    ``groups`` counts every group: those in the histogram, ``below``/``above`` its whole
    range (``range_db``), ``exact`` (no error: infinite SQNR) and ``zero_signal`` (all zero
    or non-finite). Quantiles are at the bins' resolution (``step_db``)."""

    groups: int
    histogram: Histogram | None
    below: int = 0
    above: int = 0
    exact: int = 0
    zero_signal: int = 0
    step_db: float | None = None
    range_db: tuple[float, float] | None = None
    # dicts: group, first_element, sqnr_db, max_abs (worst first)
    worst: tuple[dict[str, Any], ...] = ()

    @classmethod
    def from_error(cls, error: dict[str, Any] | None) -> GroupSummary | None:
        """The summary of an error report; None when it has neither the distribution nor
        worst groups (not a blocked integer output)."""
        error = error or {}
        d, worst = error.get("groups"), error.get("worst_groups")
        if not d and worst is None:
            return None
        rows = tuple(
            {
                **w,
                "sqnr_db": read_float(w.get("sqnr_db")),
                "max_abs": read_float(w.get("max_abs")),
            }
            for w in worst or ()
        )
        if not d:
            return cls(groups=0, histogram=None, worst=rows)
        hist = None
        edges, counts = d.get("edges_db") or [], d.get("counts") or []
        if counts:
            hist = Histogram(float(edges[0]), float(edges[-1]), np.asarray(counts, np.int64))
        rng = d.get("range_db")
        return cls(
            groups=int(d.get("groups", 0)),
            histogram=hist,
            below=int(d.get("below", 0)),
            above=int(d.get("above", 0)),
            exact=int(d.get("exact", 0)),
            zero_signal=int(d.get("zero_signal", 0)),
            step_db=None if d.get("step_db") is None else float(d["step_db"]),
            range_db=None if rng is None else (float(rng[0]), float(rng[1])),
            worst=rows,
        )

    @property
    def finite(self) -> int:
        """Groups with a finite SQNR (in the histogram, or below/above its range)."""
        return self.below + self.above + (0 if self.histogram is None else self.histogram.total)

    def quantile(self, q: float) -> float | None:
        """The SQNR (dB) below which a share ``q`` (0..1) of the groups with a finite SQNR
        lies, at the bins' resolution (linear within a bin); None without a histogram, or
        when the quantile lies below or above the bins' range."""
        h = self.histogram
        n = self.finite
        if h is None or not n:
            return None
        rank = q * n - self.below
        if rank < 0:
            return None
        cum = np.cumsum(h.counts)
        if rank > cum[-1]:
            return None
        k = int(np.searchsorted(cum, rank, side="left"))
        before = cum[k - 1] if k else 0
        inside = (rank - before) / h.counts[k] if h.counts[k] else 0.0
        e = h.edges
        return float(e[k] + (e[k + 1] - e[k]) * inside)

    @property
    def quantiles(self) -> dict[str, float | None] | None:
        """``p05, median, p95`` at bin resolution (``min``: the worst group's exact SQNR)."""
        if self.histogram is None:
            return None
        out = {k: self.quantile(q) for k, q in (("p05", 0.05), ("median", 0.5), ("p95", 0.95))}
        if self.worst and self.worst[0].get("sqnr_db") is not None:
            out["min"] = self.worst[0]["sqnr_db"]
        return out

    def shown(self, rows: int = GROUP_ROWS) -> Histogram | None:
        """The histogram in at most ``rows`` bins (adjacent bins summed: exact)."""
        return None if self.histogram is None else self.histogram.regroup(rows)

    def markers(self) -> list[tuple[str, float]]:
        """``(label, dB)`` to mark: the median group and the worst group (when in range)."""
        out: list[tuple[str, float]] = []
        q = self.quantiles or {}
        h = self.histogram
        median = q.get("median")
        if median is not None:
            out.append(("median", median))
        w = q.get("min")
        if h is not None and w is not None and math.isfinite(w) and h.lo <= w <= h.hi:
            out.append(("worst", w))
        return sorted(out, key=lambda m: m[1])

    def notes(self) -> str:
        """The groups outside the histogram, in words (empty when none)."""
        parts = []
        lo, hi = self.range_db or (None, None)
        if self.below:
            parts.append(f"{self.below} below {lo:g} dB")
        if self.above:
            parts.append(f"{self.above} above {hi:g} dB")
        if self.exact:
            parts.append(f"{self.exact} exact (no error)")
        if self.zero_signal:
            parts.append(f"{self.zero_signal} without signal")
        return ", ".join(parts)
