"""The packed layouts of llama.cpp's K-quant blocks, shared by the quantize and dequantize
kernels (:mod:`.kquants`): the 6-bit scales and mins of Q4_K/Q5_K (:func:`pack_k4` /
:func:`scale_min_k4`), the 6-bit signed scales of Q3_K (:func:`pack_k3` / :func:`scale_k3`)
and the 2-bit codes of Q2_K/Q3_K (:func:`pack_2bit`). (The float16 scales: ``put_half`` /
``half_at`` in :mod:`.kquants_search`.) And the per-row error sums of an export's SQNR table
(:func:`row_error_sums`), in NumPy's order of additions."""

from __future__ import annotations

from typing import Any

import numpy as np

from .kquants_search import QK_K
from .runtime import njit

_OPTS: dict[str, Any] = {"cache": True, "nogil": True, "error_model": "numpy"}


@njit(inline="always", **_OPTS)
def pack_k4(s, j, ls, lm):
    """Q4_K/Q5_K: 6-bit scale ``ls`` and min ``lm`` of sub-block ``j`` into the 12 bytes."""
    if j < 4:
        s[j] = ls & 0xFF
        s[j + 4] = lm & 0xFF
    else:
        s[j + 4] = ((ls & 0xF) | ((lm & 0xF) << 4)) & 0xFF
        s[j - 4] = (np.int32(s[j - 4]) | ((ls >> 4) << 6)) & 0xFF
        s[j] = (np.int32(s[j]) | ((lm >> 4) << 6)) & 0xFF


@njit(inline="always", **_OPTS)
def scale_min_k4(s, j):
    """ggml's ``get_scale_min_k4``: the 6-bit scale and min of sub-block ``j``."""
    if j < 4:
        return np.int32(s[j]) & 63, np.int32(s[j + 4]) & 63
    b = np.int32(s[j + 4])
    sc = (b & 0xF) | ((np.int32(s[j - 4]) >> 6) << 4)
    m = (b >> 4) | ((np.int32(s[j]) >> 6) << 4)
    return sc, m


@njit(inline="always", **_OPTS)
def pack_k3(s, j, lv):
    """Q3_K: the 6-bit scale ``lv`` (0..63) of sub-block ``j`` into the 12 bytes."""
    if j < 8:
        s[j] = lv & 0xF
    else:
        s[j - 8] = (np.int32(s[j - 8]) | ((lv & 0xF) << 4)) & 0xFF
    s[j % 4 + 8] = (np.int32(s[j % 4 + 8]) | ((lv >> 4) << (2 * (j // 4)))) & 0xFF


@njit(inline="always", **_OPTS)
def scale_k3(s, j):
    """Q3_K: the signed scale (-32..31) of sub-block ``j``."""
    lo = (np.int32(s[j]) & 0xF) if j < 8 else (np.int32(s[j - 8]) >> 4)
    return (lo | (((np.int32(s[8 + j % 4]) >> (2 * (j // 4))) & 3) << 4)) - 32


@njit(**_OPTS)
def pack_2bit(L, qs):
    """Q2_K/Q3_K: 2-bit codes, byte ``32 * h + i`` holding values ``128 * h + i + 32 * k``
    in bits ``2k``."""
    for j in range(0, QK_K, 128):
        for lane in range(32):
            i = j + lane
            a = np.int32(L[i])
            b = np.int32(L[i + 32])
            c = np.int32(L[i + 64])
            e = np.int32(L[i + 96])
            qs[j // 4 + lane] = (a | (b << 2) | (c << 4) | (e << 6)) & 0xFF


# The error sums of a GGUF export's SQNR table, per row in NumPy's own order of additions
# (``np.sum`` of a row: ``0.0 +`` its pairwise sum), so that one pass gives the bits of the
# float64 temporaries and reductions it replaces.


def pairwise_program(n: int) -> np.ndarray:
    """The additions of NumPy's ``pairwise_sum`` of ``n`` values, in its order, for
    :func:`pairwise_sum` (a loop, not a recursion: Numba's cache does not keep recursive
    functions): rows ``(0, lo, count)`` sum the leaf ``v[lo:lo + count]``, rows ``(1, 0, 0)``
    add the last two sums. NumPy sums up to 128 values in a leaf and splits more in two
    halves, the first a multiple of 8 values."""
    prog: list[tuple[int, int, int]] = []

    def walk(lo: int, count: int) -> None:
        if count <= 128:
            prog.append((0, lo, count))
            return
        half = count // 2
        half -= half % 8
        walk(lo, half)
        walk(lo + half, count - half)
        prog.append((1, 0, 0))

    walk(0, n)
    return np.array(prog, np.int64).reshape(-1, 3)


@njit(**_OPTS)
def _leaf(v, lo, n):
    # fewer than 8 values in order; else 8 running sums combined as
    # ((0+1)+(2+3))+((4+5)+(6+7)), the tail added after
    if n < 8:
        res = 0.0
        for i in range(lo, lo + n):
            res += v[i]
        return res
    r0, r1, r2, r3 = v[lo], v[lo + 1], v[lo + 2], v[lo + 3]
    r4, r5, r6, r7 = v[lo + 4], v[lo + 5], v[lo + 6], v[lo + 7]
    i = 8
    while i < n - n % 8:
        r0 += v[lo + i]
        r1 += v[lo + i + 1]
        r2 += v[lo + i + 2]
        r3 += v[lo + i + 3]
        r4 += v[lo + i + 4]
        r5 += v[lo + i + 5]
        r6 += v[lo + i + 6]
        r7 += v[lo + i + 7]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        res += v[lo + i]
        i += 1
    return res


@njit(**_OPTS)
def pairwise_sum(v, prog, stack):
    """NumPy's ``pairwise_sum`` of the float64 ``v`` by its :func:`pairwise_program`
    ``prog`` (``stack``: float64 scratch of at least its depth + 1)."""
    sp = 0
    for k in range(prog.shape[0]):
        if prog[k, 0] == 0:
            stack[sp] = _leaf(v, prog[k, 1], prog[k, 2])
            sp += 1
        else:
            sp -= 1
            stack[sp - 1] = stack[sp - 1] + stack[sp]
    return stack[0]


@njit(**_OPTS)
def row_error_sums(x, y, w, prog, out):
    """Per row ``r`` of the source values ``x`` and their GGUF values ``y`` (2-D, float32
    or float64), in float64 with ``a = x``, ``b = y``, ``e = a - b``: ``out[r]`` = the sums
    of a*a, e*e, a*b, b*b, then (importance weights ``w``: ``[rows or 1, columns]``, or
    ``[0, 0]`` for none) of (w*a)*a and (w*e)*e, then max |e|; each sum ``0.0 +`` NumPy's
    pairwise sum of the row's products (``prog``: :func:`pairwise_program` of the columns), as
    ``(a * a).sum(axis=1)`` computes it."""
    rows, cols = x.shape
    weighted = w.shape[0] > 0
    p = np.empty((6, cols), np.float64)
    stack = np.empty(64, np.float64)
    for r in range(rows):
        wr = r if w.shape[0] > 1 else 0
        top = 0.0
        for j in range(cols):
            a = np.float64(x[r, j])
            b = np.float64(y[r, j])
            e = a - b
            p[0, j] = a * a
            p[1, j] = e * e
            p[2, j] = a * b
            p[3, j] = b * b
            top = max(top, abs(e))
        if weighted:
            for j in range(cols):
                a = np.float64(x[r, j])
                e = a - np.float64(y[r, j])
                wa = np.float64(w[wr, j])
                p[4, j] = (wa * a) * a
                p[5, j] = (wa * e) * e
        for k in range(6 if weighted else 4):
            out[r, k] = 0.0 + pairwise_sum(p[k], prog, stack)
        out[r, 6] = top
