"""What the calibration views draw, in bounded size: histograms, per-channel summaries, and
each method's error predicted from one histogram.

Everything here is data (frozen dataclasses with a JSON round-trip), no drawing: the SVG and
HTML views are in :mod:`qstream.viz`, the terminal views in the CLI.

- :class:`Histogram`: a fixed-edge histogram with exact integer counts. The 2048-bin
  calibration histograms are kept as :data:`VIEW_BINS` bins by summing adjacent bins, so the
  counts stay exact; when the bins do not divide evenly the top edge is extended (the extra
  bins are empty).
- :class:`ChannelSummary`: a per-channel quantity (SQNR in dB) as quantiles, a histogram over
  the channels, and the worst channels; never one entry per channel.
- :class:`MethodPrediction`: a method's range, parameters and *predicted* SQNR and clip
  fraction (:func:`predict_error`).
- :class:`CalibrationView`: what a calibration keeps for its views (``Calibration.view``,
  stored in an output's ``attrs["qstream"]["calibration"]["view"]``).
- :class:`ReportView`: a calibration view with the error report of a quantize pass (assembled
  from an output's metadata or a report; not stored).
- :class:`GroupSummary`: a group-wise (blocked) output's per-group SQNR distribution and its
  worst groups (from ``error["groups"]`` and ``error["worst_groups"]``).
- :class:`CheckpointView`: a converted checkpoint in bounded size, whatever its number of
  tensors: the SQNR over its quantized tensors (quantiles, a histogram, the worst ones), its
  bytes before and after (totals, per target, the largest tensors, a histogram of sizes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

VIEW_BINS = 128  # bins of a stored histogram (at most)
SQNR_BINS = 24  # bins of a histogram over channels
WORST = 5  # worst channels listed
QUANTILES = (("min", 0.0), ("p05", 5.0), ("p25", 25.0), ("median", 50.0), ("p75", 75.0))
QUANTILES += (("p95", 95.0), ("max", 100.0))


def _float(v) -> float | None:
    """A JSON-ready float (non-finite as the library's "inf"/"nan" strings)."""
    if v is None:
        return None
    v = float(v)
    return v if math.isfinite(v) else str(v)  # type: ignore[return-value]


def _unfloat(v) -> float | None:
    if v is None:
        return None
    return float(v)  # float("inf") / float("nan") read the strings back


def quantiles(values) -> dict[str, float] | None:
    """``min, p05, p25, median, p75, p95, max`` of the finite ``values`` (None if none)."""
    v = np.asarray(values, np.float64).reshape(-1)
    v = v[np.isfinite(v)]
    if not v.size:
        return None
    q = np.percentile(v, [p for _, p in QUANTILES])
    return {name: float(x) for (name, _), x in zip(QUANTILES, q, strict=True)}


# --------------------------------------------------------------------------- histograms


@dataclass(frozen=True, eq=False)
class Histogram:
    """Counts over ``nbins`` equal bins from ``lo`` to ``hi``; ``abs``: counts of ``|x|``."""

    lo: float
    hi: float
    counts: np.ndarray  # int64
    abs: bool = False

    def __eq__(self, other) -> bool:
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
        return (e[:-1] + e[1:]) / 2

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    @classmethod
    def from_counts(cls, counts, lo, hi, *, abs: bool = False, bins: int = VIEW_BINS):
        """The histogram ``counts`` over ``[lo, hi]`` in at most ``bins`` bins: groups of
        ``ceil(n / bins)`` adjacent bins summed (exact); a short last group extends the top
        edge by the missing (empty) bins, so every bin has the same width."""
        counts = np.asarray(counts, np.int64).reshape(-1)
        n = counts.size
        f = max(1, -(-n // bins))
        m = -(-n // f)
        padded = np.zeros(m * f, np.int64)
        padded[:n] = counts
        lo, hi = float(lo), float(hi)
        top = hi if m * f == n else lo + (hi - lo) * (m * f) / n
        return cls(lo, top, padded.reshape(m, f).sum(axis=1), bool(abs))

    @classmethod
    def of_values(cls, values, bins: int = SQNR_BINS) -> Histogram | None:
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

    def to_dict(self) -> dict:
        return {
            "lo": _float(self.lo),
            "hi": _float(self.hi),
            "abs": self.abs,
            "counts": [int(c) for c in self.counts],
            "edges": [float(e) for e in self.edges],
        }

    @classmethod
    def from_dict(cls, d: dict) -> Histogram:
        return cls(
            float(d["lo"]), float(d["hi"]), np.asarray(d["counts"], np.int64), bool(d["abs"])
        )


# --------------------------------------------------------------------------- channels


@dataclass(frozen=True)
class ChannelSummary:
    """Per-channel SQNR (dB) in bounded size: quantiles and a histogram of the finite values,
    how many channels are exact (no error: infinite SQNR), and the worst channels."""

    channels: int
    quantiles: dict | None
    histogram: Histogram | None
    exact: int = 0
    worst: tuple = ()  # dicts: channel, sqnr_db, and clip_fraction / max_abs when known

    @classmethod
    def from_sqnr(cls, sqnr, *, clip_fraction=None, max_abs=None, worst: int = WORST):
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

    def to_dict(self) -> dict:
        return {
            "channels": self.channels,
            "quantiles": self.quantiles,
            "histogram": None if self.histogram is None else self.histogram.to_dict(),
            "exact": self.exact,
            "worst": [
                {k: _float(v) if k != "channel" else v for k, v in w.items()} for w in self.worst
            ],
        }

    @classmethod
    def from_dict(cls, d: dict) -> ChannelSummary:
        return cls(
            channels=int(d["channels"]),
            quantiles=d.get("quantiles"),
            histogram=Histogram.from_dict(d["histogram"]) if d.get("histogram") else None,
            exact=int(d.get("exact", 0)),
            worst=tuple(
                {k: (int(v) if k == "channel" else _unfloat(v)) for k, v in w.items()}
                for w in d.get("worst", ())
            ),
        )


def channel_sqnr(sum_x2, sum_e2) -> np.ndarray:
    """Per-channel SQNR in dB from error sums: inf where there is no error, -inf where the
    signal is 0 and the error is not."""
    sx2 = np.asarray(sum_x2, np.float64)
    se2 = np.asarray(sum_e2, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = 10.0 * np.log10(sx2 / se2)
    out = np.where(se2 == 0, np.inf, out)
    return np.where((se2 > 0) & (sx2 == 0), -np.inf, out)


def total_sqnr(sum_x2, sum_e2) -> float:
    sx2, se2 = float(np.sum(sum_x2)), float(np.sum(sum_e2))
    if se2 == 0:
        return math.inf
    return -math.inf if sx2 == 0 else 10.0 * math.log10(sx2 / se2)


def clip_ratio(lo, hi, data_lo, data_hi, *, symmetric: bool) -> np.ndarray:
    """Per channel, how much of the observed range a calibration keeps: symmetric ranges
    ``max(-lo, hi) / max(-min, max)``; asymmetric ``(hi - lo) / (max - min)``; 1 means nothing
    is clipped (and for an all-zero channel)."""
    lo, hi = np.asarray(lo, np.float64), np.asarray(hi, np.float64)
    dlo, dhi = np.asarray(data_lo, np.float64), np.asarray(data_hi, np.float64)
    if symmetric:
        kept, seen = np.maximum(-lo, hi), np.maximum(-dlo, dhi)
    else:
        kept, seen = hi - lo, dhi - dlo
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(seen > 0, kept / seen, 1.0)
    return np.minimum(r, 1.0)


def clip_summary(ratio, worst: int = WORST) -> dict:
    """Quantiles of per-channel clip ratios and the channels that keep the least."""
    ratio = np.asarray(ratio, np.float64).reshape(-1)
    order = np.argsort(ratio, kind="stable")[:worst]
    return {
        "quantiles": quantiles(ratio),
        "lowest": [{"channel": int(c), "ratio": float(ratio[c])} for c in order],
    }


# --------------------------------------------------------------------------- prediction


def _sawtooth_integral(x, s):
    """``∫ e(t)^2 dt`` from a fixed origin to ``x`` for the rounding error ``e(t) = t -
    s * round(t / s)`` (an antiderivative: differences give the integral between points)."""
    k = np.floor(x / s + 0.5)
    r = x - k * s
    return k * (s**3 / 12.0) + (r**3 + s**3 / 8.0) / 3.0


def predict_error(
    counts, lo, hi, scale, zero_point, qmin: float, qmax: float, *, chunk=None, nonzero=None
):
    """The error of quantizing the values of the signed histograms ``counts[C, nbins]`` (bins
    over ``[lo[c], hi[c]]``) with ``scale[c]``/``zero_point[c]``, predicted from the
    histogram: values are taken as spread evenly over their bin, and each bin contributes its
    count times the mean squared error over the bin (the rounding sawtooth inside the range
    ``[(qmin - z) s, (qmax - z) s]``, the clipping error outside it; integrated exactly).

    Returns ``(sum_x2, sum_e2, clipped)`` per channel (float64; ``clipped`` is the expected
    number of values beyond the range by more than half a step). A prediction: it ignores
    where values sit inside a bin (a spike at 0, say), so it differs from the measured error
    most when the bins are wide against the step.

    Only bins that hold values are evaluated and summed, in bin order (a histogram of
    millions of channels is mostly empty bins). ``nonzero``: ``np.nonzero(counts)``, when
    the caller predicts several parameter sets from one histogram.
    """
    counts = np.asarray(counts)
    n_c, nb = counts.shape
    if nonzero is None:
        nonzero = np.nonzero(counts)
    all_rows, all_bins = nonzero
    # each chunk's entries: rows are in order, so a chunk is one run of them
    chunk = chunk or max(64, (1 << 20) // max(1, nb))
    edges_of = np.searchsorted(all_rows, np.arange(0, n_c + chunk, chunk))
    lo, hi = np.broadcast_to(lo, (n_c,)), np.broadcast_to(hi, (n_c,))
    s_all = np.broadcast_to(np.asarray(scale, np.float64), (n_c,))
    z_all = np.broadcast_to(np.asarray(zero_point, np.float64), (n_c,))
    sx2, se2, clipped = np.zeros(n_c), np.zeros(n_c), np.zeros(n_c)
    t = np.arange(nb + 1, dtype=np.float64) / nb
    for i, c0 in enumerate(range(0, n_c, chunk)):
        c = slice(c0, min(n_c, c0 + chunk))
        run = slice(edges_of[i], edges_of[i + 1])
        at, bins = all_rows[run], all_bins[run]
        rows = at - c0
        lo_c, hi_c = lo[at].astype(np.float64), hi[at].astype(np.float64)
        a = lo_c + (hi_c - lo_c) * t[bins]  # the bin's edges
        b = lo_c + (hi_c - lo_c) * t[bins + 1]
        w = b - a
        s = s_all[at]
        top = (qmax - z_all[at]) * s
        bot = (qmin - z_all[at]) * s
        # in range: the sawtooth over [a, b] ∩ [bot, top]
        ia, ib = np.clip(a, bot, top), np.clip(b, bot, top)
        inside = _sawtooth_integral(ib, s) - _sawtooth_integral(ia, s)
        # above and below: (x - top)^2 and (x - bot)^2
        ua, ub = np.maximum(a, top) - top, np.maximum(b, top) - top
        da, db = bot - np.minimum(a, bot), bot - np.minimum(b, bot)
        outside = (ub**3 - ua**3) / 3.0 + (da**3 - db**3) / 3.0
        with np.errstate(divide="ignore", invalid="ignore"):
            mean_e2 = np.where(w > 0, (inside + outside) / w, 0.0)
            # at a zero-width bin every value is at ``a``
            point = np.where(a > top, (a - top) ** 2, np.where(a < bot, (bot - a) ** 2, 0.0))
            mean_e2 = np.where(w > 0, mean_e2, point)
            mean_x2 = (a * a + a * b + b * b) / 3.0
            hi_sat, lo_sat = top + s / 2, bot - s / 2
            over = np.where(
                w > 0, (np.clip(b, hi_sat, None) - np.clip(a, hi_sat, None)) / w, a > hi_sat
            )
            under = np.where(
                w > 0, (np.clip(b, None, lo_sat) - np.clip(a, None, lo_sat)) / w, a < lo_sat
            )
        n = c.stop - c0
        k = counts[at, bins].astype(np.float64)
        sx2[c] = np.bincount(rows, k * mean_x2, n)
        se2[c] = np.bincount(rows, k * np.maximum(mean_e2, 0.0), n)
        clipped[c] = np.bincount(rows, k * (over + under), n)
    return sx2, se2, clipped


@dataclass(frozen=True)
class MethodPrediction:
    """One calibration method on the shared histogram: its range and parameters (per tensor;
    None per channel, where ``clip_ratio`` summarises them), and the SQNR and clip fraction
    :func:`predict_error` predicts (per tensor, and per channel as a summary)."""

    method: str
    sqnr_db: float
    clip_fraction: float
    lo: float | None = None
    hi: float | None = None
    scale: float | None = None
    zero_point: float | None = None
    clip_ratio: dict | None = None
    channels: ChannelSummary | None = None

    def to_dict(self) -> dict:
        return {
            "method": self.method,
            "predicted_sqnr_db": _float(self.sqnr_db),
            "predicted_clip_fraction": float(self.clip_fraction),
            "lo": _float(self.lo),
            "hi": _float(self.hi),
            "scale": _float(self.scale),
            "zero_point": _float(self.zero_point),
            "clip_ratio": self.clip_ratio,
            "channels": None if self.channels is None else self.channels.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: dict) -> MethodPrediction:
        return cls(
            method=d["method"],
            sqnr_db=_unfloat(d["predicted_sqnr_db"]),
            clip_fraction=float(d["predicted_clip_fraction"]),
            lo=_unfloat(d.get("lo")),
            hi=_unfloat(d.get("hi")),
            scale=_unfloat(d.get("scale")),
            zero_point=_unfloat(d.get("zero_point")),
            clip_ratio=d.get("clip_ratio"),
            channels=ChannelSummary.from_dict(d["channels"]) if d.get("channels") else None,
        )


# --------------------------------------------------------------------------- calibration


@dataclass(frozen=True)
class CalibrationView:
    """What a calibration keeps for its views, in bounded size.

    Per tensor: the observed range, the chosen clip range and (when a histogram was made) the
    histogram in at most :data:`VIEW_BINS` bins, of ``|x|`` for symmetric searches, of ``x``
    otherwise. Per channel: no histograms, the clip ratios' summary (:func:`clip_summary`).
    ``predictions``: every compared method (:func:`qstream.compare_methods`), else empty.
    """

    method: str
    channels: int
    data_range: tuple[float, float]
    clip: tuple[float, float] | None = None
    histogram: Histogram | None = None
    clip_ratio: dict | None = None
    predictions: tuple[MethodPrediction, ...] = field(default_factory=tuple)

    @property
    def best(self) -> str | None:
        """The compared method with the highest predicted SQNR (None without predictions)."""
        if not self.predictions:
            return None
        return max(
            self.predictions, key=lambda p: -math.inf if p.sqnr_db != p.sqnr_db else p.sqnr_db
        ).method

    def prediction(self, method: str) -> MethodPrediction | None:
        return next((p for p in self.predictions if p.method == method), None)

    def markers(self) -> list[tuple[str, float]]:
        """``(label, x)`` of every threshold to mark on the histogram: the chosen clip range
        (``lo`` and ``hi``; ``max(-lo, hi)`` on a ``|x|`` histogram) and every compared
        method's, sorted by position."""
        out: list[tuple[str, float]] = []
        ranges = [(p.method, p.lo, p.hi) for p in self.predictions if p.lo is not None]
        if not ranges and self.clip is not None:
            ranges = [(self.method, *self.clip)]
        for name, lo, hi in ranges:
            if self.histogram is not None and self.histogram.abs:
                out.append((name, max(-lo, hi)))
            else:
                out.extend([(name, lo), (name, hi)])
        return sorted(out, key=lambda m: m[1])

    def to_dict(self) -> dict:
        return {
            "method": self.method,
            "channels": self.channels,
            "data_range": [_float(v) for v in self.data_range],
            "clip": None if self.clip is None else [_float(v) for v in self.clip],
            "histogram": None if self.histogram is None else self.histogram.to_dict(),
            "clip_ratio": self.clip_ratio,
            "predictions": [p.to_dict() for p in self.predictions],
        }

    @classmethod
    def from_dict(cls, d: dict) -> CalibrationView:
        return cls(
            method=d["method"],
            channels=int(d["channels"]),
            data_range=tuple(_unfloat(v) for v in d["data_range"]),
            clip=None if d.get("clip") is None else tuple(_unfloat(v) for v in d["clip"]),
            histogram=Histogram.from_dict(d["histogram"]) if d.get("histogram") else None,
            clip_ratio=d.get("clip_ratio"),
            predictions=tuple(MethodPrediction.from_dict(p) for p in d.get("predictions", ())),
        )


def calibration_view(spec, stats, lo, hi, histogram: Histogram | None = None, predictions=()):
    """The :class:`CalibrationView` of a calibration under ``spec`` (per tensor or per axis)
    with observed statistics ``stats`` and chosen per-channel ranges ``lo``/``hi``."""
    has = stats.count > 0
    dmin = np.where(has, stats.min, 0.0)
    dmax = np.where(has, stats.max, 0.0)
    data_range = (float(dmin.min()), float(dmax.max())) if dmin.size else (0.0, 0.0)
    lo, hi = np.asarray(lo, np.float64).reshape(-1), np.asarray(hi, np.float64).reshape(-1)
    if lo.size == 1:
        return CalibrationView(
            spec.method, 1, data_range, (float(lo[0]), float(hi[0])), histogram, None,
            tuple(predictions),
        )  # fmt: skip
    ratio = clip_ratio(lo, hi, dmin, dmax, symmetric=spec.symmetric)
    return CalibrationView(
        spec.method, int(lo.size), data_range, None, None, clip_summary(ratio), tuple(predictions)
    )


# --------------------------------------------------------------------------- reports


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
    worst: tuple = ()  # dicts: group, first_element, sqnr_db, max_abs (worst first)

    @classmethod
    def from_error(cls, error: dict | None) -> GroupSummary | None:
        """The summary of an error report; None when it has neither the distribution nor
        worst groups (not a blocked integer output)."""
        error = error or {}
        d, worst = error.get("groups"), error.get("worst_groups")
        if not d and worst is None:
            return None
        rows = tuple(
            {
                **w,
                "sqnr_db": _unfloat(w.get("sqnr_db")),
                "max_abs": _unfloat(w.get("max_abs")),
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
    def quantiles(self) -> dict | None:
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
        out = []
        q = self.quantiles or {}
        h = self.histogram
        if q.get("median") is not None:
            out.append(("median", q["median"]))
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


@dataclass(frozen=True)
class ReportView:
    """A quantized output as its views see it: the spec, the calibration view, the error
    summary, the per-channel SQNR summary and, for group-wise outputs, the per-group SQNR
    summary (from a report or an output's metadata)."""

    title: str
    spec: dict
    calibration: CalibrationView | None
    error: dict | None
    channels: ChannelSummary | None
    groups: GroupSummary | None = None

    @classmethod
    def from_parts(cls, title: str, spec: dict, calibration: dict | None, error: dict | None):
        view = (calibration or {}).get("view")
        chans = (error or {}).get("channels")
        return cls(
            title,
            spec,
            CalibrationView.from_dict(view) if view else None,
            error,
            ChannelSummary.from_dict(chans) if chans else None,
            GroupSummary.from_error(error),
        )

    @classmethod
    def from_report(cls, report) -> ReportView:
        title = report.destination or str(report.source.get("path", "array"))
        return cls.from_parts(title, report.spec.to_dict(), report.calibration, report.error)

    @classmethod
    def from_meta(cls, meta: dict, title: str = "array") -> ReportView:
        return cls.from_parts(
            title, meta.get("spec") or {}, meta.get("calibration"), meta.get("error")
        )

    @classmethod
    def from_calibration(cls, cal, title: str = "calibration") -> ReportView:
        return cls(title, cal.spec.to_dict(), cal.view, None, None)


# --------------------------------------------------------------------------- checkpoints

WORST_TENSORS = 10  # worst tensors listed
LARGEST_TENSORS = 10  # largest tensors listed
TARGETS = 8  # targets listed by bytes (the rest summed as "other")
SIZE_BINS = 24  # bins of the histogram of tensor sizes


def _sqnr_of(row: dict) -> float | None:
    """A checkpoint row's SQNR (dB) as a float; None when it has none."""
    v = (row.get("error") or {}).get("sqnr_db")
    if v is None:
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _tensor_row(row: dict, sqnr: float | None) -> dict:
    return {
        "name": str(row.get("name")),
        "target": "kept" if row.get("kept") else str(row.get("target")),
        "shape": list(row.get("shape") or []),
        "bytes_before": int(row.get("bytes_before") or 0),
        "bytes_after": int(row.get("bytes_after") or 0),
        "sqnr_db": sqnr,
    }


@dataclass(frozen=True)
class CheckpointView:
    """A converted checkpoint as its views see it, in bounded size whatever its number of
    tensors (from the root's index rows, no tensor opened).

    ``sqnr``: the SQNR over the quantized tensors that have one (a :class:`ChannelSummary`
    whose "channels" are tensors: quantiles, a histogram, the exact ones); ``worst``: the
    :data:`WORST_TENSORS` lowest; ``largest``: the :data:`LARGEST_TENSORS` largest tensors;
    ``targets``: bytes per target (``int4/axis1/block32``, ``kept``, ...; the
    :data:`TARGETS` largest, the rest as ``other``); ``sizes_before``/``sizes_after``:
    histograms of ``log10(bytes)`` over the tensors, on the same bins."""

    title: str
    tensors: int
    quantized: int
    kept: int
    bytes_before: int
    bytes_after: int
    sqnr: ChannelSummary | None = None
    worst: tuple = ()
    largest: tuple = ()
    targets: tuple = ()
    sizes_before: Histogram | None = None
    sizes_after: Histogram | None = None

    @classmethod
    def from_rows(cls, rows, title: str = "checkpoint") -> CheckpointView:
        """The view of a checkpoint's index rows (``QuantizedCheckpoint.tensors.values()``)."""
        rows = list(rows)
        n = len(rows)
        kept = np.fromiter((bool(r.get("kept")) for r in rows), bool, n)
        before = np.fromiter((int(r.get("bytes_before") or 0) for r in rows), np.int64, n)
        after = np.fromiter((int(r.get("bytes_after") or 0) for r in rows), np.int64, n)
        sq = [None if k else _sqnr_of(r) for r, k in zip(rows, kept, strict=True)]
        has = np.fromiter((v is not None for v in sq), bool, n)
        sqnr = np.fromiter((v for v in sq if v is not None), np.float64)
        summary = ChannelSummary.from_sqnr(sqnr, worst=0) if sqnr.size else None
        at = np.flatnonzero(has)
        key = np.where(np.isnan(sqnr), -np.inf, sqnr)
        worst = at[np.argsort(key, kind="stable")[:WORST_TENSORS]]
        largest = np.argsort(-before, kind="stable")[:LARGEST_TENSORS]
        targets: dict[str, list[int]] = {}
        for r, k, b, a in zip(rows, kept, before.tolist(), after.tolist(), strict=True):
            t = targets.setdefault("kept" if k else str(r.get("target")), [0, 0, 0])
            t[0] += 1
            t[1] += b
            t[2] += a
        order = sorted(targets.items(), key=lambda kv: (-kv[1][1], kv[0]))
        listed = [
            {"target": name, "tensors": c, "bytes_before": b, "bytes_after": a}
            for name, (c, b, a) in order[:TARGETS]
        ]
        rest = order[TARGETS:]
        if rest:
            listed.append(
                {
                    "target": f"other ({len(rest)} targets)",
                    "tensors": sum(v[0] for _, v in rest),
                    "bytes_before": sum(v[1] for _, v in rest),
                    "bytes_after": sum(v[2] for _, v in rest),
                }
            )
        hb, ha = _size_histograms(before, after)
        return cls(
            title=title,
            tensors=n,
            quantized=int(n - kept.sum()),
            kept=int(kept.sum()),
            bytes_before=int(before.sum()),
            bytes_after=int(after.sum()),
            sqnr=summary,
            worst=tuple(_tensor_row(rows[i], sq[i]) for i in worst),
            largest=tuple(_tensor_row(rows[i], sq[i]) for i in largest),
            targets=tuple(listed),
            sizes_before=hb,
            sizes_after=ha,
        )

    @property
    def ratio(self) -> float | None:
        """Bytes after / bytes before (None for an empty checkpoint)."""
        return self.bytes_after / self.bytes_before if self.bytes_before else None

    def markers(self) -> list[tuple[str, float]]:
        """``(label, dB)`` on the SQNR histogram: the worst tensor and the median one."""
        q = (self.sqnr.quantiles if self.sqnr is not None else None) or {}
        marks = [("worst", q.get("min")), ("median", q.get("median"))]
        return [(k, v) for k, v in marks if v is not None and math.isfinite(v)]

    def to_dict(self) -> dict:
        def rows(rs):
            return [{k: _float(v) if k == "sqnr_db" else v for k, v in r.items()} for r in rs]

        return {
            "title": self.title,
            "tensors": self.tensors,
            "quantized": self.quantized,
            "kept": self.kept,
            "bytes_before": self.bytes_before,
            "bytes_after": self.bytes_after,
            "sqnr": None if self.sqnr is None else self.sqnr.to_dict(),
            "worst": rows(self.worst),
            "largest": rows(self.largest),
            "targets": list(self.targets),
            "sizes_before": None if self.sizes_before is None else self.sizes_before.to_dict(),
            "sizes_after": None if self.sizes_after is None else self.sizes_after.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: dict) -> CheckpointView:
        def rows(rs):
            return tuple(
                {k: _unfloat(v) if k == "sqnr_db" else v for k, v in r.items()} for r in rs
            )

        def hist(h):
            return Histogram.from_dict(h) if h else None

        return cls(
            title=d["title"],
            tensors=int(d["tensors"]),
            quantized=int(d["quantized"]),
            kept=int(d["kept"]),
            bytes_before=int(d["bytes_before"]),
            bytes_after=int(d["bytes_after"]),
            sqnr=ChannelSummary.from_dict(d["sqnr"]) if d.get("sqnr") else None,
            worst=rows(d.get("worst", ())),
            largest=rows(d.get("largest", ())),
            targets=tuple(d.get("targets", ())),
            sizes_before=hist(d.get("sizes_before")),
            sizes_after=hist(d.get("sizes_after")),
        )


def _size_histograms(before, after) -> tuple[Histogram | None, Histogram | None]:
    """Histograms of ``log10(bytes)`` of the tensors before and after, on the same bins
    (whole powers of ten at the ends; tensors of 0 bytes are left out)."""
    b = np.asarray(before, np.float64)
    a = np.asarray(after, np.float64)
    lb, la = np.log10(b[b > 0]), np.log10(a[a > 0])
    both = np.concatenate([lb, la])
    if not both.size:
        return None, None
    lo, hi = math.floor(both.min()), math.ceil(both.max())
    if hi <= lo:
        hi = lo + 1
    cb, _ = np.histogram(lb, bins=SIZE_BINS, range=(lo, hi))
    ca, _ = np.histogram(la, bins=SIZE_BINS, range=(lo, hi))
    return (
        Histogram(float(lo), float(hi), cb.astype(np.int64)),
        Histogram(float(lo), float(hi), ca.astype(np.int64)),
    )
