"""Group-wise (blocked) dynamic quantization fused into one pass: per parameter block, the
exact finite range, the scale and zero point, and the quantized values.

The arithmetic is the same, operation for operation, as the unfused path: ``slot_ranges``
(finite min/max by integer order keys), ``params_from_range`` (float64, scale rounded to
float32, ``rint`` zero point) and the ``half_to_even`` quantize kernel (float32 ``rint(x /
s) + z``, saturated to ``[lo, hi]``, masked), so the results are bit-identical to it.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..qtypes import TINY_SCALE
from .bits import KEY32_MAX, KEY32_MIN, bits32, from_bits32, from_order_key32
from .runtime import parallel_kernel
from .stats import slot_range_keys32

SYM_SIGNED, SYM_UNSIGNED, ASYM = 0, 1, 2
PARTS = 256  # runs of work items per call: enough to balance two to a few dozen threads


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


@parallel_kernel
def dynamic_blocked_half_to_even(
    x,
    cblock,
    iblock,
    mode,
    qmin,
    qmax,
    steps,
    zp_sym,
    lo,
    hi,
    mask,
    half,
    scale,
    zero_point,
    out,
    nonfinite,
):
    """``x`` float32 ``[O, C, I]``; parameter block ``(o, c // cblock, i // iblock)`` of
    ``scale`` / ``zero_point`` (float32; zero points are integers of at most 16 bits) ``[O,
    Cp, Ip]``; ``mode`` (``SYM_SIGNED``: ``absmax / steps``, zero point 0; ``SYM_UNSIGNED``:
    ``absmax / steps``, zero point ``zp_sym``; ``ASYM``: ``(hi - lo) / (qmax - qmin)``, zero
    point ``rint(qmin - lo / s)`` clipped; a scale is never below ``TINY_SCALE``);
    ``lo``/``hi`` float32 saturation bounds; ``half``: scales rounded to float16 values
    (:func:`half_scale`) before the zero point and the values; ``out`` the integer container;
    ``nonfinite[O * Cp]``: per row of parameter blocks, how many pieces of it held a NaN or an
    infinity (the caller applies its NaN policy to them)."""
    n_outer, n_c, n_inner = x.shape
    n_cp = scale.shape[1]
    n_ip = scale.shape[2]
    n_work = n_outer * n_cp  # a work item: a row of parameter blocks
    parts = min(n_work, PARTS)
    for p in prange(parts):  # contiguous runs of work items, scratch allocated once per run
        kmin = np.empty(n_ip, np.int32)
        kmax = np.empty(n_ip, np.int32)
        for w in range(p * n_work // parts, (p + 1) * n_work // parts):
            o = w // n_cp
            pc = w - o * n_cp
            c0 = pc * cblock
            c1 = min(n_c, c0 + cblock)
            kmin[:] = KEY32_MAX
            kmax[:] = KEY32_MIN
            nonfinite[w] = slot_range_keys32(x, o, c0, c1, iblock, kmin, kmax)
            ss = scale[o, pc]
            zs = zero_point[o, pc]
            for pi in range(n_ip):
                empty = kmin[pi] == KEY32_MAX and kmax[pi] == KEY32_MIN
                vlo = 0.0 if empty else min(np.float64(from_order_key32(kmin[pi])), 0.0)
                vhi = 0.0 if empty else max(np.float64(from_order_key32(kmax[pi])), 0.0)
                if mode == ASYM:
                    span = vhi - vlo
                    s32 = np.float32(span / (qmax - qmin)) if span > 0 else np.float32(1.0)
                    s32 = half_scale(s32) if half else max(s32, TINY_SCALE)
                    z = min(max(np.rint(qmin - vlo / np.float64(s32)), qmin), qmax)
                else:
                    amax = max(-vlo, vhi)
                    s32 = np.float32(amax / steps) if amax > 0 else np.float32(1.0)
                    s32 = half_scale(s32) if half else max(s32, TINY_SCALE)
                    z = 0.0 if mode == SYM_SIGNED else zp_sym
                ss[pi] = s32
                zs[pi] = np.float32(z)
            for c in range(c0, c1):
                xr = x[o, c]
                orow = out[o, c]
                for pi in range(n_ip):
                    s = ss[pi]
                    z = zs[pi]
                    i0 = pi * iblock
                    i1 = min(n_inner, i0 + iblock)
                    xb = xr[i0:i1]
                    ob = orow[i0:i1]
                    for j in range(i1 - i0):
                        ob[j] = np.int32(min(max(lo, np.rint(xb[j] / s) + z), hi)) & mask


@parallel_kernel
def float16_bits(s, out):
    """The float16 bit patterns (``uint16``) of float32 values that are float16 values already
    (:func:`half_scale`'s results, positive): exponent re-biased and mantissa shortened, or
    for float16 subnormals the multiple of 2**-24; no rounding happens."""
    for i in prange(s.size):
        v = s[i]
        if v >= np.float32(2.0**-14):
            b = bits32(v)
            e = ((b >> np.int32(23)) & np.int32(0xFF)) - np.int32(112)  # 127 - 15
            out[i] = np.uint16((e << np.int32(10)) | ((b >> np.int32(13)) & np.int32(0x3FF)))
        else:
            out[i] = np.uint16(np.int32(v * np.float32(2.0**24)))
