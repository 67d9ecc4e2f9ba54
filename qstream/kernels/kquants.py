"""llama.cpp's K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K): quantize and dequantize kernels, bit
for bit the bytes of ``ggml_quantize_chunk`` and the values of gguf-py's ``dequantize``.

Super-blocks of 256 values, one after another along each row. Without an importance matrix
ggml runs its ``quantize_row_*_K_ref`` functions (scales found with ``make_qkx2_quants``,
``make_q3_quants``, ``make_qx_quants``, then the largest scale sets the super-block scale);
with one (``quant_weights``: one weight per column) it runs ``quantize_row_*_K_impl`` (weights
``w * sqrt(sigma2 + x**2)``, ``make_qkx3_quants``, and the sub-block scales themselves
quantized by ``make_qp_quants`` / ``make_qx_quants``). Both paths are here, in the C code's
float32 order (see :mod:`.kquants_search`).

Kernels work on flat arrays: ``x`` the rows one after another (float32), ``out`` their
blocks (uint8); super-block ``b`` reads the importance weights of columns ``(b % per_row) *
256`` onwards. Work is split into runs of :data:`RUN` super-blocks, in parallel.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import prange

from .kquants_layout import pack_2bit, pack_k3, pack_k4, scale_k3, scale_min_k4
from .kquants_layout import pairwise_program as pairwise_program  # (the SQNR sums of exports)
from .kquants_layout import row_error_sums as row_error_sums
from .kquants_search import (
    GROUP_MAX_EPS,
    QK_K,
    QKX_WORK,
    QX_WORK,
    fp16_bits,
    fp16_value,
    half_at,
    nearest_int,
    put_half,
    q3_scale,
    qkx_scale_min,
    qp_scale,
    qx_scale,
)
from .runtime import njit, parallel_kernel

#: GGML type numbers of the K-quants (``gguf.GGMLQuantizationType``)
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K = 10, 11, 12, 13, 14
#: bytes per super-block of 256 values
BLOCK_BYTES = {Q2_K: 84, Q3_K: 110, Q4_K: 144, Q5_K: 176, Q6_K: 210}
RUN = 16  # super-blocks per work item (4096 values)

_F0 = np.float32(0.0)
_F1 = np.float32(1.0)
# the trial-scale parameters (rmin, rdelta) of the scale searches
_M1, _M09, _M05, _D01, _D005 = (np.float32(v) for v in (-1.0, -0.9, -0.5, 0.1, 0.05))
_OPTS: dict[str, Any] = {"cache": True, "nogil": True, "error_model": "numpy"}
# Sizes and flags reach the scale searches as typed values (``np.int64(16)``, ``np.bool_(True)``),
# not literals: Numba compiles a function called with literal arguments once per distinct
# value (``qkx_scale_min`` six times in this kernel, which then took 26 s to compile; 16 s so,
# as fast to run: ``benchmarks/README.md``).


@njit(**_OPTS)
def _sum_squares(x):
    s = _F0
    for i in range(QK_K):
        s += x[i] * x[i]
    return s


@njit(**_OPTS)
def _q2_k(x, qw, has_w, out, L, kwork, wts, scales, mins, sw, Ls, Lm):
    """One Q2_K super-block (84 bytes: 16 scale/min bytes, 64 code bytes, d, dmin)."""
    sb = out[0:16]
    if not has_w:
        mx_s = _F0
        mx_m = _F0
        for j in range(16):
            xs = x[16 * j : 16 * j + 16]
            for i in range(16):
                wts[i] = np.abs(xs[i])
            sc, mn = qkx_scale_min(np.int64(16), np.int64(3), xs, wts, L[16 * j :], kwork,
                                   np.float32(-0.5), np.float32(0.1), np.int64(15), np.bool_(True),
                                   np.bool_(False))  # fmt: skip
            scales[j] = sc
            mins[j] = mn
            if sc > mx_s:
                mx_s = sc
            if mn > mx_m:
                mx_m = mn
        dbits = np.int32(0)
        mbits = np.int32(0)
        for j in range(16):
            sb[j] = 0
        if mx_s > _F0:
            inv = np.float32(15.0) / mx_s
            for j in range(16):
                sb[j] = nearest_int(inv * scales[j]) & 0xFF
            dbits = fp16_bits(mx_s / np.float32(15.0))
        if mx_m > _F0:
            inv = np.float32(15.0) / mx_m
            for j in range(16):
                sb[j] = (np.int32(sb[j]) | (nearest_int(inv * mins[j]) << 4)) & 0xFF
            mbits = fp16_bits(mx_m / np.float32(15.0))
    else:
        sigma2 = _sum_squares(x) / np.float32(QK_K)
        for j in range(16):
            xs = x[16 * j : 16 * j + 16]
            total = _F0
            for i in range(16):
                wts[i] = qw[16 * j + i] * np.sqrt(sigma2 + xs[i] * xs[i])
                total += wts[i]
            sw[j] = total
            sc, mn = qkx_scale_min(np.int64(16), np.int64(3), xs, wts, L[16 * j :], kwork,
                                   np.float32(-0.9), np.float32(0.05), np.int64(36),
                                   np.bool_(False), np.bool_(True))  # fmt: skip
            scales[j] = sc
            mins[j] = mn
        dbits = fp16_bits(qp_scale(np.int64(16), np.int64(15), scales, Ls, sw))
        mbits = fp16_bits(qp_scale(np.int64(16), np.int64(15), mins, Lm, sw))
        for j in range(16):
            sb[j] = (np.int32(Ls[j]) | (np.int32(Lm[j]) << 4)) & 0xFF
    put_half(out, 80, dbits)
    put_half(out, 82, mbits)
    df = fp16_value(dbits)
    mf = fp16_value(mbits)
    for j in range(16):
        d = df * np.float32(np.int32(sb[j]) & 0xF)
        if d == _F0:
            continue
        dm = mf * np.float32(np.int32(sb[j]) >> 4)
        for i in range(16):
            L[16 * j + i] = min(max(nearest_int((x[16 * j + i] + dm) / d), 0), 3)
    pack_2bit(L, out[16:80])


@njit(**_OPTS)
def _q3_k(x, qw, has_w, out, L8, wts, scales, sw, Ls8, work):
    """One Q3_K super-block (110 bytes: high-bit mask, 2-bit codes, 12 scale bytes, d)."""
    s = out[96:108]
    for j in range(12):
        s[j] = 0
    if not has_w:
        mx_s = _F0
        amax = _F0
        for j in range(16):
            scales[j] = q3_scale(np.int64(16), np.int64(4), x[16 * j : 16 * j + 16], L8[16 * j :])
            a = np.abs(scales[j])
            if a > amax:
                amax = a
                mx_s = scales[j]
        dbits = np.int32(0)
        if mx_s != _F0:
            iscale = np.float32(-32.0) / mx_s
            for j in range(16):
                lv = np.int32(np.int8(nearest_int(iscale * scales[j]) & 0xFF))
                pack_k3(s, j, min(max(lv, -32), 31) + 32)
            dbits = fp16_bits(_F1 / iscale)
    else:
        sigma2 = np.float32(2.0) * _sum_squares(x) / np.float32(QK_K)
        for j in range(16):
            xs = x[16 * j : 16 * j + 16]
            total = _F0
            for i in range(16):
                wts[i] = qw[16 * j + i] * np.sqrt(sigma2 + xs[i] * xs[i])
            for i in range(16):
                total += wts[i]
            sw[j] = total
            scales[j] = qx_scale(np.int64(16), np.int64(4), xs, L8[16 * j :], wts, work)
        d_block = qx_scale(np.int64(16), np.int64(32), scales, Ls8, sw, work)
        for j in range(16):
            pack_k3(s, j, np.int32(Ls8[j]))
        dbits = fp16_bits(d_block)
    put_half(out, 108, dbits)
    df = fp16_value(dbits)
    for j in range(16):
        d = df * np.float32(scale_k3(s, j))
        if d == _F0:
            continue
        for i in range(16):
            L8[16 * j + i] = min(max(nearest_int(x[16 * j + i] / d), -4), 3) + 4
    hmask = out[0:32]
    for j in range(32):
        hmask[j] = 0
    for j in range(QK_K):
        if L8[j] > 3:
            hmask[j % 32] = np.int32(hmask[j % 32]) | (np.int32(1) << (j // 32))
            L8[j] -= 4
    pack_2bit(L8, out[32:96])


@njit(**_OPTS)
def _q45_k(x, qw, has_w, out, nmax, L, kwork, wts, scales, mins, sw, Ls, Lm):
    """One Q4_K (``nmax`` 15, 144 bytes) or Q5_K (``nmax`` 31, 176 bytes) super-block: d,
    dmin, 12 scale/min bytes, then (Q5_K) the high bits and the 4-bit codes."""
    s = out[4:16]
    for j in range(12):
        s[j] = 0
    if not has_w:
        rmin, nstep = (_M1, 20) if nmax == 15 else (_M05, 15)
        mx_s = _F0
        mx_m = _F0
        for j in range(8):
            xs = x[32 * j : 32 * j + 32]
            sum_x2 = _F0
            for i in range(32):
                sum_x2 += xs[i] * xs[i]
            av_x = np.sqrt(sum_x2 / np.float32(32.0))
            for i in range(32):
                wts[i] = av_x + np.abs(xs[i])
            sc, mn = qkx_scale_min(np.int64(32), nmax, xs, wts, L[32 * j :], kwork, rmin, _D01,
                                   nstep, np.bool_(False), np.bool_(False))  # fmt: skip
            scales[j] = sc
            mins[j] = mn
            if sc > mx_s:
                mx_s = sc
            if mn > mx_m:
                mx_m = mn
        inv_s = np.float32(63.0) / mx_s if mx_s > _F0 else _F0
        inv_m = np.float32(63.0) / mx_m if mx_m > _F0 else _F0
        for j in range(8):
            ls = min(63, nearest_int(inv_s * scales[j]) & 0xFF)
            lm = min(63, nearest_int(inv_m * mins[j]) & 0xFF)
            pack_k4(s, j, ls, lm)
        dbits = fp16_bits(mx_s / np.float32(63.0))
        mbits = fp16_bits(mx_m / np.float32(63.0))
    else:
        sigma2 = np.float32(2.0) * _sum_squares(x) / np.float32(QK_K)
        for j in range(8):
            xs = x[32 * j : 32 * j + 32]
            total = _F0
            for i in range(32):
                wts[i] = qw[32 * j + i] * np.sqrt(sigma2 + xs[i] * xs[i])
            for i in range(32):
                total += wts[i]
            sw[j] = total
            sc, mn = qkx_scale_min(np.int64(32), nmax, xs, wts, L[32 * j :], kwork, _M09, _D005,
                                   np.int64(36), np.bool_(False), np.bool_(True))  # fmt: skip
            scales[j] = sc
            mins[j] = mn
        d_block = qp_scale(np.int64(8), np.int64(63), scales, Ls, sw)
        m_block = qp_scale(np.int64(8), np.int64(63), mins, Lm, sw)
        for j in range(8):
            ls = np.int32(Ls[j])
            lm = np.int32(Lm[j])
            if nmax == 31:
                ls = min(63, ls)
                lm = min(63, lm)
            pack_k4(s, j, ls, lm)
        dbits = fp16_bits(d_block)
        mbits = fp16_bits(m_block)
    put_half(out, 0, dbits)
    put_half(out, 2, mbits)
    df = fp16_value(dbits)
    mf = fp16_value(mbits)
    for j in range(8):
        sc, m = scale_min_k4(s, j)
        d = df * np.float32(sc)
        if d == _F0:
            continue
        dm = mf * np.float32(m)
        for i in range(32):
            L[32 * j + i] = min(max(nearest_int((x[32 * j + i] + dm) / d), 0), nmax)
    if nmax == 15:
        qs = out[16:144]
        for j in range(0, QK_K, 64):
            for i in range(32):
                qs[j // 2 + i] = np.int32(L[j + i]) | (np.int32(L[j + i + 32]) << 4)
    else:
        qh = out[16:48]
        qs = out[48:176]
        for i in range(32):
            qh[i] = 0
        for j in range(0, QK_K, 64):
            bit = j // 32
            for i in range(32):
                lo = np.int32(L[j + i])
                hi = np.int32(L[j + i + 32])
                if lo > 15:
                    lo -= 16
                    qh[i] = np.int32(qh[i]) | (np.int32(1) << bit)
                if hi > 15:
                    hi -= 16
                    qh[i] = np.int32(qh[i]) | (np.int32(2) << bit)
                qs[j // 2 + i] = lo | (hi << 4)


@njit(**_OPTS)
def _q6_k(x, qw, has_w, out, L8, wts, scales, work):
    """One Q6_K super-block (210 bytes: low 4 bits, high 2 bits, 16 int8 scales, d)."""
    mx_s = _F0
    amax = _F0
    for j in range(16):
        xs = x[16 * j : 16 * j + 16]
        if has_w:
            sc = qx_scale(np.int64(16), np.int64(32), xs, L8[16 * j :], qw[16 * j :], work)
        else:
            for i in range(16):
                wts[i] = xs[i] * xs[i]
            sc = qx_scale(np.int64(16), np.int64(32), xs, L8[16 * j :], wts, work)
        scales[j] = sc
        if np.abs(sc) > amax:
            amax = np.abs(sc)
            mx_s = sc
    if amax < GROUP_MAX_EPS:
        for i in range(210):
            out[i] = 0
        return
    iscale = np.float32(-128.0) / mx_s
    dbits = fp16_bits(_F1 / iscale)
    put_half(out, 208, dbits)
    df = fp16_value(dbits)
    for j in range(16):
        out[192 + j] = min(127, nearest_int(iscale * scales[j])) & 0xFF
    for j in range(16):
        d = df * np.float32(np.int8(out[192 + j]))
        if d == _F0:
            continue
        for i in range(16):
            L8[16 * j + i] = min(max(nearest_int(x[16 * j + i] / d), -32), 31) + 32
    for j in range(0, QK_K, 128):
        for i in range(32):
            a = np.int32(L8[j + i])
            b = np.int32(L8[j + i + 32])
            c = np.int32(L8[j + i + 64])
            e = np.int32(L8[j + i + 96])
            out[j // 2 + i] = (a & 0xF) | ((c & 0xF) << 4)
            out[j // 2 + i + 32] = (b & 0xF) | ((e & 0xF) << 4)
            out[128 + j // 4 + i] = (a >> 4) | ((b >> 4) << 2) | ((c >> 4) << 4) | ((e >> 4) << 6)


@parallel_kernel(inputs=2)
def quantize_blocks(x, qw, has_w, per_row, kind, out):
    """Quantize the flat float32 ``x`` (whole super-blocks) into ``out`` (uint8, the type's
    bytes per super-block): ``kind`` a GGML type number (10..14), ``qw`` the importance weight
    of each of the ``per_row * 256`` columns when ``has_w``."""
    nblocks = x.size // QK_K
    size = out.size // max(nblocks, 1)
    for part in prange((nblocks + RUN - 1) // RUN):
        L = np.zeros(QK_K, np.uint8)
        L8 = np.zeros(QK_K, np.int8)
        kwork = np.zeros(QKX_WORK, np.float32)
        wts = np.zeros(32, np.float32)
        scales = np.zeros(16, np.float32)
        mins = np.zeros(16, np.float32)
        sw = np.zeros(16, np.float32)
        Ls = np.zeros(16, np.uint8)
        Lm = np.zeros(16, np.uint8)
        Ls8 = np.zeros(16, np.int8)
        work = np.zeros(QX_WORK, np.float32)
        for b in range(part * RUN, min(nblocks, part * RUN + RUN)):
            xb = x[b * QK_K : b * QK_K + QK_K]
            col = (b % per_row) * QK_K
            wb = qw[col : col + QK_K] if has_w else qw[0:0]
            ob = out[b * size : b * size + size]
            if kind == Q2_K:
                _q2_k(xb, wb, has_w, ob, L, kwork, wts, scales, mins, sw, Ls, Lm)
            elif kind == Q3_K:
                _q3_k(xb, wb, has_w, ob, L8, wts, scales, sw, Ls8, work)
            elif kind == Q4_K:
                _q45_k(xb, wb, has_w, ob, np.int64(15), L, kwork, wts, scales, mins, sw, Ls, Lm)
            elif kind == Q5_K:
                _q45_k(xb, wb, has_w, ob, np.int64(31), L, kwork, wts, scales, mins, sw, Ls, Lm)
            else:
                _q6_k(xb, wb, has_w, ob, L8, wts, scales, work)


# The dequantize kernels: one sub-block at a time, its scale (and min) multiplied out once,
# then each value ``(d * scale) * q - dmin * min`` (gguf-py's order) from its bits.


@njit(**_OPTS)
def _dq2_k(raw, y):
    df = half_at(raw, 80)
    mf = half_at(raw, 82)
    for j in range(16):  # values 16j.. are bits 2*shift of bytes 16 + 32 * half + lane
        sc = np.int32(raw[j])
        d = df * np.float32(sc & 0xF)
        m = mf * np.float32(sc >> 4)
        src = 16 + 32 * (j >> 3) + 16 * (j & 1)
        shift = 2 * ((j & 7) >> 1)
        for i in range(16):
            q = (np.int32(raw[src + i]) >> shift) & 3
            y[16 * j + i] = d * np.float32(q) - m


@njit(**_OPTS)
def _dq3_k(raw, y):
    df = half_at(raw, 108)
    s = raw[96:108]
    for j in range(16):
        d = df * np.float32(scale_k3(s, j))
        half = j >> 3
        shift = (j & 7) >> 1
        lane0 = 16 * (j & 1)
        for i in range(16):
            lane = lane0 + i
            lo = (np.int32(raw[32 + 32 * half + lane]) >> (2 * shift)) & 3
            hi = (np.int32(raw[lane]) >> (4 * half + shift)) & 1
            y[16 * j + i] = d * np.float32(lo - 4 * (1 - hi))


@njit(**_OPTS)
def _dq45_k(raw, y, five):
    df = half_at(raw, 0)
    mf = half_at(raw, 2)
    s = raw[4:16]
    base = 48 if five else 16
    for sub in range(8):
        sc, m = scale_min_k4(s, sub)
        d = df * np.float32(sc)
        dm = mf * np.float32(m)
        src = base + 32 * (sub // 2)
        shift = 4 * (sub % 2)
        for lane in range(32):
            q = (np.int32(raw[src + lane]) >> shift) & 0xF
            if five:
                q |= ((np.int32(raw[16 + lane]) >> sub) & 1) << 4
            y[32 * sub + lane] = d * np.float32(q) - dm


@njit(**_OPTS)
def _dq6_k(raw, y):
    df = half_at(raw, 208)
    for j in range(16):
        d = df * np.float32(np.int8(raw[192 + j]))
        half = j >> 3
        k = (j & 7) >> 1
        lane0 = 16 * (j & 1)
        for i in range(16):
            lane = lane0 + i
            lo = (np.int32(raw[64 * half + 32 * (k % 2) + lane]) >> (4 * (k // 2))) & 0xF
            hi = (np.int32(raw[128 + 32 * half + lane]) >> (2 * k)) & 3
            y[16 * j + i] = d * np.float32((lo | (hi << 4)) - 32)


# (a value is decoded in a few instructions: threads pay off for tens of MiB only, and a
# thread that a busy machine has descheduled costs a call far more than the work)
@parallel_kernel(serial_scale=64, inputs=1)
def dequantize_blocks(raw, kind, out):
    """Dequantize the flat uint8 super-blocks ``raw`` of GGML type ``kind`` (10..14) into the
    float32 ``out`` (256 values each), in gguf-py's ``dequantize`` order of operations."""
    nblocks = out.size // QK_K
    size = raw.size // max(nblocks, 1)
    for part in prange((nblocks + RUN - 1) // RUN):
        for b in range(part * RUN, min(nblocks, part * RUN + RUN)):
            rb = raw[b * size : b * size + size]
            yb = out[b * QK_K : b * QK_K + QK_K]
            if kind == Q2_K:
                _dq2_k(rb, yb)
            elif kind == Q3_K:
                _dq3_k(rb, yb)
            elif kind == Q4_K:
                _dq45_k(rb, yb, False)
            elif kind == Q5_K:
                _dq45_k(rb, yb, True)
            else:
                _dq6_k(rb, yb)
