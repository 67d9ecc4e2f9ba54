"""Quantization error sums: read x and q, never materialise the dequantized block.

Arrays use the quantize layout (``qstream.layout``): x and q ``[O, C, I]``, parameters
``[Op, Cp, Ip]``. The channel of an element is its ``c`` index, or its ``i`` index when the
quantized axis was moved to the inner position (``chan_inner``); per tensor there is one.
Sums are taken per tile (a partition that does not depend on the thread count) and folded in
tile order, so results are identical at every thread count.

Speed: the inner loops are branch-free and vectorise. The largest error is an integer max
over the float64 bit patterns of ``|e|`` (non-negative floats order like their bits), because
Numba's float ``max`` is a compare-and-select that LLVM does not vectorise. A run is summed
as if every value were finite; only a run whose sum of x^2 is not finite (it holds NaN or
inf, or x^2 overflowed) is summed again, skipping and counting the non-finite values.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from .affine import TILE, tile_coords
from .bits import bits as _bits
from .bits import from_bits as _from_bits
from .bits import nonfinite as _nonfinite
from .numpy_twins import N_SUMS
from .runtime import helper, njit, parallel_kernel, run
from .stats import channel_rows

# (N_SUMS: the columns of the result, count, sum x^2, sum e^2, sum x*y, sum y^2, max |e|,
# clipped, NaN, +inf, -inf; defined once, beside the NumPy twin that sums them too)
# reassoc: lets LLVM vectorise the float64 reductions (the order is fixed per tile, so results
# still do not depend on the thread count). NaN/inf semantics stay exact: no nnan/ninf.
FASTMATH = {"reassoc", "nsz"}


@njit(inline="always", cache=True)
def _dequantized(qv, s, z):
    # (q - zp) * scale in the parameters' float type (float64 for 32-bit q), rounded to
    # float32 as dequantize stores it
    return np.float64(np.float32((qv - z) * s))


@helper(fastmath=FASTMATH)
def sums_at(xr, qr, i0, i1, s, z, lo, hi):
    """(sum x^2, sum e^2, sum x*y, sum y^2, max |e| bits, clipped) of the run ``[i0, i1)``
    (``uint64`` bounds) of the rows ``xr``/``qr``, as if every value were finite. A NaN or
    infinite x makes sum x^2 NaN or infinite (its terms are never negative, so nothing
    cancels): the caller tests that sum instead of counting them here.

    Kernels that take many short runs of one row call this rather than slice it: a slice
    costs two atomic reference-count updates, and threads slicing one array contend for its
    count (the error pass for groups of 32 ran ~15% faster without them). Unsigned indices
    spare the negative-index test that would keep the loop from vectorising."""
    sx2 = 0.0
    se2 = 0.0
    sxy = 0.0
    sy2 = 0.0
    emax = np.int64(0)
    clip = np.int32(0)
    for i in range(i0, i1):
        x = np.float64(xr[i])
        y = _dequantized(qr[i], s, z)
        e = x - y
        sx2 += x * x
        se2 += e * e
        sxy += x * y
        sy2 += y * y
        emax = max(emax, _bits(abs(e)))
        clip += np.int32((x > hi) | (x < lo))
    return sx2, se2, sxy, sy2, emax, clip


@helper(fastmath=FASTMATH)
def run_sums(xr, qr, i0, i1, s, z, qmin, qmax, acc):
    """Add the sums of the run ``[i0, i1)`` (``uint64`` bounds) of the rows ``xr``/``qr``,
    whose elements share the scale ``s`` and zero point ``z``, to the row ``acc``; returns
    the run's own (sum x^2, sum e^2, max |e| bits)."""
    lo = (qmin - z - 0.5) * s
    hi = (qmax - z + 0.5) * s
    sx2, se2, sxy, sy2, emax, clip = sums_at(xr, qr, i0, i1, s, z, lo, hi)
    n = np.int64(i1 - i0)
    if _nonfinite(sx2):  # rare: NaN/inf in x, or x^2 overflowed
        a, b = np.int64(i0), np.int64(i1)
        sx2, se2, sxy, sy2, emax, clip, n = finite_sums(xr[a:b], qr[a:b], s, z, lo, hi, acc)
    fold_sums(acc, n, sx2, se2, sxy, sy2, emax, clip)
    return sx2, se2, emax


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def row_sums(xr, qr, s, z, qmin, qmax, acc):
    """:func:`run_sums` of the whole row ``xr``/``qr`` into ``acc``, compiled on its own with
    the error kernels' fast-math flags: a kernel compiled without them (one that quantizes
    too) calls it and gets the sums :func:`_error_sums_channel_rows` gives, bit for bit."""
    run_sums(xr, qr, np.uint64(0), np.uint64(xr.shape[0]), s, z, qmin, qmax, acc)


@helper(fastmath=FASTMATH)
def finite_run_sums(xr, qr, i0, i1, s, z, qmin, qmax, acc):
    """:func:`run_sums` of a run whose values are all finite (no second pass for NaN/inf:
    the sum of x^2 of finite float32 values cannot overflow), for kernels compiled for
    finite input only: the same sums, with less code to compile."""
    lo = (qmin - z - 0.5) * s
    hi = (qmax - z + 0.5) * s
    sx2, se2, sxy, sy2, emax, clip = sums_at(xr, qr, i0, i1, s, z, lo, hi)
    fold_sums(acc, np.int64(i1 - i0), sx2, se2, sxy, sy2, emax, clip)
    return sx2, se2, emax


@njit(inline="always", cache=True)
def fold_sums(acc, n, sx2, se2, sxy, sy2, emax, clip):
    """Add a run's sums to the row ``acc`` (count, sums, largest error, clipped)."""
    acc[0] += n
    acc[1] += sx2
    acc[2] += se2
    acc[3] += sxy
    acc[4] += sy2
    acc[5] = max(acc[5], _from_bits(emax))
    acc[6] += clip


@njit(inline="always", cache=True)
def fold_partial(acc, part):
    """Fold a work unit's whole row of sums ``part`` into ``acc`` (max for the largest
    error, sums for the rest)."""
    for k in range(N_SUMS):
        acc[k] = max(acc[k], part[k]) if k == 5 else acc[k] + part[k]


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def finite_sums(xs, qs, s, z, lo, hi, acc):
    """:func:`sums_at` of the run as if each NaN/inf were x = 0 with q = zp (so y = 0, e = 0),
    and the count of finite values; NaN, +inf and -inf are counted into ``acc``. Out of line:
    the hot loop stays small. No copy of the run is made: an array made in a kernel loads
    Numba's array module (15 ms) in every process that loads the kernel from the cache."""
    n = np.int64(xs.shape[0])
    for i in range(xs.shape[0]):
        v = np.float64(xs[i])
        if _nonfinite(v):
            acc[7 if v != v else (8 if v > 0 else 9)] += 1
            n -= 1
    sx2 = 0.0
    se2 = 0.0
    sxy = 0.0
    sy2 = 0.0
    emax = np.int64(0)
    clip = np.int32(0)
    for i in range(xs.shape[0]):
        x = np.float64(xs[i])
        fin = _nonfinite(x) == 0
        x = x if fin else 0.0
        # computed, then dropped: a call under a condition keeps the loop from vectorising
        y = _dequantized(qs[i], s, z)
        y = y if fin else 0.0
        e = x - y
        sx2 += x * x
        se2 += e * e
        sxy += x * y
        sy2 += y * y
        emax = max(emax, _bits(abs(e)))
        clip += np.int32((x > hi) | (x < lo))
    return sx2, se2, sxy, sy2, emax, clip, n


@helper(fastmath=FASTMATH)
def _row_sums(xr, qr, j0, ss, zs, s0, qmin, qmax, n, x2, e2, xy, y2, emax, clip):
    """Channels along the row: element ``j0 + j`` of ``xr``/``qr`` (``uint64`` offsets, no
    slices) is channel ``j`` of the accumulators (one array per sum, vertical updates, so the
    loop vectorises); its parameters ``ss[s0 + j]``/``zs[s0 + j]``."""
    for j in range(n.shape[0]):
        s = ss[s0 + np.uint64(j)]
        z = zs[s0 + np.uint64(j)]
        x = np.float64(xr[j0 + np.uint64(j)])
        fin = _nonfinite(x) == 0
        x = x if fin else 0.0
        # computed, then dropped: a call under a condition keeps the loop from vectorising
        y = _dequantized(qr[j0 + np.uint64(j)], s, z)
        y = y if fin else 0.0
        e = x - y
        n[j] += 1.0 if fin else 0.0
        x2[j] += x * x
        e2[j] += e * e
        xy[j] += x * y
        y2[j] += y * y
        emax[j] = max(emax[j], _bits(abs(e)))
        clip[j] += 1.0 if (x > (qmax - z + 0.5) * s) | (x < (qmin - z - 0.5) * s) else 0.0


def error_sums(x, q, scale, zero_point, cblock, iblock, qmin, qmax, chan_inner, out, groups=None):
    """Add the error sums of one block to ``out[channels, N_SUMS]`` (channels along ``i``
    when ``chan_inner``, else along ``c`` or one per tensor).

    An element counts as clipped when it lies beyond the representable range by more than
    half a step: ``x > (qmax - zp + 0.5) * s`` or ``x < (qmin - zp - 0.5) * s``.

    ``groups``: ``(x2, e2, emax)`` arrays ``[O, Cp, Ip]`` that also receive each parameter
    group's sums, for a blocked layout where :func:`groups_in_pass` (groups that are whole
    runs of one tile, or columns): the numbers :func:`group_sums` gives, at no extra pass.
    """
    if chan_inner:
        if out.shape[0] != x.shape[2]:  # (the kernel writes a row of ``out`` per channel)
            raise ValueError(
                f"error_sums: sums for {out.shape[0]} channels, {x.shape[2]} on the inner axis"
            )
        run(_error_sums_rows, x, q, scale, zero_point, cblock, iblock, qmin, qmax, out)
        return
    g = groups if groups is not None else (NO_GROUPS,) * 3
    # by columns only into one channel (a column's rows can be different channels)
    by_column = columns(iblock, scale.shape[2]) and out.shape[0] == 1
    if groups is not None and not (by_column or groups_in_pass(cblock, iblock, 1)):
        raise ValueError("error_sums: these groups are not summed in the pass")
    if groups is None and scale.shape[2] == 1 and channel_rows(x.shape, out.shape[0]):
        run(_error_sums_channel_rows, x, q, scale, zero_point, cblock, qmin, qmax, out)
        return
    kernel = _error_sums_columns if by_column else _error_sums_tiles
    run(kernel, x, q, scale, zero_point, cblock, iblock, qmin, qmax, out, *g, groups is not None)


NO_GROUPS = np.zeros((1, 1, 1))  # the group arrays of a kernel asked for no group sums


@njit(cache=True)
def columns(iblock: int, p_inner: int) -> bool:
    """Whether a layout has a parameter per element along its rows (blocked along an outer
    axis): its groups are columns of ``cblock`` rows, summed down the rows
    (:func:`column_sums`) rather than run by run."""
    return iblock == 1 and p_inner > 1


def groups_in_pass(cblock: int, iblock: int, p_inner: int) -> bool:
    """Whether :func:`error_sums` gives the sums of each parameter group of a blocked layout:
    each group one run of one tile (one row segment, tiles cut on group boundaries), or one
    column (:func:`columns`)."""
    return (cblock == 1 and TILE % iblock == 0) or columns(iblock, p_inner)


STRIP = 256  # columns summed at once: their accumulators stay in the L1 cache


@njit(inline="always", cache=True)
def column_scratch(n):
    """The accumulators of :func:`column_sums` (``n``: ``STRIP``, or 0 where it is not
    called), one array each: count, x^2, e^2, x*y, y^2, clipped; max |e| bits."""
    return (
        np.empty(n), np.empty(n), np.empty(n), np.empty(n), np.empty(n), np.empty(n),
        np.empty(n, np.int64),
    )  # fmt: skip


@helper(fastmath=FASTMATH)
def column_sums(x, q, o, c0, c1, ss, zs, qmin, qmax, cols, acc, gx2, ge2, gmax, groups):
    """The error sums of rows ``c0 .. c1`` of ``x[o]``/``q[o]`` whose element ``j`` uses
    ``ss[j]``/``zs[j]``: down each column, a strip of ``STRIP`` columns at a time, into the
    scratch :func:`column_scratch` (vertical updates: the loop vectorises), then folded into
    ``acc`` column by column; with ``groups`` each column's sums also go to ``gx2``/``ge2``/
    ``gmax`` (rows of the parameter arrays)."""
    n_inner = x.shape[2]
    for j0 in range(0, n_inner, STRIP):
        m = min(n_inner, j0 + STRIP) - j0
        n, x2, e2, xy = cols[0][:m], cols[1][:m], cols[2][:m], cols[3][:m]
        y2, clip, emax = cols[4][:m], cols[5][:m], cols[6][:m]
        n[:] = 0.0
        x2[:] = 0.0
        e2[:] = 0.0
        xy[:] = 0.0
        y2[:] = 0.0
        clip[:] = 0.0
        emax[:] = 0
        u0 = np.uint64(j0)
        for c in range(c0, c1):
            _row_sums(
                x[o, c], q[o, c], u0, ss, zs, u0, qmin, qmax,
                n, x2, e2, xy, y2, emax, clip,
            )  # fmt: skip
        for j in range(m):
            fold_sums(acc, n[j], x2[j], e2[j], xy[j], y2[j], emax[j], clip[j])
            if groups:
                gx2[j0 + j] = x2[j]
                ge2[j0 + j] = e2[j]
                gmax[j0 + j] = _from_bits(emax[j])
        if n.sum() < (c1 - c0) * m:  # rare: a value was not finite; count them by kind
            for c in range(c0, c1):
                xr = x[o, c]
                for j in range(j0, j0 + m):
                    v = np.float64(xr[j])
                    if _nonfinite(v):
                        acc[7 if v != v else (8 if v > 0 else 9)] += 1


@parallel_kernel(fastmath=FASTMATH, inputs=4)
def _error_sums_columns(
    x, q, scale, zero_point, cblock, iblock, qmin, qmax, out, gx2, ge2, gmax, groups
):
    """A parameter per element along the rows (:func:`columns`): each work item, a block of
    ``cblock`` rows, sums down its columns (:func:`column_sums`); work items fold in order.
    With ``groups``, each column's sums go to its group in ``gx2``/``ge2``/``gmax``."""
    n_outer, n_c, _n_inner = x.shape
    p_outer = scale.shape[0]
    n_cp = scale.shape[1]
    total = n_outer * n_cp
    partial = np.zeros((total, N_SUMS))
    parts = min(total, 256)
    for p in prange(parts):
        cols = column_scratch(STRIP)
        for w in range(p * total // parts, (p + 1) * total // parts):
            o = w // n_cp
            pc = w - o * n_cp
            po = o if p_outer > 1 else 0
            c0 = pc * cblock
            g = po if groups else 0, pc if groups else 0
            column_sums(
                x, q, o, c0, min(n_c, c0 + cblock), scale[po, pc], zero_point[po, pc],
                qmin, qmax, cols, partial[w], gx2[g], ge2[g], gmax[g], groups,
            )  # fmt: skip
    for w in range(total):
        fold_partial(out[0], partial[w])


@parallel_kernel(fastmath=FASTMATH, inputs=4)
def _error_sums_rows(x, q, scale, zero_point, cblock, iblock, qmin, qmax, out):
    """Channels on the inner axis: groups of 256 channels, each owning its sums."""
    n_outer, n_c, n_inner = x.shape
    p_outer = scale.shape[0]
    p_inner = scale.shape[2]
    groups = (n_inner + 255) // 256
    for g in prange(groups):  # each group owns its channels: no shared sums
        i0 = g * 256
        i1 = min(n_inner, i0 + 256)
        m = i1 - i0
        n = np.zeros(m)
        x2 = np.zeros(m)
        e2 = np.zeros(m)
        xy = np.zeros(m)
        y2 = np.zeros(m)
        clip = np.zeros(m)
        emax = np.zeros(m, np.int64)
        ss = np.empty(m, scale.dtype)
        zs = np.empty(m, zero_point.dtype)
        for o in range(n_outer):
            po = o if p_outer > 1 else 0
            for c in range(n_c):
                if o == 0 or p_outer > 1:  # the parameters of each element of the row
                    sr = scale[po, c // cblock]
                    zr = zero_point[po, c // cblock]
                    j = 0
                    while j < m:  # runs sharing one parameter (no division per element)
                        pi = 0 if p_inner == 1 else (i0 + j) // iblock
                        end = m if p_inner == 1 else min(m, (pi + 1) * iblock - i0)
                        ss[j:end] = sr[pi]
                        zs[j:end] = zr[pi]
                        j = end
                _row_sums(
                    x[o, c], q[o, c], np.uint64(i0), ss, zs, np.uint64(0), qmin, qmax,
                    n, x2, e2, xy, y2, emax, clip,
                )  # fmt: skip
        for j in range(m):
            fold_sums(out[i0 + j], n[j], x2[j], e2[j], xy[j], y2[j], emax[j], clip[j])
        if n.sum() < n_outer * n_c * m:  # rare: a value was not finite; count them by kind
            for o in range(n_outer):
                for c in range(n_c):
                    xr = x[o, c]
                    for j in range(m):
                        v = np.float64(xr[i0 + j])
                        if _nonfinite(v):
                            out[i0 + j, 7 if v != v else (8 if v > 0 else 9)] += 1


@parallel_kernel(fastmath=FASTMATH, inputs=4)
def _error_sums_tiles(
    x, q, scale, zero_point, cblock, iblock, qmin, qmax, out, gx2, ge2, gmax, groups
):
    """Channels along ``c`` (or one per tensor): sums per tile, folded in tile order; with
    ``groups``, each run's own sums also go to its group in ``gx2``/``ge2``/``gmax``."""
    n_outer, n_c, n_inner = x.shape
    p_outer = scale.shape[0]
    p_inner = scale.shape[2]
    n_tiles = (n_inner + TILE - 1) // TILE
    total = n_outer * n_c * n_tiles
    partial = np.zeros((total, N_SUMS))
    for t in prange(total):
        o, c, po, pc, i0, i1 = tile_coords(t, n_tiles, n_c, n_inner, p_outer, cblock)
        sr = scale[po, pc]
        zr = zero_point[po, pc]
        xr = x[o, c]  # views made once per tile, not per run (each costs reference counts)
        qr = q[o, c]
        acc = partial[t]
        if p_inner == 1:  # one parameter for the whole tile
            rx2, re2, rmax = run_sums(
                xr, qr, np.uint64(i0), np.uint64(i1), sr[0], zr[0], qmin, qmax, acc
            )
            if groups:  # one group across the row
                gx2[po, pc, 0] = rx2
                ge2[po, pc, 0] = re2
                gmax[po, pc, 0] = _from_bits(rmax)
            continue
        i = i0
        while i < i1:  # runs that share a parameter
            pi = i // iblock
            end = min(i1, (pi + 1) * iblock)
            rx2, re2, rmax = run_sums(
                xr, qr, np.uint64(i), np.uint64(end), sr[pi], zr[pi], qmin, qmax, acc
            )
            if groups:
                gx2[po, pc, pi] = rx2
                ge2[po, pc, pi] = re2
                gmax[po, pc, pi] = _from_bits(rmax)
            i = end
    for t in range(total):
        fold_partial(out[((t // n_tiles) % n_c) if n_c == out.shape[0] else 0], partial[t])


@parallel_kernel(fastmath=FASTMATH, inputs=4)
def _error_sums_channel_rows(x, q, scale, zero_point, cblock, qmin, qmax, out):
    """One row per channel, no longer than a tile, a parameter per row
    (:func:`~qstream.kernels.stats.channel_rows`): each row's sums go straight to its
    channel's row of ``out``, as :func:`_error_sums_tiles` folds them (the row is its only
    tile, whose partial starts at zero), without a partial per row and their fold: 37% less
    time at rows of 128 values (a pack of a 16,384-tensor checkpoint), 15% at 512."""
    i1 = np.uint64(x.shape[2])
    for c in prange(x.shape[1]):
        pc = c // cblock
        s = scale[0, pc, 0]
        z = zero_point[0, pc, 0]
        run_sums(x[0, c], q[0, c], np.uint64(0), i1, s, z, qmin, qmax, out[c])


@parallel_kernel(fastmath=FASTMATH, inputs=4)
def group_sums(x, q, scale, zero_point, cblock, iblock, qmin, qmax, x2, e2, emax):
    """Per parameter group ``(o, c // cblock, i // iblock)`` of a blocked layout: the sums
    of ``x^2`` and ``e^2`` and the largest ``|e|`` over its finite values, into ``x2``,
    ``e2``, ``emax`` ``[O, Cp, Ip]``. Each work item owns a row of groups (no shared sums);
    the run sums are those of :func:`error_sums`."""
    n_outer, n_c, n_inner = x.shape
    p_outer = scale.shape[0]
    n_cp = scale.shape[1]
    n_ip = scale.shape[2]
    for w in prange(n_outer * n_cp):
        o = w // n_cp
        pc = w - o * n_cp
        po = o if p_outer > 1 else 0
        acc = np.zeros((n_ip, N_SUMS))
        for c in range(pc * cblock, min(n_c, (pc + 1) * cblock)):
            xr = x[o, c]
            qr = q[o, c]
            for pi in range(n_ip):
                i0 = np.uint64(pi * iblock)
                i1 = np.uint64(min(n_inner, pi * iblock + iblock))
                s = scale[po, pc, pi]
                z = zero_point[po, pc, pi]
                run_sums(xr, qr, i0, i1, s, z, qmin, qmax, acc[pi])
        for pi in range(n_ip):
            x2[o, pc, pi] = acc[pi, 1]
            e2[o, pc, pi] = acc[pi, 2]
            emax[o, pc, pi] = acc[pi, 5]


@njit(cache=True, nogil=True, error_model="numpy")
def worst_candidates(x2, e2, keep, slack):
    """Flat indices (ascending) of the groups with error (``e2 > 0``) whose signal-to-error
    ratio ``x2 / e2`` is at most ``slack`` times the ``keep``-th smallest such ratio: a
    superset of the ``keep`` lowest-SQNR groups with every tie at the cut included (all of
    them when fewer have error). Two passes, no temporaries the size of the input."""
    worst = np.full(keep, np.inf)  # the keep smallest ratios so far, ascending
    lossy = 0
    for i in range(x2.size):
        if e2[i] > 0:
            lossy += 1
            r = x2[i] / e2[i]
            if r < worst[keep - 1]:
                j = keep - 1
                while j > 0 and worst[j - 1] > r:
                    worst[j] = worst[j - 1]
                    j -= 1
                worst[j] = r
    bound = worst[keep - 1] * slack if lossy >= keep else np.inf
    out = np.empty(min(lossy, x2.size), np.int64)
    n = 0
    for i in range(x2.size):
        if e2[i] > 0 and x2[i] / e2[i] <= bound:
            out[n] = i
            n += 1
    return out[:n]
