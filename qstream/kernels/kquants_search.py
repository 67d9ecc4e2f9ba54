"""The scale searches behind llama.cpp's K-quants, in ggml's float32 operation order.

Every function here follows the C reference (``ggml-quants.c``) operation for operation:
float32 throughout (Python literals and integers are converted to ``np.float32`` before they
meet a float, so nothing is promoted to float64), sums accumulated in the C loop order, no
fast-math (so LLVM neither reassociates sums nor fuses multiply-adds, just as ggml-base is
built without FMA contraction), and integers narrowed to 8 bits the way C's conversions wrap.
The results are therefore the same bits as ``ggml_quantize_chunk``'s.

- :func:`nearest_int`: ggml's rounding by the 1.5 * 2**23 magic number (ties to even for
  ``|v| < 2**22``, and its exact bit-pattern result beyond that and for inf/NaN).
- :func:`fp16_bits` / :func:`fp16_value`: float32 <-> IEEE half, rounding to nearest even
  (``GGML_FP32_TO_FP16``; overflow to inf, NaN to 0x7E00).
- :func:`qx_scale`: ``make_qx_quants`` with ``rmse_type`` 1 (symmetric, 19 trial scales).
- :func:`q3_scale`: ``make_q3_quants`` with ``do_rmse`` (symmetric, coordinate descent).
- :func:`qkx_scale_min`: ``make_qkx2_quants`` / ``make_qkx3_quants`` (asymmetric scale and
  min by weighted least squares over trial scales).
- :func:`qp_scale`: ``make_qp_quants`` (non-negative values, e.g. the sub-block scales).

The packed layouts of the blocks are in :mod:`.kquants_layout`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .bits import bits32, from_bits32
from .runtime import njit

#: ggml's GROUP_MAX_EPS: a group whose largest magnitude is below it is all zero
QK_K = 256  # values per super-block
GROUP_MAX_EPS = np.float32(1e-15)
_MAGIC = np.float32(12582912.0)  # 1.5 * 2**23
_F0 = np.float32(0.0)
_F1 = np.float32(1.0)
_TENTH = np.float32(0.1)

_OPTS: dict[str, Any] = {"cache": True, "nogil": True, "error_model": "numpy"}


@njit(inline="always", **_OPTS)
def nearest_int(v):
    """ggml's ``nearest_int``: the low 23 bits of ``v + 1.5 * 2**23``, less 2**22."""
    b = bits32(np.float32(v + _MAGIC))
    return np.int32((b & np.int32(0x007FFFFF)) - np.int32(0x00400000))


@njit(inline="always", **_OPTS)
def fp16_bits(v):
    """The float16 bit pattern (uint16 as int32) nearest the float32 ``v``, ties to even."""
    b = np.int64(bits32(v)) & np.int64(0xFFFFFFFF)
    sign = np.int32((b >> 16) & 0x8000)
    e = np.int32((b >> 23) & 0xFF)
    m = np.int32(b & 0x7FFFFF)
    if e == 255:  # inf, NaN
        return sign | (np.int32(0x7E00) if m else np.int32(0x7C00))
    if e >= 113:  # a normal half (or overflow): keep 10 of 23 mantissa bits
        h = ((e - np.int32(112)) << 10) | (m >> 13)
        rest = m & np.int32(0x1FFF)
        if rest > 0x1000 or (rest == 0x1000 and (h & 1)):
            h += 1  # a carry into the exponent is right, up to inf
        if h >= 0x7C00:
            h = np.int32(0x7C00)
        return sign | h
    s = np.int32(126) - e  # a subnormal half: units of 2**-24
    if s > 24 or e == 0:
        return sign
    full = m | np.int32(0x800000)
    h = full >> s
    rest = full & ((np.int32(1) << s) - 1)
    half = np.int32(1) << (s - 1)
    if rest > half or (rest == half and (h & 1)):
        h += 1
    return sign | h


@njit(inline="always", **_OPTS)
def fp16_value(h):
    """The float32 value of the float16 bit pattern ``h`` (exact)."""
    h = np.int32(h) & np.int32(0xFFFF)
    sign = (h & np.int32(0x8000)) << 16
    e = (h >> 10) & np.int32(0x1F)
    m = h & np.int32(0x3FF)
    if e == 0:
        v = np.float32(m) * np.float32(2.0**-24)
        return -v if sign else v
    if e == 31:
        return from_bits32(sign | np.int32(0x7F800000) | (m << 13))
    return from_bits32(sign | ((e + np.int32(112)) << 23) | (m << 13))


#: make_qx_quants' 19 trial scales (the first guess, then steps -9..-1, 1..9), padded to whole
#: vectors: :func:`qx_scale` evaluates them side by side
QX_TRIALS = 24
#: the float32 scratch :func:`qx_scale` needs for 16 values
QX_WORK = (16 + 3) * QX_TRIALS


@njit(**_OPTS)
def qx_scale(n, nmax, x, L, w, work):
    """``make_qx_quants(n, nmax, x, L, 1, qw)``: codes ``L`` (0..2*nmax-1, int8) and the scale
    for the weights ``w`` (ggml's weights without ``qw`` are ``x * x``: pass those).
    ``work``: float32 scratch of ``(n + 3) * QX_TRIALS`` values.

    The C code tries its 19 inverse scales one after another; here each trial's sums are
    accumulated in a lane of their own (the lanes side by side, so the loop vectorises), every
    lane adding its terms in the C order, so each trial's sums are the C's bits; the choice
    among them is then made in the C order."""
    mx = _F0
    amax = _F0
    for i in range(n):
        ax = np.abs(x[i])
        if ax > amax:
            amax = ax
            mx = x[i]
    if amax < GROUP_MAX_EPS:
        for i in range(n):
            L[i] = 0
        return _F0
    T = QX_TRIALS
    inv = work[0:T]
    sx = work[T : 2 * T]
    s2 = work[2 * T : 3 * T]
    codes = work[3 * T : 3 * T + n * T]
    fmax = np.float32(nmax)
    inv[0] = np.float32(-nmax) / mx
    for t in range(1, 19):
        step = t - 10 if t < 10 else t - 9  # trials 1..18 are C's is = -9..-1, 1..9
        inv[t] = -(fmax + _TENTH * np.float32(step)) / mx
    for t in range(19, T):
        inv[t] = _F0
    for t in range(T):
        sx[t] = _F0
        s2[t] = _F0
    lo = np.int32(-nmax)
    hi = np.int32(nmax - 1)
    for i in range(n):
        xi = x[i]
        wi = w[i]
        wx = wi * xi
        row = codes[i * T : i * T + T]
        for t in range(T):
            fl = np.float32(min(max(nearest_int(inv[t] * xi), lo), hi))
            row[t] = fl
            sx[t] += wx * fl
            s2[t] += wi * fl * fl
    sumlx = sx[0]
    suml2 = s2[0]
    scale = sumlx / suml2 if suml2 != _F0 else _F0
    best = scale * sumlx
    pick = 0
    for t in range(1, 19):
        if s2[t] > _F0 and sx[t] * sx[t] > best * s2[t]:
            pick = t
            scale = sx[t] / s2[t]
            best = scale * sx[t]
    for i in range(n):
        L[i] = np.int32(codes[i * T + pick]) + nmax
    return scale


@njit(**_OPTS)
def q3_scale(n, nmax, x, L):
    """``make_q3_quants(n, nmax, x, L, true)``: codes ``L`` (0..2*nmax-1, int8) and the scale,
    weighted by ``x * x``, refined by up to 5 rounds of one-code-at-a-time changes."""
    mx = _F0
    amax = _F0
    for i in range(n):
        ax = np.abs(x[i])
        if ax > amax:
            amax = ax
            mx = x[i]
    if amax < GROUP_MAX_EPS:
        for i in range(n):
            L[i] = 0
        return _F0
    iscale = np.float32(-nmax) / mx
    sumlx = _F0
    suml2 = _F0
    for i in range(n):
        lv = min(max(nearest_int(iscale * x[i]), -nmax), nmax - 1)
        L[i] = lv
        wi = x[i] * x[i]
        fl = np.float32(lv)
        sumlx += wi * x[i] * fl
        suml2 += wi * fl * fl
    for _ in range(5):
        changed = 0
        for i in range(n):
            wi = x[i] * x[i]
            fo = np.float32(L[i])
            slx = sumlx - wi * x[i] * fo
            if slx > _F0:
                sl2 = suml2 - wi * fo * fo
                new = min(max(nearest_int(x[i] * sl2 / slx), -nmax), nmax - 1)
                if new != L[i]:
                    fn = np.float32(new)
                    slx += wi * x[i] * fn
                    sl2 += wi * fn * fn
                    if sl2 > _F0 and slx * slx * suml2 > sumlx * sumlx * sl2:
                        L[i] = new
                        sumlx = slx
                        suml2 = sl2
                        changed += 1
        if not changed:
            break
    for i in range(n):
        L[i] += nmax
    return sumlx / suml2 if suml2 > _F0 else _F0


#: the float32 scratch :func:`qkx_scale_min` needs for up to 32 values (two trials' codes)
QKX_WORK = 2 * 32


@njit(**_OPTS)
def _qkx_in_turn(n, nmax, x, w, L, work, rmin, rdelta, nstep, use_mad, mx, mn, sum_w, sum_x,
                 scale, best):  # fmt: skip
    """The trials of :func:`qkx_scale_min` in the C order, two at a time for the current
    ``mn`` (independent sums, so the two chains of additions overlap); when the first of a
    pair wins and moves ``mn``, the second is tried again with it. ``work``: float32 scratch
    of ``2 * n``. Returns ``(scale, min)``."""
    fmax = np.float32(nmax)
    hi = np.int32(nmax)
    la = work[0:n]
    lb = work[n : 2 * n]
    step = 0
    while step <= nstep:
        span = mx - mn
        ia = (rmin + rdelta * np.float32(step) + fmax) / span
        ib = (rmin + rdelta * np.float32(step + 1) + fmax) / span
        sa = sa2 = sax = _F0
        sb = sb2 = sbx = _F0
        for i in range(n):
            d = x[i] - mn
            fa = np.float32(min(max(nearest_int(ia * d), np.int32(0)), hi))
            fb = np.float32(min(max(nearest_int(ib * d), np.int32(0)), hi))
            la[i] = fa
            lb[i] = fb
            wa = w[i] * fa
            wb = w[i] * fb
            sa += wa
            sa2 += wa * fa
            sax += wa * x[i]
            sb += wb
            sb2 += wb * fb
            sbx += wb * x[i]
        deta = sum_w * sa2 - sa * sa
        detb = sum_w * sb2 - sb * sb
        ta = (sum_w * sax - sum_x * sa) / deta
        ma = (sa2 * sum_x - sa * sax) / deta
        if ma > _F0:
            ma = _F0
            ta = sax / sa2
        tb = (sum_w * sbx - sum_x * sb) / detb
        mb = (sb2 * sum_x - sb * sbx) / detb
        if mb > _F0:
            mb = _F0
            tb = sbx / sb2
        ea = eb = _F0
        for i in range(n):
            da = ta * la[i] + ma - x[i]
            db = tb * lb[i] + mb - x[i]
            da = np.abs(da) if use_mad else da * da
            db = np.abs(db) if use_mad else db * db
            ea += w[i] * da
            eb += w[i] * db
        if deta > _F0 and ea < best:
            for i in range(n):
                L[i] = np.int32(la[i])
            best = ea
            scale = ta
            moved = ma != mn
            mn = ma
            if moved:
                step += 1
                continue
        if step + 1 <= nstep and detb > _F0 and eb < best:
            for i in range(n):
                L[i] = np.int32(lb[i])
            best = eb
            scale = tb
            mn = mb
        step += 2
    return scale, mn


@njit(**_OPTS)
def qkx_scale_min(n, nmax, x, w, L, work, rmin, rdelta, nstep, use_mad, empty_le):
    """``make_qkx2_quants`` (``empty_le`` False) / ``make_qkx3_quants`` with weights (True):
    codes ``L`` (0..nmax, uint8), and ``(scale, the_min)`` where values are ``scale * L -
    the_min``. Trial inverse scales ``(rmin + rdelta * is + nmax) / (max - min)``, is = 0..nstep,
    each fitted by weighted least squares; the lowest weighted error (absolute when
    ``use_mad``, else squared) wins. ``work``: float32 scratch of :data:`QKX_WORK` values.

    The C code tries the scales one after another, and a trial that wins moves ``min``, which
    the later trials use: here too (:func:`_qkx_in_turn`, two trials at a time), so every
    trial sees the C's ``min`` and sums in the C order: the same bits."""
    mn = x[0]
    mx = x[0]
    sum_w = w[0]
    sum_x = sum_w * x[0]
    for i in range(1, n):
        if x[i] < mn:
            mn = x[i]
        if x[i] > mx:
            mx = x[i]
        sum_w += w[i]
        sum_x += w[i] * x[i]
    if mn > _F0:
        mn = _F0
    if (mx <= mn) if empty_le else (mx == mn):
        for i in range(n):
            L[i] = 0
        return _F0, -mn
    fmax = np.float32(nmax)
    iscale = fmax / (mx - mn)
    scale = _F1 / iscale
    best = _F0
    for i in range(n):
        lv = min(max(nearest_int(iscale * (x[i] - mn)), 0), nmax)
        L[i] = lv
        diff = scale * np.float32(lv) + mn - x[i]
        diff = np.abs(diff) if use_mad else diff * diff
        best += w[i] * diff
    if nstep < 1:
        return scale, -mn
    scale, mn = _qkx_in_turn(n, nmax, x, w, L, work, rmin, rdelta, nstep, use_mad, mx, mn,
                             sum_w, sum_x, scale, best)  # fmt: skip
    return scale, -mn


@njit(**_OPTS)
def qp_scale(n, nmax, x, L, w):
    """``make_qp_quants``: codes ``L`` (uint8, at most nmax) and the scale of the non-negative
    values ``x`` weighted by ``w``: the best of 9 trial scales by weighted squared error, then
    up to 5 rounds of one-code-at-a-time changes."""
    mx = _F0
    for i in range(n):
        mx = mx if mx > x[i] else x[i]
    if mx < GROUP_MAX_EPS:
        for i in range(n):
            L[i] = 0
        return _F0
    fmax = np.float32(nmax)
    iscale = fmax / mx
    for i in range(n):
        L[i] = nearest_int(iscale * x[i]) & 0xFF
    scale = _F1 / iscale
    best = _F0
    for i in range(n):
        diff = x[i] - scale * np.float32(L[i])
        best += w[i] * diff * diff
    for step in range(-4, 5):
        if step == 0:
            continue
        iscale_is = (_TENTH * np.float32(step) + fmax) / mx
        scale_is = _F1 / iscale_is
        mse = _F0
        for i in range(n):
            lv = min(nmax, nearest_int(iscale_is * x[i]))
            diff = x[i] - scale_is * np.float32(lv)
            mse += w[i] * diff * diff
        if mse < best:
            best = mse
            iscale = iscale_is
    sumlx = _F0
    suml2 = _F0
    for i in range(n):
        lv = min(nmax, nearest_int(iscale * x[i]))
        L[i] = lv & 0xFF
        fl = np.float32(lv)
        sumlx += w[i] * x[i] * fl
        suml2 += w[i] * fl * fl
    for _ in range(5):
        changed = 0
        for i in range(n):
            fo = np.float32(L[i])
            slx = sumlx - w[i] * x[i] * fo
            sl2 = suml2 - w[i] * fo * fo
            if slx > _F0 and sl2 > _F0:
                new = min(nmax, nearest_int(x[i] * sl2 / slx))
                if new != L[i]:
                    fn = np.float32(new)
                    slx += w[i] * x[i] * fn
                    sl2 += w[i] * fn * fn
                    if slx * slx * suml2 > sumlx * sumlx * sl2:
                        L[i] = new & 0xFF
                        sumlx = slx
                        suml2 = sl2
                        changed += 1
        if not changed:
            break
    return sumlx / suml2 if suml2 > _F0 else _F0


@njit(inline="always", **_OPTS)
def put_half(out, at, h):
    """Store the float16 bits ``h`` at ``out[at:at + 2]``, little-endian."""
    out[at] = h & 0xFF
    out[at + 1] = (h >> 8) & 0xFF


@njit(inline="always", **_OPTS)
def half_at(raw, at):
    """The float32 value of the little-endian float16 at ``raw[at:at + 2]``."""
    return fp16_value(np.int32(raw[at]) | (np.int32(raw[at + 1]) << 8))
