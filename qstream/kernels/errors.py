"""Quantization error sums, fused: read x and q once, never materialise the dequantized block.

Arrays use the quantize layout (``qstream.layout``): x and q ``[O, C, I]``, parameters
``[Op, Cp, Ip]``. The channel of an element is its ``c`` index, or its ``i`` index when the
quantized axis was moved to the inner position (``chan_inner``); per tensor there is one.
Sums are taken per tile (a partition that does not depend on the thread count) and folded in
tile order, so results are identical at every thread count.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .affine import TILE, tile_coords

# columns of the result: count, sum x^2, sum e^2, sum x*y, sum y^2, max |e|, clipped, non-finite
N_SUMS = 8


@njit(inline="always", cache=True)
def _accumulate(acc, k, xv, qv, s, z, lo_x, hi_x):
    """Add one element to row ``k`` of ``acc`` (used where channels change per element)."""
    if xv - xv != 0:  # NaN or +-inf
        acc[k, 7] += 1.0
        return
    y = np.float64(np.float32((np.float32(qv) - z) * s))  # the dequantized value
    x = np.float64(xv)
    e = x - y
    acc[k, 0] += 1.0
    acc[k, 1] += x * x
    acc[k, 2] += e * e
    acc[k, 3] += x * y
    acc[k, 4] += y * y
    acc[k, 5] = max(acc[k, 5], abs(e))
    if x > hi_x * s or x < lo_x * s:
        acc[k, 6] += 1.0


@njit(inline="always", cache=True, fastmath={"reassoc"})
def _tile_sums(xs, qs, s, z, lo_x, hi_x, acc, t):
    """Sums of a run of elements sharing one scale/zero point, in registers, branch-free."""
    n = 0.0
    sx2 = 0.0
    se2 = 0.0
    sxy = 0.0
    sy2 = 0.0
    emax = 0.0
    clip = 0.0
    bad = 0.0
    lo = lo_x * s
    hi = hi_x * s
    for i in range(xs.shape[0]):
        xv = xs[i]
        fin = xv - xv == 0  # False for NaN and +-inf
        y = np.float64(np.float32((np.float32(qs[i]) - z) * s)) if fin else 0.0
        x = np.float64(xv) if fin else 0.0
        e = x - y
        n += 1.0 if fin else 0.0
        bad += 0.0 if fin else 1.0
        sx2 += x * x
        se2 += e * e
        sxy += x * y
        sy2 += y * y
        emax = max(emax, abs(e))
        clip += 1.0 if (x > hi or x < lo) else 0.0
    acc[t, 0] += n
    acc[t, 1] += sx2
    acc[t, 2] += se2
    acc[t, 3] += sxy
    acc[t, 4] += sy2
    acc[t, 5] = max(acc[t, 5], emax)
    acc[t, 6] += clip
    acc[t, 7] += bad


# reassoc only: lets LLVM vectorise the float64 reductions; NaN/inf semantics are untouched,
# and the tile partition keeps the sums identical at every thread count.
@njit(parallel=True, cache=True, nogil=True, fastmath={"reassoc"})
def error_sums(x, q, scale, zero_point, cblock, iblock, qmin, qmax, chan_inner, out):
    """Add the error sums of one block to ``out[channels, N_SUMS]``.

    An element counts as clipped when it lies beyond the representable range by more than
    half a step: ``x > (qmax - zp + 0.5) * s`` or ``x < (qmin - zp - 0.5) * s``.
    """
    n_outer, n_c, n_inner = x.shape
    p_outer = scale.shape[0]
    p_inner = scale.shape[2]
    if chan_inner:
        groups = (n_inner + 63) // 64
        for g in prange(groups):
            i0 = g * 64
            i1 = min(n_inner, i0 + 64)
            for o in range(n_outer):
                po = o if p_outer > 1 else 0
                for c in range(n_c):
                    sr = scale[po, c // cblock]
                    zr = zero_point[po, c // cblock]
                    for i in range(i0, i1):
                        pi = i // iblock if p_inner > 1 else 0
                        z = zr[pi]
                        _accumulate(
                            out,
                            i,
                            x[o, c, i],
                            q[o, c, i],
                            sr[pi],
                            z,
                            qmin - z - 0.5,
                            qmax - z + 0.5,
                        )
        return
    n_tiles = (n_inner + TILE - 1) // TILE
    total = n_outer * n_c * n_tiles
    partial = np.zeros((total, N_SUMS))
    for t in prange(total):
        o, c, po, pc, i0, i1 = tile_coords(t, n_tiles, n_c, n_inner, p_outer, cblock)
        sr = scale[po, pc]
        zr = zero_point[po, pc]
        xs = x[o, c][i0:i1]
        qs = q[o, c][i0:i1]
        if p_inner == 1:
            z = zr[0]
            _tile_sums(xs, qs, sr[0], z, qmin - z - 0.5, qmax - z + 0.5, partial, t)
        else:
            i = i0
            while i < i1:  # runs that share a parameter
                pi = i // iblock
                end = min(i1, (pi + 1) * iblock)
                z = zr[pi]
                _tile_sums(
                    x[o, c][i:end],
                    q[o, c][i:end],
                    sr[pi],
                    z,
                    qmin - z - 0.5,
                    qmax - z + 0.5,
                    partial,
                    t,
                )
                i = end
    for t in range(total):
        ch = ((t // n_tiles) % n_c) if n_c == out.shape[0] else 0
        for k in range(N_SUMS):
            if k == 5:
                out[ch, k] = max(out[ch, k], partial[t, k])
            else:
                out[ch, k] += partial[t, k]
