"""Element operations of the quantizer: the value before saturation, one per round mode.

Each takes ``(x, s, z)`` and returns ``round(x / s) + z`` in the float type of the operands
(float32 or float64), or torch's reciprocal forms. All are exact: fractional parts are taken
with ``floor``/``trunc`` (exact in binary floating point), never with ``x + 0.5``.
NaN stays NaN and infinities stay infinite, so saturation decides them.
"""

from __future__ import annotations

import numpy as np

from .runtime import njit

_inline = njit(inline="always", cache=True)


@_inline
def half_to_even(x, s, z):
    return np.rint(x / s) + z


@_inline
def half_away_from_zero(x, s, z):
    v = x / s
    a = np.abs(v)
    t = np.floor(a)
    r = t + (1.0 if a - t >= 0.5 else 0.0)
    return np.copysign(r, v) + z


@_inline
def half_toward_zero(x, s, z):
    v = x / s
    a = np.abs(v)
    t = np.floor(a)
    r = t + (1.0 if a - t > 0.5 else 0.0)
    return np.copysign(r, v) + z


@_inline
def half_up(x, s, z):
    v = x / s
    f = np.floor(v)
    return f + (1.0 if v - f >= 0.5 else 0.0) + z


@_inline
def half_down(x, s, z):
    v = x / s
    f = np.floor(v)
    return f + (1.0 if v - f > 0.5 else 0.0) + z


@_inline
def up(x, s, z):
    return np.ceil(x / s) + z


@_inline
def down(x, s, z):
    return np.floor(x / s) + z


@_inline
def toward_zero(x, s, z):
    return np.trunc(x / s) + z


@_inline
def away_from_zero(x, s, z):
    v = x / s
    return np.copysign(np.ceil(np.abs(v)), v) + z


@_inline
def mul_add_half_to_even(x, inv, z):
    """torch per-channel / qint32: ``nearbyint(x * inv_scale + zp)``, unfused, in float32."""
    return np.rint(x * inv + z)


@_inline
def fma_half_to_even(x, inv, z):
    """torch per-tensor 8-bit (fbgemm): ``nearbyint(fma(x, inv_scale, zp))``.

    The fused multiply-add is formed in float64, where the product of two float32 values is
    exact, and rounded once to float32.
    """
    return np.rint(np.float32(np.float64(x) * np.float64(inv) + np.float64(z)))


@_inline
def div_add_half_to_even(x, s, z):
    """oneDNN: ``round(x / scale + zp)``, the zero point added before rounding."""
    return np.rint(x / s + z)


# nGraph's nearest modes as its reference kernel evaluates them: the quotient, ``q +- 0.5``,
# ``floor``/``ceil`` and ``+ zp`` all in the input's real type R (``type(v)``: float32 or
# float64), so ``q + 0.5`` is rounded in R. ``z`` arrives in R, already rounded from the
# integer offset as C++ converts it. The sign test ``q < 0`` turns -0.0 into +0.


@_inline
def real_half_away_from_zero(x, s, z):
    """ROUND_NEAREST_TOWARD_INFINITY: ``sign(q) * floor(|q| + 0.5)``, in R."""
    v = x / s
    t = np.floor(np.abs(v) + type(v)(0.5))
    return (-t if v < 0 else t) + z


@_inline
def real_half_toward_zero(x, s, z):
    """ROUND_NEAREST_TOWARD_ZERO: ``sign(q) * ceil(|q| - 0.5)``, in R."""
    v = x / s
    t = np.ceil(np.abs(v) - type(v)(0.5))
    return (-t if v < 0 else t) + z


@_inline
def real_half_up(x, s, z):
    """ROUND_NEAREST_UPWARD: ``floor(q + 0.5)``, in R."""
    v = x / s
    return np.floor(v + type(v)(0.5)) + z


@_inline
def real_half_down(x, s, z):
    """ROUND_NEAREST_DOWNWARD: ``ceil(q - 0.5)``, in R."""
    v = x / s
    return np.ceil(v - type(v)(0.5)) + z


@_inline
def real_half_to_even(x, s, z):
    """ROUND_NEAREST_TOWARD_EVEN: ``up = floor(q + 0.5)``, ``dn = ceil(q - 0.5)``, in R; then
    ``up`` if ``fmod(up, 2.0) == 0`` else ``dn`` (the fmod is exact in any type)."""
    v = x / s
    half = type(v)(0.5)
    up = np.floor(v + half)
    dn = np.ceil(v - half)
    return (up if np.fmod(up, 2.0) == 0.0 else dn) + z


@_inline
def dq_float32_difference(q, s, z):
    """ONNX: ``(float32(q) - z) * s`` in the types of ``z`` and ``s``."""
    return (np.float32(q) - z) * s


@_inline
def dq_integer_difference(q, s, z):
    """``R(q - z) * s`` with R the type of ``s``: the difference in integers, wrapped to 32
    bits (C++ ``int`` arithmetic on x86-64), converted to R (a rounding), then multiplied in R
    (a second rounding). ``z`` is an int64."""
    return type(s)(np.int32(np.int64(q) - z)) * s
