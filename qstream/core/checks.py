"""Argument checks shared by the public array functions and the compatibility profiles:
each rejects a bad value with an error that names it."""

from __future__ import annotations

import numpy as np

from ..errors import InvalidDTypeError, InvalidParameterError
from ..qtypes import QType, is_float_dtype, is_qtype_dtype, qtype

F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)


def check_scale(scale: np.ndarray) -> None:
    """Reject a zero, negative, NaN or infinite scale, naming the first bad value."""
    s = np.asarray(scale, dtype=F64)
    bad = ~(np.isfinite(s) & (s > 0))
    if bad.any():
        idx = np.unravel_index(int(np.argmax(bad)), s.shape) if s.ndim else ()
        what = (
            "NaN"
            if np.isnan(s[idx])
            else "infinite"
            if np.isinf(s[idx])
            else ("zero" if s[idx] == 0 else "negative")
        )
        where = f" at index {tuple(int(i) for i in idx)}" if s.ndim else ""
        raise InvalidParameterError(
            f"scale must be finite and > 0, got {what} value {float(s[idx])!r}{where}"
            f" ({int(bad.sum())} bad of {s.size})"
        )


def as_float_input(x, name: str) -> np.ndarray:
    x = np.asarray(x)
    if not is_float_dtype(x.dtype):
        raise InvalidDTypeError(
            f"{name} must be a floating array (float16, bfloat16, float32, float64), got {x.dtype}"
        )
    return x


def as_scale(scale) -> np.ndarray:
    if isinstance(scale, (np.ndarray, np.generic)):
        s = np.asarray(scale)
        if not is_float_dtype(s.dtype):
            if s.dtype.kind in "iub":
                s = s.astype(F32)
            else:
                raise InvalidDTypeError(f"scale must be a floating array, got {s.dtype}")
        return s
    try:
        return np.asarray(scale, dtype=F32)
    except (TypeError, ValueError) as e:
        raise InvalidDTypeError(f"scale must be a number or a float array: {e}") from None


def resolve_output_type(dtype, zero_point) -> QType:
    """``dtype`` if given (the zero point's values are range-checked later), else the zero
    point's dtype when it is an array of a quantized type, else uint8 (as ONNX)."""
    if dtype is not None:
        return qtype(dtype)
    if isinstance(zero_point, (np.ndarray, np.generic)) and is_qtype_dtype(zero_point.dtype):
        return qtype(zero_point.dtype)
    return qtype("uint8")


def as_zero_point(zero_point, qt: QType, scale_shape) -> np.ndarray | None:
    if zero_point is None:
        return None
    z = np.asarray(zero_point)
    if z.dtype.kind not in "iuf" and not is_qtype_dtype(z.dtype):
        raise InvalidDTypeError(f"zero_point must be numeric, got {z.dtype}")
    zf = z.astype(F64)
    if not np.all(np.isfinite(zf)) or not np.all(zf == np.round(zf)):
        raise InvalidParameterError("zero_point must hold integer values")
    if qt.is_float:
        if np.any(zf != 0):
            raise InvalidParameterError(f"zero_point must be 0 for {qt.name} outputs")
    elif zf.size and (zf.min() < qt.qmin or zf.max() > qt.qmax):
        bad = zf[(zf < qt.qmin) | (zf > qt.qmax)].flat[0]
        raise InvalidParameterError(
            f"zero_point {bad:g} is outside the {qt.name} range [{qt.qmin:g}, {qt.qmax:g}]"
        )
    if z.size != 1 and z.shape != tuple(scale_shape):
        raise InvalidParameterError(
            f"zero_point shape {z.shape} does not match scale shape {tuple(scale_shape)}"
        )
    return zf


def broadcast_param(zp: np.ndarray | None, scale: np.ndarray) -> np.ndarray | None:
    if zp is None or zp.shape == scale.shape:
        return zp
    return np.broadcast_to(zp.reshape(()) if zp.size == 1 else zp, scale.shape)
