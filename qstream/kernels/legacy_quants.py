"""llama.cpp's 32-value block types Q4_0, Q4_1, Q5_0 and Q5_1 as ``ggml_quantize_chunk``
writes them, and Q5_0 / Q5_1 as gguf-py's ``dequantize`` reads them, bit for bit.

Without an importance matrix ggml runs ``quantize_row_q5_0_ref`` / ``quantize_row_q5_1_ref``
(Q5_0: ``d = m / -16`` with ``m`` the value of largest magnitude, codes ``min(31,
(int8)(x / d + 16.5))``; Q5_1: ``d = (max - min) / 31``, codes ``(uint8)((x - min) / d +
0.5)``; Q4_0 / Q4_1 are done by :mod:`qstream.compat.gguf`). With one (``quant_weights``: one
weight per column) it runs ``quantize_row_q{4,5}_{0,1}_impl``: each value weighted by ``qw *
sqrt(sigma2 + x**2)`` (``sigma2``: the row's mean square, summed in column order), the
symmetric types' scale found by ``make_qx_quants`` (``nmax`` 8 / 16), the asymmetric ones'
scale and min by ``make_qkx3_quants`` (``nmax`` 15 / 31, 37 trial scales from ``nmax -
0.9`` in steps of 0.05, squared error). Everything in the C code's float32 order (see
:mod:`.kquants_search`), so the bytes are the same. ``make_qx_quants`` is the K-quants' own
(:func:`.kquants_search.qx_scale`, with ``n`` 32); ``make_qkx3_quants`` too
(:func:`.kquants_search.qkx_scale_min`, as Q4_K's weighted search).

Conversions of a float to a small integer follow what ggml's x86-64 build does: the value
truncated to a 32-bit integer (NaN and out-of-range values give ``-2**31``, as ``cvttss2si``
does), then its low byte. Such values only arise in blocks of float32 subnormals, whose
inverse scale overflows to infinity.

Block layout: ``f16 d`` (``f16 m`` for the ``_1`` types), for the 5-bit types a little-endian
32-bit word of fifth bits (bit ``j``: value ``j``), then 16 bytes of nibbles (byte ``j``:
value ``j`` low, value ``j + 16`` high).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import prange

from .kquants_search import (
    QKX_WORK,
    QX_TRIALS,
    fp16_bits,
    half_at,
    put_half,
    qkx_scale_min,
    qx_scale,
)
from .runtime import njit, parallel_kernel

#: GGML type numbers (``gguf.GGMLQuantizationType``)
Q4_0, Q4_1, Q5_0, Q5_1 = 2, 3, 6, 7
#: bytes per block of 32 values
BLOCK_BYTES = {Q4_0: 18, Q4_1: 20, Q5_0: 22, Q5_1: 24}
QK = 32  # values per block
RUN = 128  # blocks per work item (4096 values)

_F0 = np.float32(0.0)
_F1 = np.float32(1.0)
_M09, _D005, _TENTH = np.float32(-0.9), np.float32(0.05), np.float32(0.1)
_FMAX = np.float32(np.finfo(np.float32).max)  # FLT_MAX
_OPTS: dict[str, Any] = {"cache": True, "nogil": True, "error_model": "numpy"}


@njit(inline="always", **_OPTS)
def _trunc_byte(v):
    """C's ``(int8_t)v`` / ``(uint8_t)v`` on x86-64: truncated to int32 (NaN and values out of
    its range: ``-2**31``), then the low byte (0..255)."""
    if not (v > np.float32(-2147483648.0) and v < np.float32(2147483648.0)):
        return np.int32(0)  # (-2**31: low byte 0)
    return np.int32(np.int64(v)) & np.int32(0xFF)


@njit(inline="always", **_OPTS)
def _store5(ob, at, L):
    """Codes ``L[0:32]`` (0..31) into the fifth-bit word at ``ob[at:at + 4]`` and the
    nibbles after it."""
    qh = np.int64(0)
    for j in range(16):
        a = np.int64(L[j]) & 0xFF
        b = np.int64(L[j + 16]) & 0xFF
        ob[at + 4 + j] = (a & 0x0F) | ((b & 0x0F) << 4)
        qh |= ((a & 0x10) >> 4) << j
        qh |= ((b & 0x10) >> 4) << (j + 16)
    for k in range(4):
        ob[at + k] = (qh >> (8 * k)) & 0xFF


@njit(**_OPTS)
def _q5_0_ref(xb, ob, L):
    """``quantize_row_q5_0_ref`` of one block."""
    amax = _F0
    mx = _F0
    for j in range(QK):
        v = xb[j]
        if amax < np.abs(v):
            amax = np.abs(v)
            mx = v
    d = mx / np.float32(-16.0)
    inv = _F1 / d if d != _F0 else _F0
    put_half(ob, 0, fp16_bits(d))
    for j in range(QK):
        c = np.int32(np.int8(_trunc_byte(xb[j] * inv + np.float32(16.5))))
        L[j] = min(31, c) & 0xFF
    _store5(ob, 2, L)


@njit(**_OPTS)
def _q5_1_ref(xb, ob, L):
    """``quantize_row_q5_1_ref`` of one block."""
    mn = _FMAX
    mx = -_FMAX
    for j in range(QK):
        v = xb[j]
        if v < mn:
            mn = v
        if v > mx:
            mx = v
    d = (mx - mn) / np.float32(31.0)
    inv = _F1 / d if d != _F0 else _F0
    put_half(ob, 0, fp16_bits(d))
    put_half(ob, 2, fp16_bits(mn))
    for j in range(QK):
        L[j] = _trunc_byte((xb[j] - mn) * inv + np.float32(0.5))
    _store5(ob, 4, L)


@njit(**_OPTS)
def _weighted_block(xb, wb, sigma2, kind, ob, L8, L, kwork, wts, work):
    """``quantize_row_<kind>_impl``'s work on one block: weights ``wb * sqrt(sigma2 + x**2)``,
    then the type's weighted scale search."""
    for j in range(QK):
        wts[j] = wb[j] * np.sqrt(sigma2 + xb[j] * xb[j])
    if kind in (Q4_0, Q5_0):
        d = qx_scale(np.int64(QK), 8 if kind == Q4_0 else 16, xb, L8, wts, work)
        put_half(ob, 0, fp16_bits(d))
        if kind == Q4_0:
            for j in range(16):
                ob[2 + j] = (np.int32(L8[j]) | (np.int32(L8[j + 16]) << 4)) & 0xFF
        else:
            _store5(ob, 2, L8)
        return
    nmax = 15 if kind == Q4_1 else 31
    scale, the_min = qkx_scale_min(np.int64(QK), nmax, xb, wts, L, kwork, np.float32(-0.9),
                                   np.float32(0.05), np.int64(36), np.bool_(False),
                                   np.bool_(True))  # fmt: skip
    put_half(ob, 0, fp16_bits(scale))
    put_half(ob, 2, fp16_bits(-the_min))
    if kind == Q4_1:
        for j in range(16):
            ob[4 + j] = (np.int32(L[j]) | (np.int32(L[j + 16]) << 4)) & 0xFF
    else:
        _store5(ob, 4, L)


@parallel_kernel(inputs=1)
def quantize_blocks(x, kind, out):
    """``quantize_row_q5_0_ref`` / ``quantize_row_q5_1_ref`` (``kind`` 6 / 7) of the flat
    float32 ``x`` (whole blocks of 32) into ``out`` (uint8, 22 / 24 bytes a block)."""
    nblocks = x.size // QK
    size = out.size // max(nblocks, 1)
    for part in prange((nblocks + RUN - 1) // RUN):
        L = np.zeros(QK, np.int32)
        for b in range(part * RUN, min(nblocks, part * RUN + RUN)):
            xb = x[b * QK : b * QK + QK]
            ob = out[b * size : b * size + size]
            if kind == Q5_0:
                _q5_0_ref(xb, ob, L)
            else:
                _q5_1_ref(xb, ob, L)


@parallel_kernel(inputs=2)
def quantize_rows_weighted(x, qw, n, kind, out):
    """``quantize_q{4,5}_{0,1}`` with ``quant_weights`` ``qw`` (one per column, ``n``
    columns): the flat float32 rows ``x`` (``n`` values each, whole blocks of 32) into
    ``out``; ``kind`` a GGML type number (2, 3, 6, 7). One row a work item (``sigma2`` is
    the row's)."""
    rows = x.size // n
    per_row = n // QK
    size = out.size // max(rows * per_row, 1)
    for r in prange(rows):
        L8 = np.zeros(QK, np.int8)
        L = np.zeros(QK, np.uint8)
        kwork = np.empty(QKX_WORK, np.float32)
        wts = np.zeros(QK, np.float32)
        work = np.empty((QK + 3) * QX_TRIALS, np.float32)
        xr = x[r * n : r * n + n]
        sum_x2 = _F0
        for j in range(n):
            sum_x2 += xr[j] * xr[j]
        sigma2 = sum_x2 / np.float32(n)
        for ib in range(per_row):
            b = r * per_row + ib
            ob = out[b * size : b * size + size]
            xb = xr[ib * QK : ib * QK + QK]
            wb = qw[ib * QK : ib * QK + QK]
            _weighted_block(xb, wb, sigma2, kind, ob, L8, L, kwork, wts, work)


# (a value is decoded in a few instructions: threads pay off for tens of MiB only, and a
# thread that a busy machine has descheduled costs a call far more than the work)
@parallel_kernel(serial_scale=64, inputs=1)
def dequantize_blocks(raw, kind, out):
    """Q5_0 / Q5_1 (``kind`` 6 / 7) blocks ``raw`` (flat uint8) into the float32 ``out``, in
    gguf-py's order: ``d * (q - 16)`` / ``d * q + m``."""
    nblocks = out.size // QK
    size = raw.size // max(nblocks, 1)
    at = 2 if kind == Q5_0 else 4
    for part in prange((nblocks + RUN - 1) // RUN):
        for b in range(part * RUN, min(nblocks, part * RUN + RUN)):
            rb = raw[b * size : b * size + size]
            d = half_at(rb, 0)
            m = half_at(rb, 2) if kind == Q5_1 else _F0
            qh = np.int64(0)
            for k in range(4):
                qh |= np.int64(rb[at + k]) << (8 * k)
            for j in range(QK):
                q = (np.int32(rb[at + 4 + j % 16]) >> (4 * (j // 16))) & 0x0F
                q |= np.int32((qh >> j) & 1) << 4
                if kind == Q5_0:
                    out[b * QK + j] = d * np.float32(q - 16)
                else:
                    out[b * QK + j] = d * np.float32(q) + m
