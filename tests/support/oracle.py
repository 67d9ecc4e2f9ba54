"""Slow, obviously-correct NumPy/Python implementations that the kernels are checked against.

Parameters are expanded to one value per element with explicit index arithmetic, and rounding
uses exact rational arithmetic (``fractions.Fraction``) on the float quotient.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

HALF = Fraction(1, 2)


def expand_params(p, shape, axis, block_size):
    """One parameter value per element of an array of ``shape``."""
    p = np.asarray(p)
    if axis is None or (p.size == 1 and not block_size):
        return np.full(shape, p.reshape(()), dtype=p.dtype)
    axis = axis % len(shape)
    out = np.empty(shape, dtype=p.dtype)
    for idx in np.ndindex(*shape):
        if block_size:
            pidx = list(idx)
            pidx[axis] = idx[axis] // block_size
            out[idx] = p[tuple(pidx)]
        else:
            out[idx] = p[idx[axis]]
    return out


def round_exact(v: float, mode: str) -> float:
    """Round a finite float to an integer with exact rational arithmetic."""
    f = Fraction(v)
    fl = math.floor(f)
    frac = f - fl
    if mode == "half_to_even":
        if frac != HALF:
            return float(fl + (1 if frac > HALF else 0))
        return float(fl if fl % 2 == 0 else fl + 1)
    if mode == "half_away_from_zero":
        a = abs(f)
        r = math.floor(a) + (1 if a - math.floor(a) >= HALF else 0)
        return float(r if f >= 0 else -r)
    if mode == "half_toward_zero":
        a = abs(f)
        r = math.floor(a) + (1 if a - math.floor(a) > HALF else 0)
        return float(r if f >= 0 else -r)
    if mode == "half_up":
        return float(fl + (1 if frac >= HALF else 0))
    if mode == "half_down":
        return float(fl + (1 if frac > HALF else 0))
    if mode == "up":
        return float(math.ceil(f))
    if mode == "down":
        return float(fl)
    if mode == "toward_zero":
        return float(math.trunc(f))
    if mode == "away_from_zero":
        return float(math.ceil(f) if f >= 0 else math.floor(f))
    raise ValueError(mode)


def quantize(x, scale, zero_point, qmin, qmax, *, axis=None, block_size=None, mode="half_to_even"):
    """Integer quantization: ``clip(round(x / s) + zp)``; NaN -> qmin, +-inf saturate.

    The quotient is formed by NumPy in ``result_type(x, scale)``; returns int64.
    """
    x = np.asarray(x)
    scale = np.asarray(scale)
    s = expand_params(scale, x.shape, axis, block_size)
    z = expand_params(
        np.zeros(scale.shape) if zero_point is None else zero_point, x.shape, axis, block_size
    )
    div = np.result_type(x.dtype, scale.dtype)
    v = x.astype(div) / s.astype(div)
    out = np.empty(x.shape, np.int64)
    for idx in np.ndindex(*x.shape):
        vi = float(v[idx])
        if math.isnan(vi):
            out[idx] = qmin
        elif math.isinf(vi):
            out[idx] = qmax if vi > 0 else qmin
        else:
            r = round_exact(vi, mode) + float(z[idx])
            out[idx] = int(min(max(r, qmin), qmax))
    return out


def dequantize(q, scale, zero_point, *, axis=None, block_size=None):
    """``(float32(q) - zp) * s`` evaluated exactly, rounded once to float32.

    ``float32(q)`` is exact below 2**24; int32 values beyond are rounded first, as the ONNX
    reference does (``x.astype(float32) - zero_point``).
    """
    q = np.asarray(q)
    s = expand_params(scale, q.shape, axis, block_size).astype(np.float32)
    zeros = np.zeros(np.shape(scale))
    z = expand_params(zeros if zero_point is None else zero_point, q.shape, axis, block_size)
    d = q.astype(np.float32).astype(np.float64) - z.astype(np.float64)  # exact
    return (d * s.astype(np.float64)).astype(np.float32)


def expand_dequant(q, scale, zero_point, axes):
    """nGraph-style dequantize with parameters projected on a set of axes (float32)."""
    axes = sorted(axes)
    out = np.empty(q.shape, np.float32)
    for idx in np.ndindex(*q.shape):
        p = tuple(idx[a] for a in axes)
        d = np.float32(int(q[idx]) - int(zero_point[p]))
        out[idx] = np.float32(np.float64(d) * np.float64(scale[p]))
    return out
