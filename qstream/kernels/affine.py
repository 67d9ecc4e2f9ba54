"""The affine quantize / dequantize kernels, one loop nest for every granularity.

Arrays arrive as ``[O, C, I]`` views with parameters ``[Op, Cp, Ip]`` (see ``qstream.layout``).
Work is split into tiles of at most ``TILE`` inner elements; each tile is independent, so the
result does not depend on the thread count. Each round mode has its own kernel (the element
operation is inlined), so inner loops are branch-free and vectorise, and a mode compiles only
when first used.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from ..budget import TILE
from ..qtypes import TINY_SCALE
from . import rounding as r
from .bits import bits32, from_bits32
from .runtime import helper, njit, parallel_kernel

PARTS = 256  # runs of work items per call: enough to balance two to a few dozen threads
# how a range gives its parameters (``range_params``): symmetric with zero point 0 or the
# mid-range code, or asymmetric
SYM_SIGNED, SYM_UNSIGNED, ASYM = 0, 1, 2
# how scales are rounded (``scale_mode``; ``qstream.core.SCALE_MODES``): float32 values no
# smaller than TINY_SCALE, or float16 or bfloat16 values
SCALE_F32, SCALE_F16, SCALE_BF16 = 0, 1, 2


@njit(inline="always", cache=True)
def half_scale(s):
    """A float32 scale as ``qstream.calibration.params.half_scales`` rounds it: clamped to
    ``[2**-24, 65504]``, then to the nearest float16 value (ties to even), on the float32 bits
    (no libm call: this runs once per group)."""
    x = min(max(s, np.float32(2.0**-24)), np.float32(65504.0))
    if x >= np.float32(2.0**-14):  # a normal float16: keep 10 of the 23 mantissa bits, RNE
        b = bits32(x)
        b = (b + np.int32(0xFFF) + ((b >> np.int32(13)) & np.int32(1))) & np.int32(-0x2000)
        return from_bits32(b)
    # a subnormal float16: a multiple of 2**-24 (both products are exact)
    return np.float32(np.rint(x * np.float32(2.0**24)) * np.float32(2.0**-24))


@njit(inline="always", cache=True)
def bf16_scale(s):
    """A float32 scale as ``qstream.core.bf16_scales`` rounds it: clamped to ``[2**-133,
    3.3895e38]`` (the smallest positive and the largest finite bfloat16), then to the nearest
    bfloat16 value (ties to even) on the float32 bits: bfloat16 is float32's upper half, so
    the 16 low bits are rounded away, subnormals included (the carry moves the exponent)."""
    x = min(max(s, from_bits32(np.int32(0x00010000))), from_bits32(np.int32(0x7F7F0000)))
    b = bits32(x)
    b = (b + np.int32(0x7FFF) + ((b >> np.int32(16)) & np.int32(1))) & np.int32(-0x10000)
    return from_bits32(b)


@njit(inline="always", cache=True)
def round_scale(s, scale_mode):
    """A float32 scale as ``scale_mode`` rounds it (:data:`SCALE_F16`: :func:`half_scale`,
    :data:`SCALE_BF16`: :func:`bf16_scale`, else no smaller than ``TINY_SCALE``)."""
    if scale_mode == SCALE_F16:
        return half_scale(s)
    if scale_mode == SCALE_BF16:
        return bf16_scale(s)
    return max(s, TINY_SCALE)


@helper
def range_params(vlo, vhi, mode, qmin, qmax, steps, zp_sym, scale_mode):
    """``(scale, zero_point)`` (float32, float64) of the finite range ``[vlo, vhi]`` (float64;
    0 where none is finite), operation for operation as
    ``qstream.calibration.params_from_range`` derives them for an integer type: the range
    widened to 0; ``mode`` :data:`ASYM`: ``(hi - lo) / (qmax - qmin)``, zero point ``rint(qmin
    - lo / s)`` clipped to ``[qmin, qmax]``; else ``absmax / steps`` with zero point 0
    (:data:`SYM_SIGNED`) or ``zp_sym``; 1 for an empty range; the scale rounded as
    ``scale_mode`` says (:func:`round_scale`) before the zero point is taken."""
    vlo = min(vlo, 0.0)
    vhi = max(vhi, 0.0)
    if mode == ASYM:
        span = vhi - vlo
        s32 = np.float32(span / (qmax - qmin)) if span > 0 else np.float32(1.0)
        s32 = round_scale(s32, scale_mode)
        return s32, min(max(np.rint(qmin - vlo / np.float64(s32)), qmin), qmax)
    amax = max(-vlo, vhi)
    s32 = np.float32(amax / steps) if amax > 0 else np.float32(1.0)
    return round_scale(s32, scale_mode), 0.0 if mode == SYM_SIGNED else zp_sym


@njit(inline="always", cache=True)
def tile_coords(t, n_tiles, n_c, n_inner, p_outer, cblock):
    """Work unit ``t`` of an ``[O, C, I]`` view cut in tiles of ``TILE`` inner elements:
    ``(o, c, po, pc, i0, i1)`` with ``po``/``pc`` the parameter row it uses."""
    row = t // n_tiles
    i0 = (t - row * n_tiles) * TILE
    i1 = min(n_inner, i0 + TILE)
    o = row // n_c
    c = row - o * n_c
    return o, c, (o if p_outer > 1 else 0), c // cblock, i0, i1


@njit(inline="always", cache=True)
def quantize_run(xs, s, z, os, lo, hi, mask, op):
    """Quantize the values ``xs`` with one scale and zero point into ``os`` (the element
    operation ``op``, saturated to ``[lo, hi]``, masked)."""
    for i in range(xs.shape[0]):
        os[i] = np.int32(min(max(lo, op(xs[i], s, z)), hi)) & mask


@njit(inline="always", cache=True)
def quantize_tile(xr, sr, zr, outr, i0, i1, iblock, lo, hi, mask, op):
    """Quantize ``xr[i0:i1]`` into ``outr``; parameters ``sr``/``zr`` are one row of p3.

    Loops run over zero-based slices: with a runtime start index Numba keeps negative-index
    handling in the loop, which stops LLVM from emitting packed stores.
    """
    xs = xr[i0:i1]
    os = outr[i0:i1]
    n = xs.shape[0]
    if sr.shape[0] == 1:
        quantize_run(xs, sr[0], zr[0], os, lo, hi, mask, op)
    elif iblock == 1:
        ss = sr[i0:i1]
        zs = zr[i0:i1]
        for i in range(n):
            os[i] = np.int32(min(max(lo, op(xs[i], ss[i], zs[i])), hi)) & mask
    else:
        i = i0
        while i < i1:
            b = i // iblock
            end = min(i1, (b + 1) * iblock)
            s = sr[b]
            z = zr[b]
            xb = xr[i:end]
            ob = outr[i:end]
            for j in range(end - i):
                ob[j] = np.int32(min(max(lo, op(xb[j], s, z)), hi)) & mask
            i = end


@njit(inline="always", cache=True)
def _quantize_all(x, scale, zero_point, cblock, iblock, lo, hi, mask, out, op):
    """The parallel loop over tiles, inlined into one kernel per element operation."""
    n_outer, n_c, n_inner = x.shape
    p_outer = scale.shape[0]
    n_tiles = (n_inner + TILE - 1) // TILE
    for t in prange(n_outer * n_c * n_tiles):
        o, c, po, pc, i0, i1 = tile_coords(t, n_tiles, n_c, n_inner, p_outer, cblock)
        quantize_tile(
            x[o, c],
            scale[po, pc],
            zero_point[po, pc],
            out[o, c],
            i0,
            i1,
            iblock,
            lo,
            hi,
            mask,
            op,
        )


# One kernel per element operation, so each compiles (and is cached) only when first used.
# Arguments: x float [O, C, I]; scale, zero_point [Op, Cp, Ip] in the compute float type;
# cblock, iblock (see qstream.layout); lo, hi saturation bounds (NaN -> lo, +inf -> hi);
# mask: bits kept in the integer container; out: integer container [O, C, I].
_kernel = parallel_kernel(inputs=3)


@_kernel
def q_half_to_even(x, scale, zero_point, cblock, iblock, lo, hi, mask, out):
    _quantize_all(x, scale, zero_point, cblock, iblock, lo, hi, mask, out, r.half_to_even)


@_kernel
def q_half_away_from_zero(x, scale, zero_point, cblock, iblock, lo, hi, mask, out):
    _quantize_all(x, scale, zero_point, cblock, iblock, lo, hi, mask, out, r.half_away_from_zero)


@_kernel
def q_half_toward_zero(x, scale, zero_point, cblock, iblock, lo, hi, mask, out):
    _quantize_all(x, scale, zero_point, cblock, iblock, lo, hi, mask, out, r.half_toward_zero)


@_kernel
def q_half_up(x, scale, zero_point, cblock, iblock, lo, hi, mask, out):
    _quantize_all(x, scale, zero_point, cblock, iblock, lo, hi, mask, out, r.half_up)


@_kernel
def q_half_down(x, scale, zero_point, cblock, iblock, lo, hi, mask, out):
    _quantize_all(x, scale, zero_point, cblock, iblock, lo, hi, mask, out, r.half_down)


@_kernel
def q_up(x, scale, zero_point, cblock, iblock, lo, hi, mask, out):
    _quantize_all(x, scale, zero_point, cblock, iblock, lo, hi, mask, out, r.up)


@_kernel
def q_down(x, scale, zero_point, cblock, iblock, lo, hi, mask, out):
    _quantize_all(x, scale, zero_point, cblock, iblock, lo, hi, mask, out, r.down)


@_kernel
def q_toward_zero(x, scale, zero_point, cblock, iblock, lo, hi, mask, out):
    _quantize_all(x, scale, zero_point, cblock, iblock, lo, hi, mask, out, r.toward_zero)


@_kernel
def q_away_from_zero(x, scale, zero_point, cblock, iblock, lo, hi, mask, out):
    _quantize_all(x, scale, zero_point, cblock, iblock, lo, hi, mask, out, r.away_from_zero)


@_kernel
def q_mul_add_half_to_even(x, scale, zero_point, cblock, iblock, lo, hi, mask, out):
    _quantize_all(x, scale, zero_point, cblock, iblock, lo, hi, mask, out, r.mul_add_half_to_even)


@_kernel
def q_fma_half_to_even(x, scale, zero_point, cblock, iblock, lo, hi, mask, out):
    _quantize_all(x, scale, zero_point, cblock, iblock, lo, hi, mask, out, r.fma_half_to_even)


@_kernel
def q_div_add_half_to_even(x, scale, zero_point, cblock, iblock, lo, hi, mask, out):
    _quantize_all(x, scale, zero_point, cblock, iblock, lo, hi, mask, out, r.div_add_half_to_even)


@_kernel
def q_real_half_away_from_zero(x, scale, zero_point, cblock, iblock, lo, hi, mask, out):
    _quantize_all(
        x, scale, zero_point, cblock, iblock, lo, hi, mask, out, r.real_half_away_from_zero
    )


@_kernel
def q_real_half_toward_zero(x, scale, zero_point, cblock, iblock, lo, hi, mask, out):
    _quantize_all(x, scale, zero_point, cblock, iblock, lo, hi, mask, out, r.real_half_toward_zero)


@_kernel
def q_real_half_up(x, scale, zero_point, cblock, iblock, lo, hi, mask, out):
    _quantize_all(x, scale, zero_point, cblock, iblock, lo, hi, mask, out, r.real_half_up)


@_kernel
def q_real_half_down(x, scale, zero_point, cblock, iblock, lo, hi, mask, out):
    _quantize_all(x, scale, zero_point, cblock, iblock, lo, hi, mask, out, r.real_half_down)


@_kernel
def q_real_half_to_even(x, scale, zero_point, cblock, iblock, lo, hi, mask, out):
    _quantize_all(x, scale, zero_point, cblock, iblock, lo, hi, mask, out, r.real_half_to_even)


# Indexed by qstream.rounding codes.
QUANTIZE_KERNELS = (
    q_half_to_even,
    q_half_away_from_zero,
    q_half_toward_zero,
    q_half_up,
    q_half_down,
    q_up,
    q_down,
    q_toward_zero,
    q_away_from_zero,
    q_mul_add_half_to_even,
    q_fma_half_to_even,
    q_div_add_half_to_even,
    q_real_half_away_from_zero,
    q_real_half_toward_zero,
    q_real_half_up,
    q_real_half_down,
    q_real_half_to_even,
)


@njit(inline="always", cache=True)
def _dequantize_all(q, scale, zero_point, cblock, iblock, out, op):
    """The parallel loop over tiles of a dequantize kernel; ``op(q, s, z)`` is the element
    operation."""
    n_outer, n_c, n_inner = q.shape
    p_outer = scale.shape[0]
    n_tiles = (n_inner + TILE - 1) // TILE
    for t in prange(n_outer * n_c * n_tiles):
        o, c, po, pc, i0, i1 = tile_coords(t, n_tiles, n_c, n_inner, p_outer, cblock)
        qs = q[o, c][i0:i1]
        os = out[o, c][i0:i1]
        sr = scale[po, pc]
        zr = zero_point[po, pc]
        n = qs.shape[0]
        if sr.shape[0] == 1:
            s = sr[0]
            z = zr[0]
            for i in range(n):
                os[i] = op(qs[i], s, z)
        elif iblock == 1:
            ss = sr[i0:i1]
            zs = zr[i0:i1]
            for i in range(n):
                os[i] = op(qs[i], ss[i], zs[i])
        else:
            for i in range(n):
                b = (i0 + i) // iblock
                os[i] = op(qs[i], sr[b], zr[b])


@parallel_kernel(inputs=3)
def dequantize_affine(q, scale, zero_point, cblock, iblock, out):
    """``out = (float32(q) - zero_point) * scale``, in the parameters' float types (the
    subtraction in zero_point's, the product in the wider of both).

    q: integer ``[O, C, I]``; scale, zero_point: ``[Op, Cp, Ip]``; out: float ``[O, C, I]``.
    """
    _dequantize_all(q, scale, zero_point, cblock, iblock, out, r.dq_float32_difference)


@parallel_kernel(inputs=3)
def dequantize_affine_int(q, scale, zero_point, cblock, iblock, out):
    """``out = R(q - zero_point) * scale`` with R scale's float type: the difference in
    integers (wrapped to 32 bits), converted to R, multiplied in R (nGraph's ``(REAL)(q -
    offset) * scale``, torch's per-tensor qint32). zero_point: int64 ``[Op, Cp, Ip]``.
    """
    _dequantize_all(q, scale, zero_point, cblock, iblock, out, r.dq_integer_difference)
