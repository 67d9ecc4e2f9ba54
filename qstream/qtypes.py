"""The quantized element types: names, ranges and how they sit in memory.

Integer types are written by the kernels into an unsigned container of the same width
(``uint8`` for int8/uint8/int4/uint4/int2/uint2, ``uint16`` for the 16-bit types, ``uint32``
for int32) and then viewed as the user-facing dtype. Sub-byte types hold one element per byte,
masked to their width, exactly as ``ml_dtypes`` stores them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import ml_dtypes
import numpy as np
import numpy.typing as npt

from .errors import InvalidDTypeError

TINY_SCALE = np.float32(2.0**-149)  # the smallest positive float32: no derived scale is below


@dataclass(frozen=True)
class QType:
    """One quantized element type."""

    name: str
    kind: str  # "int" or "float"
    bits: int
    qmin: float
    qmax: float
    dtype: np.dtype  # what users see (NumPy or ml_dtypes)

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def signed(self) -> bool:
        return self.qmin < 0

    @property
    def container(self) -> np.dtype:
        """The unsigned integer dtype kernels write (same itemsize as ``dtype``)."""
        return np.dtype(f"uint{8 * self.dtype.itemsize}")

    @property
    def mask(self) -> int:
        """Bits kept in the container: ``2**bits - 1`` (``-1``, all bits, for 32-bit types)."""
        return -1 if self.bits >= 32 else (1 << self.bits) - 1

    def qrange(self, narrow_range: bool = False) -> tuple[float, float]:
        """The values produced: ``[qmin, qmax]``, or ``[qmin + 1, qmax]`` for an integer type
        with ``narrow_range`` (int8 [-127, 127])."""
        return (self.qmin + (1 if narrow_range and not self.is_float else 0), self.qmax)

    @property
    def widened(self) -> np.dtype:
        """A plain NumPy dtype that holds every value of this type exactly."""
        if self.is_float:
            return np.dtype(np.float32)
        if self.bits <= 8:
            return np.dtype(np.int8 if self.signed else np.uint8)
        return self.dtype


def _int(name: str, bits: int, signed: bool, dtype: npt.DTypeLike) -> QType:
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    return QType(name, "int", bits, lo, hi, np.dtype(dtype))


def _float(name: str, dtype: npt.DTypeLike) -> QType:
    info = ml_dtypes.finfo(dtype)
    return QType(name, "float", info.bits, float(info.min), float(info.max), np.dtype(dtype))


QTYPES: dict[str, QType] = {
    t.name: t
    for t in (
        _int("int8", 8, True, np.int8),
        _int("uint8", 8, False, np.uint8),
        _int("int16", 16, True, np.int16),
        _int("uint16", 16, False, np.uint16),
        _int("int32", 32, True, np.int32),
        _int("int4", 4, True, ml_dtypes.int4),
        _int("uint4", 4, False, ml_dtypes.uint4),
        _int("int2", 2, True, ml_dtypes.int2),
        _int("uint2", 2, False, ml_dtypes.uint2),
        _float("float8_e4m3fn", ml_dtypes.float8_e4m3fn),
        _float("float8_e4m3fnuz", ml_dtypes.float8_e4m3fnuz),
        _float("float8_e5m2", ml_dtypes.float8_e5m2),
        _float("float8_e5m2fnuz", ml_dtypes.float8_e5m2fnuz),
        _float("float4_e2m1fn", ml_dtypes.float4_e2m1fn),
    )
}
_BY_DTYPE = {t.dtype: t for t in QTYPES.values()}

# Floating dtypes accepted as quantizer input / dequantizer output.
FLOAT_DTYPES: dict[str, np.dtype] = {
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float32": np.dtype(np.float32),
    "float64": np.dtype(np.float64),
}


def qtype(spec: QType | npt.DTypeLike) -> QType:
    """Resolve a quantized type from a name (``"int8"``), a dtype, or a :class:`QType`."""
    if isinstance(spec, QType):
        return spec
    if isinstance(spec, str):
        found = QTYPES.get(spec.lower())
    else:
        found = _BY_DTYPE.get(np.dtype(spec)) if _is_dtype(spec) else None
    if found is None:
        raise InvalidDTypeError(
            f"unknown quantized type {spec!r}{did_you_mean(spec, QTYPES)}; expected one of:"
            f" {', '.join(QTYPES)}"
        )
    return found


def did_you_mean(given: object, names: Iterable[str]) -> str:
    """``" (did you mean 'int8'?)"`` for a misspelt ``given`` close to one of ``names``
    (``in8``, ``unit8``, ``float8``...), else ``""``."""
    import difflib

    if not isinstance(given, str):
        return ""
    by_lower = {str(n).lower(): n for n in names}  # (case aside: q4_k_m finds Q4_K_M)
    near = difflib.get_close_matches(given.lower(), list(by_lower), n=1, cutoff=0.6)
    if not near:
        return ""
    return f" (did you mean {by_lower[near[0]]!r}?)"


def is_qtype_dtype(dtype: npt.DTypeLike) -> bool:
    """Whether ``dtype`` is the dtype of a quantized type (int8, int4, float8_e4m3fn, ...)."""
    return _is_dtype(dtype) and np.dtype(dtype) in _BY_DTYPE


def float_dtype(spec: npt.DTypeLike) -> np.dtype:
    """Resolve a floating dtype (float16, bfloat16, float32, float64) from a name or dtype."""
    try:
        dt = np.dtype(spec if not isinstance(spec, str) else FLOAT_DTYPES.get(spec.lower(), spec))
    except TypeError:
        dt = None
    if dt is None or dt not in FLOAT_DTYPES.values():
        raise InvalidDTypeError(
            f"unsupported floating dtype {spec!r}{did_you_mean(spec, FLOAT_DTYPES)};"
            f" expected one of: {', '.join(FLOAT_DTYPES)}"
        )
    return dt


def is_float_dtype(dtype: npt.DTypeLike) -> bool:
    """Whether ``dtype`` is one of the floating dtypes (float16, bfloat16, float32, float64)."""
    if type(dtype) in _FLOAT_DTYPE_TYPES:  # (a dtype object: asked per tensor, kept quick)
        return dtype in _FLOAT_DTYPE_SET
    return _is_dtype(dtype) and np.dtype(dtype) in FLOAT_DTYPES.values()


_FLOAT_DTYPE_SET = frozenset(FLOAT_DTYPES.values())
_FLOAT_DTYPE_TYPES = frozenset(type(d) for d in FLOAT_DTYPES.values())


def _is_dtype(obj: npt.DTypeLike) -> bool:
    try:
        np.dtype(obj)
    except TypeError:
        return False
    return True
