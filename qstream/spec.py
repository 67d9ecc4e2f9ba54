"""Specs and metadata: frozen dataclasses, each with an explicit JSON round-trip.

``QuantSpec`` says what to do; ``QuantParams`` holds the scale/zero point it resolved to;
``RangeStats``/``ErrorStats`` are the mergeable statistics gathered while streaming;
``Calibration`` and ``QuantReport`` are what the store functions return.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from .errors import InvalidParameterError, NonFiniteInputError
from .qtypes import qtype
from .rounding import ROUND_MODES

METHODS = ("minmax", "percentile", "entropy", "mse", "l2", "dynamic")
HISTOGRAM_METHODS = ("percentile", "entropy", "mse", "l2")
SCALE_DTYPES = ("float32", "float16")
SYMMETRIC_LEVELS = ("balanced", "full")
NAN_POLICIES = ("error", "zero_point", "min", "fill")
OFFSET_MODES = ("range",)  # QuantSpec.offset as a word (else a number or a list of them)


_PLAIN = (int, str, bool, type(None))


def jsonable(v: Any) -> Any:
    """``v`` with NumPy arrays and scalars as Python values, tuples as lists and non-finite
    floats as the strings ``"nan"``/``"inf"``/``"-inf"`` (JSON has no NaN/inf literals)."""
    t = type(v)
    if t is float:
        return v if math.isfinite(v) else str(v)
    if t in _PLAIN:
        return v
    if t is dict:
        return {k: jsonable(x) for k, x in v.items()}
    if t is list or t is tuple:
        if all(type(x) in _PLAIN for x in v):  # (a list of plain values: as it is)
            return list(v)
        return [jsonable(x) for x in v]
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, float):
        return float(v) if math.isfinite(v) else str(v)
    if isinstance(v, dict):
        return {k: jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    return v


def _fields(obj) -> dict:
    """A dataclass's fields as a dict, values as they are."""
    return {f.name: getattr(obj, f.name) for f in fields(obj)}


MAX_BINS = 1 << 20  # histogram bins (8 MiB a channel's counts)


def _numeric(v: Any, depth: int = 0) -> bool:
    """Whether ``v`` is a number, a NumPy array of numbers, or nested lists of numbers."""
    if isinstance(v, np.ndarray):
        return v.dtype.kind in "biuf"
    if isinstance(v, bool):
        return False
    if isinstance(v, int | float | np.number):
        return True
    if isinstance(v, str):
        return v in ("nan", "inf", "-inf")
    return isinstance(v, list | tuple) and depth < 32 and all(_numeric(x, depth + 1) for x in v)


def _unjson_float(v: Any) -> Any:
    return float(v) if isinstance(v, str) and v in ("nan", "inf", "-inf") else v


@dataclass(frozen=True)
class QuantSpec:
    """What a store conversion does.

    Args:
        dtype: the quantized type (see ``qstream.QTYPES``).
        axis: None for per-tensor; an axis (negative allowed) for per-axis or blocked.
        block_size: with ``axis``, blocks of this many elements along it share parameters.
        symmetric: zero point 0 (signed types) / mid-range (unsigned) and a range symmetric
            about 0; else an asymmetric min/max range.
        method: how ranges are found: minmax, percentile, entropy, mse, l2, or dynamic (each
            block's own range, needs ``block_size``). Ignored when ``scale`` is given.
        percentile: for ``method="percentile"``, the share of values kept (in percent).
        round_mode: one of ``qstream.ROUND_MODES``.
        narrow_range: drop the type's lowest value (int8 [-127, 127]).
        nan_policy: ``error`` (refuse NaN/inf, naming the first), ``zero_point`` (NaN -> zero
            point), or ``min`` (NaN -> the type's minimum, as ONNX Runtime).
        scale, zero_point: explicit parameters (a number, or a list shaped like the parameter
            array); they skip calibration.
        num_bins: histogram bins for the histogram methods.
        scale_dtype: how scales are stored: ``float32`` (default) or ``float16`` (half the
            size; each scale is rounded to the nearest float16, clamped to [2**-24, 65504],
            before anything is quantized with it, and zero points are derived from the
            rounded scale, so the stored parameters reproduce the stored values exactly).
        symmetric_levels: for symmetric integer types, ``balanced`` (default: as many codes
            each side of zero, ``scale = absmax / 7`` for int4, 15 of its 16 codes) or
            ``full`` (every code: ``scale = absmax / 7.5`` for int4, ``absmax / 127.5`` for
            int8; the largest negative value maps to the type's minimum, the largest positive
            one saturates half a step below its value). ``full`` gains ~0.5 dB of SQNR for
            4-bit types on normal data (see the README); methods minmax, percentile, dynamic.
        offset: a float offset instead of an integer zero point, ``x = q * scale + offset``
            (CF's ``scale_factor``/``add_offset``, zarr's ``scale_offset``), for integer types
            per tensor or per axis: ``"range"`` (calibrated: the range's ends map to the
            type's ends, so for unsigned types the offset is the range's minimum), or a number
            (a list per axis) the user chooses (the scale is then calibrated to cover the
            range from it, or given). The range need not contain 0. Implies an asymmetric
            range; ``zero_point`` stays 0. See :mod:`qstream.core.offsets` for the arithmetic.
        ``nan_policy="fill"`` reserves the type's minimum code for NaN (missing values):
        values take the other codes (it implies ``narrow_range``), the output's ``data``
        carries ``_FillValue`` and qstream's readers give NaN for it.
    """

    dtype: str = "int8"
    axis: int | None = None
    block_size: int | None = None
    symmetric: bool = True
    method: str = "minmax"
    percentile: float = 99.99
    round_mode: str = "half_to_even"
    narrow_range: bool = False
    nan_policy: str = "error"
    scale: Any = None
    zero_point: Any = None
    num_bins: int = 2048
    scale_dtype: str = "float32"
    symmetric_levels: str = "balanced"
    offset: Any = None

    def __post_init__(self) -> None:
        self._check_types()
        qt = qtype(self.dtype)
        object.__setattr__(self, "dtype", qt.name)
        if self.method not in METHODS:
            raise InvalidParameterError(
                f"unknown method {self.method!r}; expected one of: {', '.join(METHODS)}"
            )
        if self.round_mode not in ROUND_MODES:
            raise InvalidParameterError(
                f"unknown round_mode {self.round_mode!r}; expected one of: {', '.join(ROUND_MODES)}"
            )
        if self.nan_policy not in NAN_POLICIES:
            raise InvalidParameterError(
                f"unknown nan_policy {self.nan_policy!r};"
                f" expected one of: {', '.join(NAN_POLICIES)}"
            )
        if not 0 < float(self.percentile) <= 100:
            raise InvalidParameterError(f"percentile must be in (0, 100], got {self.percentile}")
        if self.block_size is not None:
            if self.axis is None:
                raise InvalidParameterError("block_size needs an axis")
            if int(self.block_size) <= 0:
                raise InvalidParameterError(f"block_size must be > 0, got {self.block_size}")
        if self.method == "dynamic" and self.block_size is None and self.scale is None:
            raise InvalidParameterError("method 'dynamic' needs block_size (one range per block)")
        if not 16 <= self.num_bins <= MAX_BINS:
            raise InvalidParameterError(
                f"num_bins must be between 16 and {MAX_BINS}, got {self.num_bins}"
            )
        if qt.is_float and self.method not in ("minmax", "dynamic") and self.scale is None:
            raise InvalidParameterError(f"{qt.name} supports the minmax and dynamic methods only")
        for name in ("scale", "zero_point"):
            v = getattr(self, name)
            if isinstance(v, np.ndarray | np.generic):
                object.__setattr__(self, name, v.tolist())
        if self.zero_point is not None and self.scale is None:
            raise InvalidParameterError("zero_point is given without scale")
        if self.scale_dtype not in SCALE_DTYPES:
            raise InvalidParameterError(
                f"unknown scale_dtype {self.scale_dtype!r}; expected one of:"
                f" {', '.join(SCALE_DTYPES)}"
            )

        if qt.is_float and not self.symmetric:
            raise InvalidParameterError(
                f"{qt.name} has no zero point: its range is symmetric; drop symmetric=False"
            )
        if self.scale is not None and self.method in ("percentile", "entropy", "mse", "l2"):
            raise InvalidParameterError(
                f"an explicit scale skips calibration: method {self.method!r} would not be"
                " used; give either scale or a calibration method"
            )
        self._check_offset(qt)
        if self.symmetric_levels not in SYMMETRIC_LEVELS:
            raise InvalidParameterError(
                f"unknown symmetric_levels {self.symmetric_levels!r}; expected one of:"
                f" {', '.join(SYMMETRIC_LEVELS)}"
            )
        if self.full_levels:
            why = (
                "a float type"
                if qt.is_float
                else "an asymmetric range"
                if not self.symmetric
                else "narrow_range"
                if self.narrow_range
                else f"method {self.method!r}"
                if self.method not in ("minmax", "percentile", "dynamic") and self.scale is None
                else None
            )
            if why:
                raise InvalidParameterError(
                    f"symmetric_levels='full' does not apply to {why}: it spreads a symmetric"
                    " integer range over every code (methods minmax, percentile, dynamic)"
                )

    def _check_offset(self, qt) -> None:
        """Float offsets and the ``fill`` NaN policy: what they imply, what they refuse."""
        if self.nan_policy == "fill":
            if qt.is_float:
                raise InvalidParameterError(
                    f"nan_policy='fill' reserves an integer code for NaN; {qt.name} is a float type"
                )
            object.__setattr__(self, "narrow_range", True)
        v = self.offset
        if v is None:
            return
        if isinstance(v, np.ndarray | np.generic):
            v = v.tolist()
            object.__setattr__(self, "offset", v)
        if isinstance(v, str) and v not in OFFSET_MODES:
            raise InvalidParameterError(
                f"offset must be {' or '.join(map(repr, OFFSET_MODES))}, a number or a list of"
                f" numbers, got {v!r}"
            )
        if not isinstance(v, str) and not _numeric(v):
            raise InvalidParameterError(f"offset must be 'range' or a number, got {v!r}")
        if not isinstance(v, str) and not np.all(np.isfinite(np.asarray(v, np.float64))):
            raise InvalidParameterError("offset must be finite")
        why = (
            f"{qt.name} (a float type)"
            if qt.is_float
            else "a blocked spec (block_size)"
            if self.block_size is not None
            else "an explicit zero_point"
            if self.zero_point is not None
            else "symmetric_levels='full'"
            if self.symmetric_levels != "balanced"
            else f"method {self.method!r} (offsets calibrate with minmax or percentile)"
            if self.method not in ("minmax", "percentile") and self.scale is None
            else f"{qt.name} (more than 16 bits)"
            if qt.bits > 16
            else None
        )
        if why:
            raise InvalidParameterError(
                f"offset does not apply to {why}: float offsets are for integer types of at most"
                " 16 bits, per tensor or per axis"
            )
        if isinstance(v, str) and self.scale is not None:
            raise InvalidParameterError(
                "offset='range' is calibrated; with an explicit scale give the offset as a number"
            )
        object.__setattr__(self, "symmetric", False)

    @property
    def float_offset(self) -> bool:
        """Whether values are ``q * scale + offset`` (a float offset, no zero point)."""
        return self.offset is not None

    def _check_types(self) -> None:
        """Refuse fields of the wrong type (from a recipe or JSON) with a message naming the
        field; whole numbers given as integral floats (``32.0``) are taken as integers."""

        def whole(name: str, optional: bool) -> None:
            v = getattr(self, name)
            if v is None and optional:
                return
            if isinstance(v, float) and v.is_integer():
                object.__setattr__(self, name, int(v))
            elif isinstance(v, bool) or not isinstance(v, int | np.integer):
                raise InvalidParameterError(f"{name} must be an integer, got {v!r}")
            else:
                object.__setattr__(self, name, int(v))

        for name in (
            "dtype",
            "method",
            "round_mode",
            "nan_policy",
            "scale_dtype",
            "symmetric_levels",
        ):
            if not isinstance(getattr(self, name), str):
                raise InvalidParameterError(f"{name} must be a string, got {getattr(self, name)!r}")
        for name in ("symmetric", "narrow_range"):
            if not isinstance(getattr(self, name), bool | np.bool_):
                raise InvalidParameterError(
                    f"{name} must be true or false, got {getattr(self, name)!r}"
                )
        whole("axis", True)
        whole("block_size", True)
        whole("num_bins", False)
        if isinstance(self.percentile, bool) or not isinstance(
            self.percentile, int | float | np.number
        ):
            raise InvalidParameterError(f"percentile must be a number, got {self.percentile!r}")
        for name in ("scale", "zero_point"):
            v = getattr(self, name)
            if v is not None and not _numeric(v):
                raise InvalidParameterError(f"{name} must be a number or a list of numbers")

    @property
    def qtype(self):
        return qtype(self.dtype)

    @property
    def granularity(self) -> str:
        if self.axis is None:
            return "per_tensor"
        return "per_axis" if self.block_size is None else "blocked"

    @property
    def half_scales(self) -> bool:
        return self.scale_dtype == "float16"

    @property
    def full_levels(self) -> bool:
        return self.symmetric_levels == "full"

    def to_dict(self) -> dict:
        d = jsonable(_fields(self))
        if d["scale_dtype"] == "float32":  # the default: specs (and job identities) as before
            del d["scale_dtype"]
        if d["symmetric_levels"] == "balanced":
            del d["symmetric_levels"]
        if d["offset"] is None:  # (new field: job identities as before)
            del d["offset"]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> QuantSpec:
        """The spec ``d`` describes; a key that is not a field is an error naming it."""
        check_keys(d, [f.name for f in fields(cls)], "QuantSpec")
        return cls(**d)


def check_keys(d: dict, valid, what: str) -> None:
    """Refuse keys of ``d`` outside ``valid``, naming them, a close match, and the valid ones."""
    import difflib

    unknown = [k for k in d if k not in valid]
    if not unknown:
        return
    k = unknown[0]
    close = difflib.get_close_matches(str(k), list(valid), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise InvalidParameterError(f"unknown {what} key {k!r}{hint}; valid keys: {', '.join(valid)}")


_MERGE_MIN = ("min",)
_MERGE_MAX = ("max", "max_abs")


def merge_into(total, part, offset: int = 0) -> None:
    """Merge the statistics ``part`` of channels ``offset ..`` into ``total``, in place.

    min/max fields take the minimum/maximum, every other array field is summed (exact for the
    integer counts, order-fixed for the float sums).
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

    def refusal(self, name: str, shape) -> NonFiniteInputError:
        """The error that refuses these non-finite values (the ``error`` NaN policy), naming
        how many of each kind and the first one's index in an array of ``shape``."""
        at = "?"
        if self.first_nonfinite >= 0:
            at = str(tuple(int(i) for i in np.unravel_index(self.first_nonfinite, shape)))
        return NonFiniteInputError(
            f"{name}: {self.nonfinite} non-finite values ({int(self.nan.sum())} NaN,"
            f" {int(self.posinf.sum())} +inf, {int(self.neginf.sum())} -inf); first at index"
            f" {at}. Use nan_policy='zero_point' or nan_policy='min' to quantize them anyway"
        )

    @classmethod
    def empty(cls, channels: int) -> RangeStats:
        z = np.zeros(channels, np.int64)
        return cls(
            np.full(channels, np.inf), np.full(channels, -np.inf), z, z.copy(), z.copy(), z.copy()
        )

    def to_dict(self) -> dict:
        d = {f.name: jsonable(getattr(self, f.name)) for f in fields(self)}
        return d

    @classmethod
    def from_dict(cls, d: dict) -> RangeStats:
        arr = {
            k: np.asarray(
                [_unjson_float(v) for v in d[k]],
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
        return self.nan + self.posinf + self.neginf

    @classmethod
    def empty(cls, channels: int) -> ErrorStats:
        return cls(
            **{
                f.name: np.zeros(channels, np.int64 if f.name in cls.INTS else np.float64)
                for f in fields(cls)
            }
        )

    def summary(self, worst: int = 5) -> dict:
        """SQNR (dB), MSE, max abs error, cosine similarity, clip fraction, non-finite counts
        (``nonfinite`` = ``nan`` + ``posinf`` + ``neginf``); per channel, when there is more
        than one, the ``worst`` channels by SQNR and the channels holding the most non-finite
        values (``nonfinite_channels``, when there are any)."""
        tot = {
            k: getattr(self, k).sum()
            for k in ("count", "sum_x2", "sum_e2", "sum_xy", "sum_y2", "clipped")
        }
        out = _metrics(tot["count"], tot["sum_x2"], tot["sum_e2"], tot["sum_xy"], tot["sum_y2"])
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
            from .calibration.views import channel_sqnr

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
        return jsonable(out)

    def _counts(self, c: int) -> dict:
        return {
            "channel": c,
            "nonfinite": int(self.nonfinite[c]),
            "nan": int(self.nan[c]),
            "posinf": int(self.posinf[c]),
            "neginf": int(self.neginf[c]),
        }

    def channel_summary(self):
        """The per-channel SQNR as a bounded :class:`~qstream.calibration.views.ChannelSummary`
        (quantiles, a histogram over the channels, the worst channels with their clip
        fraction and max error)."""
        from .calibration.views import ChannelSummary, channel_sqnr

        clip = np.where(self.count > 0, self.clipped / np.maximum(self.count, 1), 0.0)
        return ChannelSummary.from_sqnr(
            channel_sqnr(self.sum_x2, self.sum_e2), clip_fraction=clip, max_abs=self.max_abs
        )

    def to_dict(self) -> dict:
        return {f.name: jsonable(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: dict) -> ErrorStats:
        return cls(
            **{
                f.name: np.asarray(d[f.name], np.int64 if f.name in cls.INTS else np.float64)
                for f in fields(cls)
            }
        )


class GroupSQNR:
    """How the SQNR of every parameter group of a blocked spec is distributed: exact integer
    counts over fixed bins of :data:`STEP_DB` dB from :data:`LO_DB` to :data:`HI_DB`, plus the
    groups below and above that range, the groups without error (infinite SQNR: ``exact``)
    and the groups without signal (all zeros or non-finite: ``zero_signal``).

    The bins are fixed and a group's bin depends on its own sums only, so merging (adding)
    the counts of any partition of the blocks in any order gives the same counts. ``counts``
    holds :data:`SLOTS` int64: ``[below, bin 0, ..., bin BINS - 1, above, exact, zero]``.
    """

    LO_DB = -20.0
    STEP_DB = 0.25
    BINS = 640
    HI_DB = LO_DB + STEP_DB * BINS  # 140 dB
    SLOTS = BINS + 4
    _BELOW, _ABOVE, _EXACT, _ZERO = 0, BINS + 1, BINS + 2, BINS + 3

    __slots__ = ("counts",)

    def __init__(self, counts) -> None:
        counts = np.asarray(counts, np.int64)
        if counts.shape != (self.SLOTS,):
            raise ValueError(f"GroupSQNR counts: {self.SLOTS} values, got {counts.shape}")
        self.counts = counts

    def __eq__(self, other) -> bool:
        if not isinstance(other, GroupSQNR):
            return NotImplemented
        return bool(np.array_equal(self.counts, other.counts))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"GroupSQNR({self.groups} groups)"

    @classmethod
    def empty(cls) -> GroupSQNR:
        return cls(np.zeros(cls.SLOTS, np.int64))

    @classmethod
    def of_sums(cls, x2, e2) -> GroupSQNR:
        """The distribution of the groups whose signal and error sums are ``x2``/``e2`` (one
        value per group, any shape). A few vectorised passes over the groups (not the
        elements): the bin is ``floor((10 log10(x2 / e2) - LO_DB) / STEP_DB)``."""
        x2 = np.asarray(x2, np.float64).reshape(-1)
        e2 = np.asarray(e2, np.float64).reshape(-1)
        with np.errstate(divide="ignore", invalid="ignore"):
            b = np.divide(x2, e2)  # inf: no error; 0: no signal (-inf dB); NaN: neither
            np.log10(b, out=b)
        # (slot 1 + bin): below the range -> 0, above it (and inf) -> BINS + 1; NaN -> 0
        b *= 10.0 / cls.STEP_DB
        b += 1.0 - cls.LO_DB / cls.STEP_DB
        np.fmax(b, 0.0, out=b)
        np.fmin(b, cls.BINS + 1.0, out=b)
        counts = np.zeros(cls.SLOTS, np.int64)
        counts[: cls.BINS + 2] = np.bincount(b.astype(np.int64), minlength=cls.BINS + 2)
        # groups without signal are in slot 0 (NaN or -inf dB), without error (and with
        # signal) in slot BINS + 1 (inf): counted only when those slots hold any
        zero = np.count_nonzero(x2 == 0) if counts[cls._BELOW] else 0
        no_error = np.count_nonzero(e2 == 0) if counts[cls._ABOVE] else 0
        exact = no_error - (np.count_nonzero((x2 == 0) & (e2 == 0)) if zero and no_error else 0)
        counts[cls._BELOW] -= zero
        counts[cls._ABOVE] -= exact
        counts[cls._EXACT] = exact
        counts[cls._ZERO] = zero
        return cls(counts)

    def merged(self, other: GroupSQNR) -> GroupSQNR:
        return GroupSQNR(self.counts + other.counts)

    @property
    def groups(self) -> int:
        return int(self.counts.sum())

    @property
    def bins(self) -> np.ndarray:
        """The counts of the :data:`BINS` bins."""
        return self.counts[1 : self.BINS + 1]

    def summary(self) -> dict:
        """JSON-ready: the occupied span of the bins (``edges_db``, one more than ``counts``;
        empty when no group has a finite SQNR in range) and the other counts."""
        bins = self.bins
        used = np.flatnonzero(bins)
        if used.size:
            first, last = int(used[0]), int(used[-1]) + 1
        else:
            first = last = 0
        edges = [self.LO_DB + self.STEP_DB * k for k in range(first, last + 1)] if used.size else []
        c = self.counts
        return {
            "groups": self.groups,
            "step_db": self.STEP_DB,
            "edges_db": edges,
            "counts": [int(v) for v in bins[first:last]],
            "below": int(c[self._BELOW]),
            "above": int(c[self._ABOVE]),
            "exact": int(c[self._EXACT]),
            "zero_signal": int(c[self._ZERO]),
            "range_db": [self.LO_DB, self.HI_DB],
        }

    @classmethod
    def from_summary(cls, d: dict) -> GroupSQNR:
        """The counts :meth:`summary` describes (its bins on this grid)."""
        counts = np.zeros(cls.SLOTS, np.int64)
        edges, bins = d.get("edges_db") or [], d.get("counts") or []
        if bins:
            first = round((float(edges[0]) - cls.LO_DB) / cls.STEP_DB)
            if not 0 <= first <= cls.BINS - len(bins) or float(d["step_db"]) != cls.STEP_DB:
                raise InvalidParameterError("group SQNR bins on another grid")
            counts[1 + first : 1 + first + len(bins)] = bins
        counts[cls._BELOW], counts[cls._ABOVE] = int(d["below"]), int(d["above"])
        counts[cls._EXACT], counts[cls._ZERO] = int(d["exact"]), int(d["zero_signal"])
        return cls(counts)


@dataclass(frozen=True)
class WorstGroups:
    """The parameter groups of a blocked spec with the lowest SQNR, worst first (ties: lower
    group first), so merging any partition of the blocks in any order gives the same list.
    ``index`` is the flat index of the group in the (blocked) parameter array.

    ``groups``: every group's SQNR as a :class:`GroupSQNR` distribution (merged by adding
    counts); None where it was not taken (a resume snapshot of an older run): a merge with
    None is None, never a partial count."""

    sqnr_db: np.ndarray
    index: np.ndarray
    max_abs: np.ndarray
    groups: GroupSQNR | None = None

    KEEP = 5

    @classmethod
    def empty(cls, distribution: bool = True) -> WorstGroups:
        """No group yet (and an empty distribution, unless ``distribution`` is false)."""
        return cls(
            np.zeros(0),
            np.zeros(0, np.int64),
            np.zeros(0),
            GroupSQNR.empty() if distribution else None,
        )

    @classmethod
    def of(cls, sqnr_db, index, max_abs, groups: GroupSQNR | None = None) -> WorstGroups:
        """The ``KEEP`` worst of the given groups."""
        sqnr_db, index = np.asarray(sqnr_db, np.float64), np.asarray(index, np.int64)
        order = np.lexsort((index, sqnr_db))[: cls.KEEP]
        return cls(sqnr_db[order], index[order], np.asarray(max_abs, np.float64)[order], groups)

    def merged(self, other: WorstGroups) -> WorstGroups:
        groups = None
        if self.groups is not None and other.groups is not None:
            groups = self.groups.merged(other.groups)
        return WorstGroups.of(
            np.concatenate([self.sqnr_db, other.sqnr_db]),
            np.concatenate([self.index, other.index]),
            np.concatenate([self.max_abs, other.max_abs]),
            groups,
        )

    def summary(self, param_shape, axis: int, block_size: int) -> list[dict]:
        """One entry per group: its index in the parameter array, its first element, SQNR."""
        out = []
        for sq, i, m in zip(self.sqnr_db, self.index, self.max_abs, strict=True):
            at = [int(v) for v in np.unravel_index(int(i), tuple(param_shape))]
            first = [v * block_size if d == axis else v for d, v in enumerate(at)]
            out.append({"group": at, "first_element": first, "sqnr_db": sq, "max_abs": m})
        return jsonable(out)

    def to_dict(self) -> dict:
        d = {f: jsonable(getattr(self, f)) for f in ("sqnr_db", "index", "max_abs")}
        if self.groups is not None:
            d["groups"] = self.groups.summary()
        return d

    @classmethod
    def from_dict(cls, d: dict) -> WorstGroups:
        return cls(
            np.asarray([_unjson_float(v) for v in d["sqnr_db"]], np.float64),
            np.asarray(d["index"], np.int64),
            np.asarray(d["max_abs"], np.float64),
            GroupSQNR.from_summary(d["groups"]) if d.get("groups") else None,
        )


def _metrics(n, sx2, se2, sxy, sy2) -> dict:
    n = int(n)
    mse = float(se2 / n) if n else 0.0
    if se2 == 0:
        sqnr = math.inf
    elif sx2 == 0:
        sqnr = -math.inf
    else:
        sqnr = 10.0 * math.log10(sx2 / se2)
    denom = math.sqrt(sx2 * sy2)
    cosine = float(sxy / denom) if denom > 0 else (1.0 if sx2 == sy2 == 0 else 0.0)
    return {"sqnr_db": sqnr, "mse": mse, "cosine": cosine, "count": n}


@dataclass(frozen=True)
class QuantParams:
    """Resolved parameters: ``scale``/``zero_point`` shaped for ``qstream.quantize``."""

    scale: np.ndarray
    zero_point: np.ndarray
    axis: int | None
    block_size: int | None
    offset: np.ndarray | None = None  # float offsets (float64), shaped like ``scale``

    def to_dict(self) -> dict:
        d = {
            "scale": jsonable(self.scale),
            "zero_point": jsonable(self.zero_point),
            "axis": self.axis,
            "block_size": self.block_size,
        }
        if self.offset is not None:
            d["offset"] = jsonable(self.offset)
        return d


@dataclass(frozen=True)
class Calibration:
    """Statistics gathered from a source and the parameters they give under a spec."""

    spec: QuantSpec
    stats: RangeStats | None
    thresholds: dict = field(default_factory=dict)  # method detail: chosen lo/hi per channel
    params: QuantParams | None = None
    view: Any = None  # CalibrationView (qstream.calibration.views): what the views draw

    @property
    def scale(self) -> np.ndarray:
        return self.params.scale

    @property
    def zero_point(self) -> np.ndarray:
        return self.params.zero_point

    def to_dict(self, *, with_params: bool = True) -> dict:
        d = {
            "spec": self.spec.to_dict(),
            "stats": self.stats.to_dict() if self.stats is not None else None,
            "thresholds": jsonable(self.thresholds),
        }
        if with_params and self.params is not None:
            d["params"] = self.params.to_dict()
        if self.view is not None:
            d["view"] = self.view.to_dict()
        return d

    def summary(self, limit: int = 16) -> dict:
        """``to_dict`` without parameters, per-channel arrays longer than ``limit`` reduced to
        ``{"size", "min", "max"}`` (for metadata: the per-channel results are the stored
        scale / zero point arrays)."""

        def shrink(v):
            if not (isinstance(v, np.ndarray) and v.ndim == 1 and v.size > limit):
                return v
            finite = v[np.isfinite(v)] if v.dtype.kind == "f" else v
            return {
                "size": int(v.size),
                "min": finite.min() if finite.size else None,
                "max": finite.max() if finite.size else None,
            }

        stats = None
        if self.stats is not None:
            stats = {f.name: shrink(getattr(self.stats, f.name)) for f in fields(self.stats)}
        out = {
            "spec": self.spec.to_dict(),
            "stats": stats,
            "thresholds": {k: shrink(v) for k, v in self.thresholds.items()},
        }
        if self.view is not None:  # bounded: see qstream.calibration.views
            out["view"] = self.view.to_dict()
        return jsonable(out)

    @classmethod
    def from_dict(cls, d: dict) -> Calibration:
        spec = QuantSpec.from_dict(d["spec"])
        params = None
        if d.get("params"):
            p = d["params"]
            params = QuantParams(
                np.asarray(p["scale"], np.float32),
                np.asarray(p["zero_point"], np.float64),
                p["axis"],
                p["block_size"],
                np.asarray(p["offset"], np.float64) if p.get("offset") is not None else None,
            )
        stats = RangeStats.from_dict(d["stats"]) if d.get("stats") else None
        view = None
        if d.get("view"):
            from .calibration.views import CalibrationView

            view = CalibrationView.from_dict(d["view"])
        return cls(spec, stats, d.get("thresholds", {}), params, view)

    # ---- views (qstream.viz): a table and an inline SVG in notebooks; matplotlib on demand

    def _repr_html_(self) -> str:
        from .calibration.views import ReportView
        from .viz.html import view_html

        return view_html(ReportView.from_calibration(self))

    def plot(self, ax=None):
        """Draw the histogram with the chosen (and compared) thresholds on ``ax`` (a new
        figure when None) with matplotlib (``pip install 'qstream-zarr[plot]'``); returns the
        axes."""
        from .calibration.views import ReportView
        from .viz.mpl import plot_view

        return plot_view(ReportView.from_calibration(self), ax=ax)


@dataclass(frozen=True)
class QuantReport:
    """What a store conversion did: spec, source, calibration, error and cost."""

    spec: QuantSpec
    source: dict
    destination: str
    calibration: dict | None
    error: dict | None
    passes: int
    seconds: float
    bytes_read: int
    bytes_written: int
    resumed_blocks: int = 0  # blocks an interrupted run had finished
    missing_chunks: int = 0  # source chunks never written: read as the fill value
    already_complete: bool = False  # the output was complete: nothing was done

    def to_dict(self) -> dict:
        # (calibration and error are JSON-ready summaries already: not walked again)
        d = _fields(self)
        d["spec"] = self.spec.to_dict()
        return {k: v if k in ("calibration", "error") else jsonable(v) for k, v in d.items()}

    @classmethod
    def from_dict(cls, d: dict) -> QuantReport:
        d = dict(d)
        check_keys(d, [f.name for f in fields(cls)], "QuantReport")
        d["spec"] = QuantSpec.from_dict(d["spec"])
        return cls(**d)

    # ---- views (qstream.viz): a table and an inline SVG in notebooks; matplotlib on demand

    def _repr_html_(self) -> str:
        from .calibration.views import ReportView
        from .viz.html import view_html

        return view_html(ReportView.from_report(self))

    def plot(self, ax=None):
        """Draw the calibration histogram with its thresholds (per tensor) or the per-channel
        SQNR distribution (per channel) on ``ax`` (a new figure when None) with matplotlib
        (``pip install 'qstream-zarr[plot]'``); returns the axes."""
        from .calibration.views import ReportView
        from .viz.mpl import plot_view

        return plot_view(ReportView.from_report(self), ax=ax)
