"""Small per-tensor calls straight to the compiled kernel.

A notebook loop over many small tensors, or a checkpoint with hundreds of small ones, pays
the general path's Python-level work on every call (NumPy reductions to validate a scalar
scale and zero point, the layout plan, the threading-layer check). For the common case, a
small C-contiguous float32 array with a scalar float32 scale, a scalar integer zero point
and an integer output of at most 16 bits, these functions check the scalars in plain Python
and call the serial kernel directly (:func:`qstream.engine.jobs.array_jobs.quantize_direct`). They
return None for anything else (and for every invalid argument), and the general path then
handles the call, errors included: the result is the same either way (tested against the
general path).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, DTypeLike, NDArray

from ..engine.jobs import DIRECT_BELOW, dequantize_direct, quantize_direct
from ..qtypes import QTYPES, QType
from ..rounding import ROUND_MODES

F32 = np.dtype(np.float32)
_SCALAR_SCALE = (float, int, np.float32)
_ZP_TYPES = {int: None, **{getattr(np, n): QTYPES[n] for n in ("int8", "uint8", "int16", "uint16")}}
_ROUND_CODES = {name: code for code, name in enumerate(ROUND_MODES)}
_DEQUANTIZED = ("int8", "uint8", "int16", "uint16")


def _scale(scale: object) -> float | None:
    """The scale as the float32 value the kernels use, if it is a valid scalar."""
    # exact types: a float64 or bool scalar takes the general path (isinstance: for mypy)
    if type(scale) not in _SCALAR_SCALE or not isinstance(scale, _SCALAR_SCALE):
        return None
    s = float(np.float32(scale))
    return s if math.isfinite(s) and s > 0 else None  # else the general path names it


def _zero_point(zero_point: int | np.integer[Any] | None, qt: QType) -> int | None:
    z = 0 if zero_point is None else int(zero_point)
    return z if qt.qmin <= z <= qt.qmax else None


def quantize(
    x: ArrayLike,
    scale: ArrayLike,
    zero_point: ArrayLike | None,
    dtype: DTypeLike | QType | None,
    round_mode: str,
) -> NDArray[Any] | None:
    """Per-tensor quantize of a small float32 array, or None (see the module docstring)."""
    code = _ROUND_CODES.get(round_mode)
    if (
        code is None
        or type(x) is not np.ndarray
        or x.dtype != F32
        or not x.flags.c_contiguous
        or not 0 < x.size < DIRECT_BELOW
        or (zero_point is not None and type(zero_point) not in _ZP_TYPES)
        or not isinstance(zero_point, int | np.integer | None)  # (known by now: for mypy)
    ):
        return None
    if dtype is None:
        qt = _ZP_TYPES.get(type(zero_point)) or QTYPES["uint8"]
    else:
        found = QTYPES.get(dtype) if isinstance(dtype, str) else None
        if found is None or found.is_float or found.bits > 16:
            return None
        qt = found
    s = _scale(scale)
    z = None if s is None else _zero_point(zero_point, qt)
    if s is None or z is None:
        return None
    return quantize_direct(x, s, z, qt, code)


def dequantize(
    q: ArrayLike, scale: ArrayLike, zero_point: ArrayLike | None
) -> NDArray[np.float32] | None:
    """Per-tensor float32 dequantize of a small integer array (int8/uint8/int16/uint16), or
    None (see the module docstring)."""
    if (
        type(q) is not np.ndarray
        or not q.flags.c_contiguous
        or not 0 < q.size < DIRECT_BELOW
        or (zero_point is not None and type(zero_point) not in (int, q.dtype.type))
        or not isinstance(zero_point, int | np.integer | None)  # (a float one: not ours)
    ):
        return None
    name = q.dtype.name
    if name not in _DEQUANTIZED:
        return None
    qt = QTYPES[name]
    s = _scale(scale)
    z = None if s is None else _zero_point(zero_point, qt)
    if s is None or z is None:
        return None
    return dequantize_direct(q, s, z)
