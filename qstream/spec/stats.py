"""The mergeable statistics gathered while streaming: the observed ranges
(:class:`RangeStats`) and the quantization error (:class:`ErrorStats`), merged block by block
with :func:`merge_into` (exact for the counts, in a fixed order for the float sums)."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from ..errors import NonFiniteInputError
from .json_helpers import jsonable, jsonable_dict, unjson_float
from .views import ChannelSummary, channel_sqnr


@dataclass(frozen=True)
class RangeStats:
    """Exact, mergeable per-channel statistics (one entry per parameter slot; [1] per tensor).

    NaN and infinities are counted, not included in min/max/absmax.
    """

    min: np.ndarray
    max: np.ndarray
    count: np.ndarray  # finite values
    nan: np.ndarray
    posinf: np.ndarray
    neginf: np.ndarray
    first_nonfinite: int = -1  # flat index of the first NaN/inf seen, -1 if none

    @property
    def nonfinite(self) -> int:
        return int(self.nan.sum() + self.posinf.sum() + self.neginf.sum())

    def refusal(self, name: str, shape: tuple[int, ...]) -> NonFiniteInputError:
        """The error that refuses these non-finite values (the ``error`` NaN policy), naming
        how many of each kind and the first one's index in an array of ``shape``."""
        at = "?"
        if self.first_nonfinite >= 0:
            at = str(tuple(int(i) for i in np.unravel_index(self.first_nonfinite, shape)))
        return NonFiniteInputError(
            f"{name}: {self.nonfinite} non-finite value{'' if self.nonfinite == 1 else 's'}"
            f" ({int(self.nan.sum())} NaN,"
            f" {int(self.posinf.sum())} +inf, {int(self.neginf.sum())} -inf); first at index"
            f" {at}. Use nan_policy='zero_point' or nan_policy='min' to quantize them anyway"
        )

    @classmethod
    def empty(cls, channels: int) -> RangeStats:
        z = np.zeros(channels, np.int64)
        return cls(
            np.full(channels, np.inf), np.full(channels, -np.inf), z, z.copy(), z.copy(), z.copy()
        )

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: jsonable(getattr(self, f.name)) for f in fields(self)}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RangeStats:
        arr = {
            k: np.asarray(
                [unjson_float(v) for v in d[k]],
                dtype=np.float64 if k in ("min", "max") else np.int64,
            )
            for k in ("min", "max", "count", "nan", "posinf", "neginf")
        }
        return cls(**arr, first_nonfinite=int(d.get("first_nonfinite", -1)))


@dataclass(frozen=True)
class ErrorStats:
    """Quantization error, accumulated exactly enough to merge across blocks (float64 sums).

    All arrays have one entry per channel (one for per-tensor).
    """

    count: np.ndarray
    sum_x2: np.ndarray  # sum of x^2
    sum_e2: np.ndarray  # sum of (x - x_hat)^2
    sum_xy: np.ndarray  # sum of x * x_hat
    sum_y2: np.ndarray  # sum of x_hat^2
    max_abs: np.ndarray  # max |x - x_hat|
    clipped: np.ndarray  # values that saturated
    nan: np.ndarray  # NaN inputs (not in the sums)
    posinf: np.ndarray  # +inf inputs
    neginf: np.ndarray  # -inf inputs

    INTS = ("count", "clipped", "nan", "posinf", "neginf")

    @property
    def nonfinite(self) -> np.ndarray:
        """NaN and infinite inputs per channel."""
        total: np.ndarray = self.nan + self.posinf + self.neginf
        return total

    @classmethod
    def empty(cls, channels: int) -> ErrorStats:
        return cls(
            **{
                f.name: np.zeros(channels, np.int64 if f.name in cls.INTS else np.float64)
                for f in fields(cls)
            }
        )

    def summary(self, worst: int = 5) -> dict[str, Any]:
        """SQNR (dB), MSE, max abs error, cosine similarity, clip fraction, non-finite counts
        (``nonfinite`` = ``nan`` + ``posinf`` + ``neginf``); per channel, when there is more
        than one, the ``worst`` channels by SQNR and the channels holding the most non-finite
        values (``nonfinite_channels``, when there are any)."""
        tot = {
            k: getattr(self, k).sum()
            for k in ("count", "sum_x2", "sum_e2", "sum_xy", "sum_y2", "clipped")
        }
        out = error_metrics(
            tot["count"], tot["sum_x2"], tot["sum_e2"], tot["sum_xy"], tot["sum_y2"]
        )
        out["max_abs"] = float(self.max_abs.max()) if self.max_abs.size else 0.0
        out["clipped"] = int(tot["clipped"])
        out["clip_fraction"] = float(tot["clipped"] / tot["count"]) if tot["count"] else 0.0
        out["nonfinite"] = int(self.nonfinite.sum())
        for k in ("nan", "posinf", "neginf"):
            out[k] = int(getattr(self, k).sum())
        if self.count.size > 1:
            bad = self.nonfinite
            if bad.any():
                top = np.argsort(-bad, kind="stable")[: min(worst, int((bad > 0).sum()))]
                out["nonfinite_channels"] = [self._counts(int(c)) for c in top]
            sq = channel_sqnr(self.sum_x2, self.sum_e2)  # (the channel summary's, below)
            order = np.argsort(sq, kind="stable")[:worst]
            out["worst_channels"] = [
                {
                    "channel": int(c),
                    "sqnr_db": float(sq[c]),
                    "max_abs": float(self.max_abs[c]),
                    **self._counts(int(c)),
                }
                for c in order
            ]
            out["channels"] = self.channel_summary().to_dict()
        return jsonable_dict(out)

    def _counts(self, c: int) -> dict[str, int]:
        return {
            "channel": c,
            "nonfinite": int(self.nonfinite[c]),
            "nan": int(self.nan[c]),
            "posinf": int(self.posinf[c]),
            "neginf": int(self.neginf[c]),
        }

    def channel_summary(self) -> ChannelSummary:
        """The per-channel SQNR as a bounded :class:`~qstream.spec.views.ChannelSummary`
        (quantiles, a histogram over the channels, the worst channels with their clip
        fraction and max error)."""
        clip = np.where(self.count > 0, self.clipped / np.maximum(self.count, 1), 0.0)
        return ChannelSummary.from_sqnr(
            channel_sqnr(self.sum_x2, self.sum_e2), clip_fraction=clip, max_abs=self.max_abs
        )

    def to_dict(self) -> dict[str, Any]:
        return {f.name: jsonable(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ErrorStats:
        return cls(
            **{
                f.name: np.asarray(d[f.name], np.int64 if f.name in cls.INTS else np.float64)
                for f in fields(cls)
            }
        )


_MERGE_MIN = ("min",)
_MERGE_MAX = ("max", "max_abs")


def merge_into(
    total: RangeStats | ErrorStats, part: RangeStats | ErrorStats, offset: int = 0
) -> None:
    """Merge the statistics ``part`` of channels ``offset ..`` into ``total``, in place.

    min/max fields take the minimum/maximum, every other array field is summed (exact for the
    integer counts, order-fixed for the float sums). ``total`` and ``part`` are of one kind.
    """
    n = part.count.size
    sl = slice(offset, offset + n)
    for f in fields(part):
        value = getattr(part, f.name)
        if not isinstance(value, np.ndarray):
            continue
        target = getattr(total, f.name)[sl]
        if f.name in _MERGE_MIN:
            np.minimum(target, value, out=target)
        elif f.name in _MERGE_MAX:
            np.maximum(target, value, out=target)
        else:
            target += value


class MergedStats:
    """The statistics of ``channels`` channels merged from parts in order, as
    :func:`merge_into` merges them into ``kind.empty(channels)``. A first part that covers
    every channel (the one block of a small job, the one piece of a block) is kept as it is
    instead: the same values (its float sums' -0.0 made +0.0, as adding it to zeros makes
    it) without the empties and the merge; a later part merges into a copy, never into it.
    A kept part's arrays are the caller's to give away (fresh from a kernel)."""

    def __init__(self, kind: type[RangeStats] | type[ErrorStats], channels: int) -> None:
        self.kind, self.channels = kind, channels
        self._total: Any = None
        self._owned = False  # the total is ours (made from empties), not a kept part

    def add(self, part: RangeStats | ErrorStats, offset: int = 0) -> None:
        """Merge ``part``, the statistics of channels ``offset ..``."""
        if self._total is None and offset == 0 and _whole(part, self.kind, self.channels):
            self._total = _zero_sums(part)
            return
        if not self._owned:
            total = self.kind.empty(self.channels)
            if self._total is not None:
                merge_into(total, self._total)
            self._total, self._owned = total, True
        merge_into(self._total, part, offset)

    @property
    def total(self) -> Any:
        """What was merged (empty statistics when nothing was)."""
        if self._total is None:
            self._total, self._owned = self.kind.empty(self.channels), True
        return self._total


def _whole(part: RangeStats | ErrorStats, kind: type, channels: int) -> bool:
    """Whether ``part`` can stand for the merged statistics of ``channels`` channels: of the
    kind, every array one entry per channel, of the type the empties have."""
    if type(part) is not kind:
        return False
    ints = ErrorStats.INTS if kind is ErrorStats else ("count", "nan", "posinf", "neginf")
    for f in fields(part):
        v = getattr(part, f.name)
        if not isinstance(v, np.ndarray):
            continue
        want = np.int64 if f.name in ints else np.float64
        if v.dtype != want or v.shape != (channels,):
            return False
    return True


def _zero_sums(part: Any) -> Any:
    """``part`` with its summed float fields' -0.0 made +0.0, in place: what adding them to
    zeros gives (min, max and the integer counts come out of a merge as they went in)."""
    if isinstance(part, ErrorStats):
        for name in ("sum_x2", "sum_e2", "sum_xy", "sum_y2"):
            np.add(getattr(part, name), 0.0, out=getattr(part, name))
        np.maximum(0.0, part.max_abs, out=part.max_abs)  # (as merged into zeros)
    return part


def error_metrics(
    n: int | np.integer[Any],
    sx2: float | np.floating[Any],
    se2: float | np.floating[Any],
    sxy: float | np.floating[Any],
    sy2: float | np.floating[Any],
) -> dict[str, Any]:
    """SQNR (dB), MSE and cosine similarity of ``n`` values from their sums: of ``x^2``
    (``sx2``), of the error's square (``se2``), of ``x * x_hat`` (``sxy``), of ``x_hat^2``
    (``sy2``)."""
    n = int(n)
    sx2, se2, sxy, sy2 = float(sx2), float(se2), float(sxy), float(sy2)  # (inf / inf: NaN)
    mse = se2 / n if n else 0.0
    if se2 == 0:
        sqnr = math.inf
    elif sx2 == 0:
        sqnr = -math.inf
    else:  # (an error sum that overflowed, x_hat beyond the float range: -inf dB, as NumPy)
        ratio = sx2 / se2
        sqnr = 10.0 * math.log10(ratio) if ratio > 0 else -math.inf if ratio == 0 else math.nan
    denom = math.sqrt(sx2 * sy2)
    cosine = sxy / denom if denom > 0 else (1.0 if sx2 == sy2 == 0 else 0.0)
    return {"sqnr_db": sqnr, "mse": mse, "cosine": cosine, "count": n}
