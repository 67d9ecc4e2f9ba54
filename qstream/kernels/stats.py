"""Statistics kernels: exact per-channel ranges and fixed-edge histograms.

Arrays arrive as ``[O, C, I]`` with the channel on the middle axis (C = 1 per tensor).
Partial results are kept per work unit and combined in a fixed order, so every result is the
same whatever the thread count; min/max and integer counts are exact whatever the order.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from .affine import TILE, tile_coords
from .bits import (
    FINITE_KEY32_MAX,
    FINITE_KEY32_MIN,
    FINITE_KEY_MAX,
    FINITE_KEY_MIN,
    KEY_MAX,
    KEY_MIN,
    from_order_key,
    nonfinite,
    order_key,
    order_key32,
)
from .runtime import helper, njit, parallel_kernel, run


def channel_ranges(x, mins, maxs, counts, nans, posinf, neginf):
    """Per channel c of ``x[O, C, I]``: min/max of the finite values, and counts of
    finite/NaN/+inf/-inf.

    Outputs are ``[C]`` arrays, updated in place (merged with what they hold).
    """
    if x.shape[2] == 1:
        kernel = _ranges_fast_axis
    elif channel_rows(x.shape, mins.shape[0]):
        kernel = _ranges_channel_rows
    else:
        kernel = _ranges_tiles
    run(kernel, x, mins, maxs, counts, nans, posinf, neginf)


def channel_rows(shape: tuple[int, ...], channels: int) -> bool:
    """Whether ``x[O, C, I]`` of ``shape`` is one row per channel, each no longer than a tile
    (``O = 1``, ``channels = C``, ``0 < I <= TILE``): a pack's stacked tensors, and most
    weight matrices quantized per channel. Each row is then its own tile and its own
    channel's only one, and kernels fold its figures straight into the channel."""
    return shape[0] == 1 and shape[1] == channels and 0 < shape[2] <= TILE


@parallel_kernel(inputs=1)
def _ranges_fast_axis(x, mins, maxs, counts, nans, posinf, neginf):
    """Channels on the fast axis: the outer axis split into parts, a row of partials each."""
    n_outer, n_c, _ = x.shape
    parts = min(n_outer, 64)
    pmin = np.full((parts, n_c), np.inf)
    pmax = np.full((parts, n_c), -np.inf)
    pcnt = np.zeros((parts, 4, n_c), np.int64)
    for p in prange(parts):
        o0 = p * n_outer // parts
        o1 = (p + 1) * n_outer // parts
        for o in range(o0, o1):
            for c in range(n_c):
                _update(x[o, c, 0], pmin, pmax, pcnt, p, c)
    for p in range(parts):
        _fold(pmin[p], pmax[p], pcnt[p], mins, maxs, counts, nans, posinf, neginf)


@parallel_kernel(inputs=1)
def _ranges_tiles(x, mins, maxs, counts, nans, posinf, neginf):
    """Rows of inner elements cut in tiles, each tile's partial folded in tile order."""
    n_outer, n_c, n_inner = x.shape
    n_tiles = (n_inner + TILE - 1) // TILE
    total = n_outer * n_c * n_tiles
    pmin = np.full((total, 1), np.inf)
    pmax = np.full((total, 1), -np.inf)
    pcnt = np.zeros((total, 4, 1), np.int64)
    for t in prange(total):
        o, c, _, _, i0, i1 = tile_coords(t, n_tiles, n_c, n_inner, 1, 1)
        mn, mx, n, nan, pinf, ninf = row_range(x[o, c][i0:i1])
        pmin[t, 0] = mn
        pmax[t, 0] = mx
        pcnt[t, 0, 0] = n
        pcnt[t, 1, 0] = nan
        pcnt[t, 2, 0] = pinf
        pcnt[t, 3, 0] = ninf
    for t in range(total):
        c = (t // n_tiles) % n_c
        _fold_one(
            pmin[t, 0], pmax[t, 0], pcnt[t, :, 0], c, mins, maxs, counts, nans, posinf, neginf
        )


@parallel_kernel(inputs=1)
def _ranges_channel_rows(x, mins, maxs, counts, nans, posinf, neginf):
    """One row per channel, no longer than a tile (:func:`channel_rows`): each row's range
    goes straight to its channel, as :func:`_ranges_tiles` folds it (the row is its only
    tile), without a partial per row."""
    for c in prange(x.shape[1]):
        mn, mx, n, nan, pinf, ninf = row_range(x[0, c])
        fold_counts(mn, mx, n, nan, pinf, ninf, c, mins, maxs, counts, nans, posinf, neginf)


@helper
def row_range(xs):
    """``(min, max, finite, NaN, +inf, -inf)`` of the values ``xs``: the finite min/max
    (``inf``/``-inf`` when none is finite) and the counts of each kind."""
    # integer min/max of order keys, as if every value were finite: vectorises (a float
    # min/max does not); the non-finite ones are counted and sent to the slow path
    kmin = KEY_MAX
    kmax = KEY_MIN
    bad = 0
    for i in range(xs.shape[0]):
        v = np.float64(xs[i])
        k = order_key(v)
        kmin = min(kmin, k)
        kmax = max(kmax, k)
        bad += nonfinite(v)
    if bad == 0:
        return from_order_key(kmin), from_order_key(kmax), xs.shape[0], 0, 0, 0
    # rare: NaN or infinities in this row, counted one by one
    mn = np.inf
    mx = -np.inf
    n = nan = pinf = ninf = 0
    for i in range(xs.shape[0]):
        v = np.float64(xs[i])
        if np.isfinite(v):
            if v < mn:
                mn = v
            if v > mx:
                mx = v
            n += 1
        elif np.isnan(v):
            nan += 1
        elif v > 0:
            pinf += 1
        else:
            ninf += 1
    return mn, mx, n, nan, pinf, ninf


@helper
def slot_range_keys(x, o, c0, c1, iblock, kmin, kmax):
    """Fold rows ``c0 .. c1`` of ``x[o]`` into ``kmin``/``kmax``: the order keys of the finite
    min/max of each parameter slot ``i // iblock`` (left as they were where none is finite).
    Returns how many (row, slot) pieces held a NaN or an infinity."""
    n_inner = x.shape[2]
    pieces = 0
    for c in range(c0, c1):
        xr = x[o, c]
        for pi in range(kmin.size):
            i0 = pi * iblock
            xs = xr[i0 : min(n_inner, i0 + iblock)]
            # every value's key, finite or not: a branch-free loop that vectorises; NaN and
            # infinities have keys beyond the finite ones, so they show in the result
            a = kmin[pi]
            b = kmax[pi]
            for i in range(xs.shape[0]):
                k = order_key(np.float64(xs[i]))
                a = min(a, k)
                b = max(b, k)
            if a < FINITE_KEY_MIN or b > FINITE_KEY_MAX:  # rare: skip the non-finite ones
                pieces += 1
                a = kmin[pi]
                b = kmax[pi]
                for i in range(xs.shape[0]):
                    v = np.float64(xs[i])
                    if nonfinite(v) == 0:
                        k = order_key(v)
                        a = min(a, k)
                        b = max(b, k)
            kmin[pi] = a
            kmax[pi] = b
    return pieces


@helper
def slot_range_keys32(x, o, c0, c1, iblock, kmin, kmax):
    """:func:`slot_range_keys` for float32 ``x`` on int32 keys (:func:`order_key32`)."""
    n_inner = np.uint64(x.shape[2])
    ub = np.uint64(iblock)
    pieces = 0
    for c in range(c0, c1):
        xr = x[o, c]
        for pi in range(kmin.size):  # index bounds, not slices (see errors.sums_at)
            i0 = np.uint64(pi) * ub
            i1 = min(n_inner, i0 + ub)
            a = kmin[pi]
            b = kmax[pi]
            for i in range(i0, i1):
                k = order_key32(xr[i])
                a = min(a, k)
                b = max(b, k)
            if a < FINITE_KEY32_MIN or b > FINITE_KEY32_MAX:
                pieces += 1
                a = kmin[pi]
                b = kmax[pi]
                for i in range(i0, i1):
                    if nonfinite(np.float64(xr[i])) == 0:
                        k = order_key32(xr[i])
                        a = min(a, k)
                        b = max(b, k)
            kmin[pi] = a
            kmax[pi] = b
    return pieces


@parallel_kernel(inputs=1)
def slot_ranges(x, cblock, iblock, lo, hi):
    """Finite min/max of each parameter slot of a blocked layout: element ``(o, c, i)`` of
    ``x[O, C, I]`` belongs to slot ``(o, c // cblock, i // iblock)`` of ``lo``/``hi[O, Cp,
    Ip]``; NaN where a slot holds no finite value. Exact (integer order keys)."""
    n_outer, n_c = x.shape[0], x.shape[1]
    n_cp = lo.shape[1]
    n_ip = lo.shape[2]
    for w in prange(n_outer * n_cp):  # each work item owns a row of slots
        o = w // n_cp
        pc = w - o * n_cp
        kmin = np.full(n_ip, KEY_MAX)
        kmax = np.full(n_ip, KEY_MIN)
        slot_range_keys(x, o, pc * cblock, min(n_c, (pc + 1) * cblock), iblock, kmin, kmax)
        for pi in range(n_ip):
            empty = kmin[pi] == KEY_MAX and kmax[pi] == KEY_MIN
            lo[o, pc, pi] = np.nan if empty else from_order_key(kmin[pi])
            hi[o, pc, pi] = np.nan if empty else from_order_key(kmax[pi])


@njit(inline="always", cache=True)
def _update(v, pmin, pmax, pcnt, p, c):
    if np.isfinite(v):
        if v < pmin[p, c]:
            pmin[p, c] = v
        if v > pmax[p, c]:
            pmax[p, c] = v
        pcnt[p, 0, c] += 1
    elif np.isnan(v):
        pcnt[p, 1, c] += 1
    elif v > 0:
        pcnt[p, 2, c] += 1
    else:
        pcnt[p, 3, c] += 1


@njit(inline="always", cache=True)
def _fold_one(mn, mx, cnt, c, mins, maxs, counts, nans, posinf, neginf):
    n, nan, pinf, ninf = cnt[0], cnt[1], cnt[2], cnt[3]
    fold_counts(mn, mx, n, nan, pinf, ninf, c, mins, maxs, counts, nans, posinf, neginf)


@njit(inline="always", cache=True)
def fold_counts(mn, mx, n, nan, pinf, ninf, c, mins, maxs, counts, nans, posinf, neginf):
    """Fold one part's range (``mn``, ``mx``) and counts into channel ``c``."""
    if mn < mins[c]:
        mins[c] = mn
    if mx > maxs[c]:
        maxs[c] = mx
    counts[c] += n
    nans[c] += nan
    posinf[c] += pinf
    neginf[c] += ninf


@njit(inline="always", cache=True)
def _fold(pmin, pmax, pcnt, mins, maxs, counts, nans, posinf, neginf):
    for c in range(pmin.shape[0]):
        _fold_one(pmin[c], pmax[c], pcnt[:, c], c, mins, maxs, counts, nans, posinf, neginf)


def channel_histograms(x, lo, hi, use_abs, hist):
    """Add x's finite values to fixed-edge histograms ``hist[C, nbins]`` over ``[lo[c], hi[c]]``.

    ``use_abs``: histogram ``|x|`` (edges over ``[0, hi]``). Value ``v`` goes to bin
    ``k = int((v - lo) / (hi - lo) * nbins)`` in float64 (``np.histogram``'s first step; it
    then moves values within an ulp of an edge, this kernel does not), ``hi`` to the last bin;
    values outside are clamped into the end bins (the edges come from an exact min/max pass,
    so none are). Counts are integers: merging histograms of any chunking in any order gives
    the same result.
    """
    kernel = _histograms_by_channel if x.shape[1] >= 8 else _histograms_split
    run(kernel, x, lo, hi, use_abs, hist)


@parallel_kernel(inputs=3)
def _histograms_by_channel(x, lo, hi, use_abs, hist):
    """Many channels: each channel owns its histogram row."""
    n_outer, n_c, _ = x.shape
    nbins = hist.shape[1]
    for c in prange(n_c):
        acc = np.zeros(nbins + 1, np.int64)
        idx = np.empty(_RUN, np.uint32)
        for o in range(n_outer):
            _hist_run(x[o, c], lo[c], hi[c], use_abs, acc, idx)
        for k in range(nbins):
            hist[c, k] += acc[k]


@parallel_kernel(inputs=3)
def _histograms_split(x, lo, hi, use_abs, hist):
    """Few channels: each channel's values split into parts counted in parallel."""
    n_outer, n_c, n_inner = x.shape
    nbins = hist.shape[1]
    n = n_outer * n_inner
    parts = max(1, min(64, n // 65536))
    partial = np.zeros((parts, nbins + 1), np.int64)
    for c in range(n_c):
        partial[:] = 0
        for p in prange(parts):
            idx = np.empty(_RUN, np.uint32)
            k = p * n // parts
            k1 = (p + 1) * n // parts
            while k < k1:  # contiguous runs within one outer row
                o = k // n_inner
                i0 = k - o * n_inner
                i1 = min(n_inner, i0 + (k1 - k))
                _hist_run(x[o, c][i0:i1], lo[c], hi[c], use_abs, partial[p], idx)
                k += i1 - i0
        for p in range(parts):
            for k in range(nbins):
                hist[c, k] += partial[p, k]


_RUN = 1024


@helper
def _hist_run(xr, lo, hi, use_abs, acc, idx):
    """Count the finite values of ``xr`` into ``acc[:nbins]`` (``acc[nbins]`` collects the
    non-finite ones). Bin indices are computed for a run of values first (a loop that
    vectorises), then counted (a scalar scatter)."""
    nbins = acc.shape[0] - 1
    w = hi - lo
    if not w > 0:  # one value (or none): every finite value is in bin 0
        for i in range(xr.shape[0]):
            acc[0 if nonfinite(np.float64(xr[i])) == 0 else nbins] += 1
        return
    top = np.float64(nbins - 1)
    n = xr.shape[0]
    for j0 in range(0, n, _RUN):
        m = min(_RUN, n - j0)
        xs = xr[j0 : j0 + m]
        if use_abs:
            for j in range(m):
                v = np.float64(xs[j])
                f = min(max((abs(v) - lo) / w * nbins, 0.0), top)
                idx[j] = np.uint32(f) if nonfinite(v) == 0 else np.uint32(nbins)
        else:
            for j in range(m):
                v = np.float64(xs[j])
                f = min(max((v - lo) / w * nbins, 0.0), top)
                idx[j] = np.uint32(f) if nonfinite(v) == 0 else np.uint32(nbins)
        for j in range(m):
            acc[idx[j]] += 1
