"""What a store conversion does: :class:`QuantSpec`, its vocabulary (methods, NaN policies,
scale dtypes, ...) and its validation, with an explicit JSON round trip."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

from ..errors import InvalidParameterError
from ..qtypes import QType, did_you_mean, qtype
from ..rounding import ROUND_MODES
from .json_helpers import NON_FINITE, check_keys, field_values, jsonable_dict

METHODS = ("minmax", "percentile", "entropy", "mse", "l2", "dynamic")
HISTOGRAM_METHODS = ("percentile", "entropy", "mse", "l2")
SCALE_DTYPES = ("float32", "float16", "bfloat16", "source")
# what ``scale_dtype="source"`` becomes for a tensor of each dtype (any other: float32)
SOURCE_SCALE_DTYPES = {"bfloat16": "bfloat16", "float16": "float16"}
SYMMETRIC_LEVELS = ("balanced", "full")
NAN_POLICIES = ("error", "zero_point", "min", "fill")
OFFSET_MODES = ("range",)  # QuantSpec.offset as a word (else a number or a list of them)


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
        return v in NON_FINITE
    return isinstance(v, list | tuple) and depth < 32 and all(_numeric(x, depth + 1) for x in v)


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
        scale_dtype: how scales are stored: ``float32`` (default), ``float16`` or
            ``bfloat16`` (half the size; each scale is rounded to the nearest float16,
            clamped to [2**-24, 65504], or to the nearest bfloat16, clamped to [2**-133,
            3.3895e38], before anything is quantized with it, and zero points are derived
            from the rounded scale, so the stored parameters reproduce the stored values
            exactly), or ``source``: the dtype of each tensor a recipe quantizes (bfloat16
            tensors get bfloat16 scales, float16 ones float16, others float32; resolved per
            tensor by :meth:`for_source`, so that a model loaded in its own dtype gets the
            quantized values bit for bit).
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
                f"unknown method {self.method!r}{did_you_mean(self.method, METHODS)};"
                f" expected one of: {', '.join(METHODS)}"
            )
        if self.round_mode not in ROUND_MODES:
            raise InvalidParameterError(
                f"unknown round_mode {self.round_mode!r}"
                f"{did_you_mean(self.round_mode, ROUND_MODES)};"
                f" expected one of: {', '.join(ROUND_MODES)}"
            )
        if self.nan_policy not in NAN_POLICIES:
            raise InvalidParameterError(
                f"unknown nan_policy {self.nan_policy!r}"
                f"{did_you_mean(self.nan_policy, NAN_POLICIES)};"
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
                f"unknown scale_dtype {self.scale_dtype!r}"
                f"{did_you_mean(self.scale_dtype, SCALE_DTYPES)}; expected one of:"
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
                f"unknown symmetric_levels {self.symmetric_levels!r}"
                f"{did_you_mean(self.symmetric_levels, SYMMETRIC_LEVELS)}; expected one of:"
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

    def _check_offset(self, qt: QType) -> None:
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
    def qtype(self) -> QType:
        return qtype(self.dtype)

    @property
    def granularity(self) -> str:
        if self.axis is None:
            return "per_tensor"
        return "per_axis" if self.block_size is None else "blocked"

    @property
    def half_scales(self) -> bool:
        """Whether scales are float16 values."""
        return self.scale_dtype == "float16"

    @property
    def scale_mode(self) -> int:
        """How scales are rounded before anything is quantized with them: the
        ``qstream.core.SCALE_MODES`` code of :attr:`scale_dtype` (0 float32, 1 float16, 2
        bfloat16); ``source`` must be resolved first (:meth:`for_source`)."""
        from ..core import SCALE_MODES

        if self.scale_dtype == "source":
            raise InvalidParameterError(
                "scale_dtype='source' means each tensor's own dtype: it is resolved per tensor"
                " by a recipe (QuantSpec.for_source); give float32, float16 or bfloat16 here"
            )
        return SCALE_MODES[self.scale_dtype]

    @property
    def scale_numpy_dtype(self) -> np.dtype[Any]:
        """The NumPy dtype scales are stored in (``ml_dtypes.bfloat16`` for bfloat16)."""
        import ml_dtypes

        mode = self.scale_mode  # (refuses an unresolved "source")
        return np.dtype(ml_dtypes.bfloat16 if mode == 2 else self.scale_dtype)

    def for_source(self, dtype: Any) -> QuantSpec:
        """This spec for a tensor of ``dtype``: ``scale_dtype="source"`` becomes that dtype
        (bfloat16 or float16; float32 for any other), any other spec is itself."""
        if self.scale_dtype != "source":
            return self
        name = SOURCE_SCALE_DTYPES.get(np.dtype(dtype).name, "float32")
        # (one object per dtype, kept: callers may key checks on a spec's identity)
        resolved: dict[str, QuantSpec] = self.__dict__.setdefault("_resolved", {})
        if name not in resolved:
            resolved[name] = replace(self, scale_dtype=name)
        return resolved[name]

    @property
    def full_levels(self) -> bool:
        return self.symmetric_levels == "full"

    def to_dict(self) -> dict[str, Any]:
        d = jsonable_dict(field_values(self))
        if d["scale_dtype"] == "float32":  # the default: specs (and job identities) as before
            del d["scale_dtype"]
        if d["symmetric_levels"] == "balanced":
            del d["symmetric_levels"]
        if d["offset"] is None:  # (new field: job identities as before)
            del d["offset"]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> QuantSpec:
        """The spec ``d`` describes; a key that is not a field is an error naming it."""
        check_keys(d, [f.name for f in fields(cls)], "QuantSpec")
        return cls(**d)
