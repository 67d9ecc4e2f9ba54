"""Kernels of float offsets: ``q = sat(round((x - offset) / scale))`` and
``x = q * scale + offset``, both in float64, for per-tensor and per-axis parameters.

Arrays arrive as ``[O, C, I]`` views with parameters ``[Op, Cp, Ip]`` (see
``qstream.core.layout``; blocked layouts do not use float offsets). Work is cut in tiles of
at most ``TILE`` inner elements, each independent, so results do not depend on the thread
count. The dequantize product ``q * scale`` is exact in float64 (codes of at most 16 bits
times a float32 scale), so ``q * scale + offset`` is rounded once in float64, then to the
output type: what CF decoding (``packed * scale_factor + add_offset`` in float64, then
``astype``) computes. The multiply and the add are separate operations (no fused
multiply-add: Numba does not contract them without fastmath).
"""

from __future__ import annotations

import numpy as np
from numba import prange

from . import rounding as r
from .affine import TILE, tile_coords
from .runtime import njit, parallel_kernel


@njit(inline="always", cache=True)
def _quantize_all(x, scale, offset, cblock, iblock, lo, hi, out, op):
    n_outer, n_c, n_inner = x.shape
    n_tiles = (n_inner + TILE - 1) // TILE
    for t in prange(n_outer * n_c * n_tiles):
        o, c, po, pc, i0, i1 = tile_coords(t, n_tiles, n_c, n_inner, scale.shape[0], cblock)
        xr = x[o, c]
        outr = out[o, c]
        sr = scale[po, pc]
        orr = offset[po, pc]
        for i in range(i0, i1):
            b = 0 if sr.shape[0] == 1 else i // iblock
            v = np.float64(xr[i]) - orr[b]
            outr[i] = min(max(lo, op(v, sr[b], 0.0)), hi)


# One kernel per round mode (each compiles when first used). Arguments: x float [O, C, I];
# scale, offset float64 [Op, Cp, Ip]; cblock, iblock; lo, hi the code range as float64
# (NaN -> lo, as the affine kernels); out: the codes' container [O, C, I].


@parallel_kernel(inputs=3)
def qo_half_to_even(x, scale, offset, cblock, iblock, lo, hi, out):
    _quantize_all(x, scale, offset, cblock, iblock, lo, hi, out, r.half_to_even)


@parallel_kernel(inputs=3)
def qo_half_away_from_zero(x, scale, offset, cblock, iblock, lo, hi, out):
    _quantize_all(x, scale, offset, cblock, iblock, lo, hi, out, r.half_away_from_zero)


@parallel_kernel(inputs=3)
def qo_half_toward_zero(x, scale, offset, cblock, iblock, lo, hi, out):
    _quantize_all(x, scale, offset, cblock, iblock, lo, hi, out, r.half_toward_zero)


@parallel_kernel(inputs=3)
def qo_half_up(x, scale, offset, cblock, iblock, lo, hi, out):
    _quantize_all(x, scale, offset, cblock, iblock, lo, hi, out, r.half_up)


@parallel_kernel(inputs=3)
def qo_half_down(x, scale, offset, cblock, iblock, lo, hi, out):
    _quantize_all(x, scale, offset, cblock, iblock, lo, hi, out, r.half_down)


@parallel_kernel(inputs=3)
def qo_up(x, scale, offset, cblock, iblock, lo, hi, out):
    _quantize_all(x, scale, offset, cblock, iblock, lo, hi, out, r.up)


@parallel_kernel(inputs=3)
def qo_down(x, scale, offset, cblock, iblock, lo, hi, out):
    _quantize_all(x, scale, offset, cblock, iblock, lo, hi, out, r.down)


@parallel_kernel(inputs=3)
def qo_toward_zero(x, scale, offset, cblock, iblock, lo, hi, out):
    _quantize_all(x, scale, offset, cblock, iblock, lo, hi, out, r.toward_zero)


@parallel_kernel(inputs=3)
def qo_away_from_zero(x, scale, offset, cblock, iblock, lo, hi, out):
    _quantize_all(x, scale, offset, cblock, iblock, lo, hi, out, r.away_from_zero)


# indexed by qstream.rounding.round_code (the plain round modes)
OFFSET_KERNELS = (
    qo_half_to_even,
    qo_half_away_from_zero,
    qo_half_toward_zero,
    qo_half_up,
    qo_half_down,
    qo_up,
    qo_down,
    qo_toward_zero,
    qo_away_from_zero,
)


@parallel_kernel(inputs=3)
def dequantize_offset(q, scale, offset, cblock, iblock, out):
    """``out = q * scale + offset`` in float64 (one rounding), stored in ``out``'s type."""
    n_outer, n_c, n_inner = q.shape
    n_tiles = (n_inner + TILE - 1) // TILE
    for t in prange(n_outer * n_c * n_tiles):
        o, c, po, pc, i0, i1 = tile_coords(t, n_tiles, n_c, n_inner, scale.shape[0], cblock)
        qr = q[o, c]
        outr = out[o, c]
        sr = scale[po, pc]
        orr = offset[po, pc]
        for i in range(i0, i1):
            b = 0 if sr.shape[0] == 1 else i // iblock
            v = np.float64(qr[i]) * sr[b]
            outr[i] = v + orr[b]
