"""Small per-tensor calls straight to the compiled kernel.

A notebook loop over many small tensors, or a checkpoint with hundreds of small ones, pays
the general path's Python-level work on every call (NumPy reductions to validate a scalar
scale and zero point, the layout plan, the threading-layer check). For the common case, a
small C-contiguous float32 array with a scalar float32 scale, a scalar integer zero point
and an integer output of at most 16 bits, these functions check the scalars in plain Python
and call the serial kernel directly. They return None for anything else (and for every
invalid argument), and the general path then handles the call, errors included: the result
is the same either way (tested against the general path).
"""

from __future__ import annotations

import math
import threading

import numpy as np

from ..kernels import runtime
from ..kernels.affine import QUANTIZE_KERNELS, dequantize_affine
from ..qtypes import QTYPES, QType
from ..rounding import ROUND_MODES

F32 = np.dtype(np.float32)
_SCALAR_SCALE = (float, int, np.float32)
_ZP_TYPES = {int: None, **{getattr(np, n): QTYPES[n] for n in ("int8", "uint8", "int16", "uint16")}}
_ROUND_CODES = {name: code for code, name in enumerate(ROUND_MODES)}
_DEQUANTIZED = ("int8", "uint8", "int16", "uint16")
_local = threading.local()


def _params(s: float, z: int):
    """This thread's one-element ``[1, 1, 1]`` scale and zero-point arrays, set to s, z."""
    p = getattr(_local, "p", None)
    if p is None:
        p = _local.p = (np.empty((1, 1, 1), F32), np.empty((1, 1, 1), F32))
    p[0][0, 0, 0] = s
    p[1][0, 0, 0] = z
    return p


def _bounds(qt: QType):
    b = _BOUNDS.get(qt.name)
    if b is None:
        b = _BOUNDS[qt.name] = (np.float32(qt.qmin), np.float32(qt.qmax), np.int32(qt.mask))
    return b


_BOUNDS: dict[str, tuple] = {}


def _scale(scale) -> float | None:
    """The scale as the float32 value the kernels use, if it is a valid scalar."""
    if type(scale) not in _SCALAR_SCALE:
        return None
    s = float(np.float32(scale))
    return s if math.isfinite(s) and s > 0 else None  # else the general path names it


def _zero_point(zero_point, qt: QType) -> int | None:
    z = 0 if zero_point is None else int(zero_point)
    return z if qt.qmin <= z <= qt.qmax else None


def quantize(x, scale, zero_point, dtype, round_mode):
    """Per-tensor quantize of a small float32 array, or None (see the module docstring)."""
    code = _ROUND_CODES.get(round_mode)
    zp_type = type(zero_point)
    if (
        code is None
        or type(x) is not np.ndarray
        or x.dtype != F32
        or not x.flags.c_contiguous
        or not 0 < x.size < runtime.SERIAL_BELOW
        or (zero_point is not None and zp_type not in _ZP_TYPES)
    ):
        return None
    if dtype is None:
        qt = _ZP_TYPES.get(zp_type) or QTYPES["uint8"]
    else:
        qt = QTYPES.get(dtype) if isinstance(dtype, str) else None
        if qt is None or qt.is_float or qt.bits > 16:
            return None
    s = _scale(scale)
    z = None if s is None else _zero_point(zero_point, qt)
    if z is None:
        return None
    out = np.empty(x.shape, qt.dtype)
    lo, hi, mask = _bounds(qt)
    n = x.size
    QUANTIZE_KERNELS[code].serial(
        x.reshape(1, 1, n),
        *_params(s, z),
        1,
        1,
        lo,
        hi,
        mask,
        out.view(qt.container).reshape(1, 1, n),
    )
    return out


def dequantize(q, scale, zero_point):
    """Per-tensor float32 dequantize of a small integer array (int8/uint8/int16/uint16), or
    None (see the module docstring)."""
    if (
        type(q) is not np.ndarray
        or not q.flags.c_contiguous
        or not 0 < q.size < runtime.SERIAL_BELOW
        or (zero_point is not None and type(zero_point) not in (int, q.dtype.type))
    ):
        return None
    name = q.dtype.name
    if name not in _DEQUANTIZED:
        return None
    qt = QTYPES[name]
    s = _scale(scale)
    z = None if s is None else _zero_point(zero_point, qt)
    if z is None:
        return None
    out = np.empty(q.shape, F32)
    n = q.size
    dequantize_affine.serial(q.reshape(1, 1, n), *_params(s, z), 1, 1, out.reshape(1, 1, n))
    return out
