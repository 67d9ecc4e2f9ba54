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
from . import rounding as r
from .runtime import njit, parallel_kernel


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
def quantize_tile(xr, sr, zr, outr, i0, i1, iblock, lo, hi, mask, op):
    """Quantize ``xr[i0:i1]`` into ``outr``; parameters ``sr``/``zr`` are one row of p3.

    Loops run over zero-based slices: with a runtime start index Numba keeps negative-index
    handling in the loop, which stops LLVM from emitting packed stores.
    """
    xs = xr[i0:i1]
    os = outr[i0:i1]
    n = xs.shape[0]
    if sr.shape[0] == 1:
        s = sr[0]
        z = zr[0]
        for i in range(n):
            os[i] = np.int32(min(max(lo, op(xs[i], s, z)), hi)) & mask
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
