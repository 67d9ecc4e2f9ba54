"""Each calibration method's error predicted from one histogram: :func:`predict_error` and a
method's range, parameters and predicted SQNR (:class:`MethodPrediction`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from .histograms import json_float, read_float
from .summaries import ChannelSummary


def _sawtooth_integral(x: np.ndarray, s: np.ndarray) -> np.ndarray:
    """``∫ e(t)^2 dt`` from a fixed origin to ``x`` for the rounding error ``e(t) = t -
    s * round(t / s)`` (an antiderivative: differences give the integral between points)."""
    k = np.floor(x / s + 0.5)
    r = x - k * s
    return np.asarray(k * (s**3 / 12.0) + (r**3 + s**3 / 8.0) / 3.0)


def predict_error(
    counts: npt.ArrayLike,
    lo: npt.ArrayLike,
    hi: npt.ArrayLike,
    scale: npt.ArrayLike,
    zero_point: npt.ArrayLike,
    qmin: float,
    qmax: float,
    *,
    chunk: int | None = None,
    nonzero: tuple[np.ndarray, ...] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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
    clip_ratio: dict[str, Any] | None = None
    channels: ChannelSummary | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "predicted_sqnr_db": json_float(self.sqnr_db),
            "predicted_clip_fraction": float(self.clip_fraction),
            "lo": json_float(self.lo),
            "hi": json_float(self.hi),
            "scale": json_float(self.scale),
            "zero_point": json_float(self.zero_point),
            "clip_ratio": self.clip_ratio,
            "channels": None if self.channels is None else self.channels.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MethodPrediction:
        return cls(
            method=d["method"],
            sqnr_db=float(d["predicted_sqnr_db"]),
            clip_fraction=float(d["predicted_clip_fraction"]),
            lo=read_float(d.get("lo")),
            hi=read_float(d.get("hi")),
            scale=read_float(d.get("scale")),
            zero_point=read_float(d.get("zero_point")),
            clip_ratio=d.get("clip_ratio"),
            channels=ChannelSummary.from_dict(d["channels"]) if d.get("channels") else None,
        )
