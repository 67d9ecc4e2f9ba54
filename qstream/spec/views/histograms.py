"""Histograms in bounded size: :class:`Histogram` (fixed edges, exact integer counts) and the
quantiles of a set of values; with the JSON form of floats the views share."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, SupportsFloat

import numpy as np
import numpy.typing as npt

VIEW_BINS = 128  # bins of a stored histogram (at most)
SQNR_BINS = 24  # bins of a histogram over channels
QUANTILES: tuple[tuple[str, float], ...] = (
    ("min", 0.0),
    ("p05", 5.0),
    ("p25", 25.0),
    ("median", 50.0),
    ("p75", 75.0),
    ("p95", 95.0),
    ("max", 100.0),
)


def json_float(v: SupportsFloat | None) -> float | str | None:
    """A JSON-ready float (non-finite as the library's "inf"/"nan" strings)."""
    if v is None:
        return None
    f = float(v)
    return f if math.isfinite(f) else str(f)


def read_float(v: SupportsFloat | str | None) -> float | None:
    """A float :func:`json_float` wrote (None stays None)."""
    if v is None:
        return None
    return float(v)  # float("inf") / float("nan") read the strings back


_FRACTIONS = np.array([p for _, p in QUANTILES]) / 100


def quantiles(values: npt.ArrayLike) -> dict[str, float] | None:
    """``min, p05, p25, median, p75, p95, max`` of the finite ``values`` (None if none):
    ``np.percentile``'s default (linear) interpolation, its operations in its order, a zero
    always +0.0. Computed here from the sorted values: ``np.percentile`` costs ~20 us a call
    and, on its first, imports ``numpy.ma`` (7 ms of a small conversion)."""
    v = np.asarray(values, np.float64).reshape(-1)
    v = np.sort(v[np.isfinite(v)])
    if not v.size:
        return None
    at = (v.size - 1) * _FRACTIONS  # (where each quantile sits between two sorted values)
    below = np.floor(at).astype(np.intp)
    above = np.minimum(below + 1, v.size - 1)
    gamma = at - below
    a, b = v[below], v[above]
    diff = b - a
    q = np.where(gamma >= 0.5, b - diff * (1 - gamma), a + diff * gamma) + 0.0
    return {name: float(x) for (name, _), x in zip(QUANTILES, q, strict=True)}


@dataclass(frozen=True, eq=False)
class Histogram:
    """Counts over ``nbins`` equal bins from ``lo`` to ``hi``; ``abs``: counts of ``|x|``."""

    lo: float
    hi: float
    counts: np.ndarray  # int64
    abs: bool = False

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Histogram):
            return NotImplemented
        return (self.lo, self.hi, self.abs) == (other.lo, other.hi, other.abs) and bool(
            np.array_equal(self.counts, other.counts)
        )

    __hash__ = None  # type: ignore[assignment]

    @property
    def nbins(self) -> int:
        return int(self.counts.size)

    @property
    def edges(self) -> np.ndarray:
        e = np.linspace(self.lo, self.hi, self.nbins + 1)
        e[-1] = self.hi
        return e

    @property
    def centers(self) -> np.ndarray:
        e = self.edges
        return np.asarray((e[:-1] + e[1:]) / 2)

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    @classmethod
    def from_counts(
        cls,
        counts: npt.ArrayLike,
        lo: SupportsFloat,
        hi: SupportsFloat,
        *,
        abs: bool = False,
        bins: int = VIEW_BINS,
    ) -> Histogram:
        """The histogram ``counts`` over ``[lo, hi]`` in at most ``bins`` bins: groups of
        ``ceil(n / bins)`` adjacent bins summed (exact); a short last group extends the top
        edge by the missing (empty) bins, so every bin has the same width."""
        c = np.asarray(counts, np.int64).reshape(-1)
        n = c.size
        f = max(1, -(-n // bins))
        m = -(-n // f)
        padded = np.zeros(m * f, np.int64)
        padded[:n] = c
        low, high = float(lo), float(hi)
        top = high if m * f == n else low + (high - low) * (m * f) / n
        return cls(low, top, padded.reshape(m, f).sum(axis=1), bool(abs))

    @classmethod
    def of_values(cls, values: npt.ArrayLike, bins: int = SQNR_BINS) -> Histogram | None:
        """A histogram of the finite ``values`` over their range (None if none)."""
        v = np.asarray(values, np.float64).reshape(-1)
        v = v[np.isfinite(v)]
        if not v.size:
            return None
        lo, hi = float(v.min()), float(v.max())
        if hi <= lo:
            lo, hi = lo - 0.5, hi + 0.5
        counts, _ = np.histogram(v, bins=bins, range=(lo, hi))
        return cls(lo, hi, counts.astype(np.int64))

    def clipped(self, clip: tuple[float, float] | None) -> np.ndarray:
        """Which bins lie wholly outside the clip range ``clip = (lo, hi)`` (on a ``|x|``
        histogram: above ``max(-lo, hi)``)."""
        e = self.edges
        if clip is None:
            return np.zeros(self.nbins, bool)
        if self.abs:
            return e[:-1] >= max(-clip[0], clip[1])
        return (e[1:] <= clip[0]) | (e[:-1] >= clip[1])

    def regroup(self, rows: int) -> Histogram:
        """The same histogram in at most ``rows`` bins (exact, as :meth:`from_counts`)."""
        if self.nbins <= rows:
            return self
        return Histogram.from_counts(self.counts, self.lo, self.hi, abs=self.abs, bins=rows)

    def to_dict(self) -> dict[str, Any]:
        return {
            "lo": json_float(self.lo),
            "hi": json_float(self.hi),
            "abs": self.abs,
            "counts": [int(c) for c in self.counts],
            "edges": [float(e) for e in self.edges],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Histogram:
        return cls(
            float(d["lo"]), float(d["hi"]), np.asarray(d["counts"], np.int64), bool(d["abs"])
        )
