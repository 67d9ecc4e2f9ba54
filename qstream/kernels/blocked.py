"""Group-wise (blocked) dynamic quantization fused into one pass: per parameter block, the
exact finite range, the scale and zero point, and the quantized values.

The arithmetic is the same, operation for operation, as the unfused path: ``slot_ranges``
(finite min/max by integer order keys), ``params_from_range`` (float64, scale rounded to
float32, ``rint`` zero point) and the ``half_to_even`` quantize kernel (float32 ``rint(x /
s) + z``, saturated to ``[lo, hi]``, masked), so the results are bit-identical to it.

:func:`prefetch` is the cache hint its kernels give for the row they read next (Numba has none).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from .affine import ASYM, PARTS, TILE, range_params
from .bits import (
    FINITE_KEY32_MAX,
    FINITE_KEY32_MIN,
    KEY32_MAX,
    KEY32_MIN,
    MAG32,
    bits32,
    from_bits,
    from_order_key32,
    order_key32,
)
from .error_stats import (
    FASTMATH,
    N_SUMS,
    STRIP,
    column_scratch,
    column_sums,
    finite_run_sums,
    fold_partial,
    run_sums,
)
from .runtime import helper, parallel_kernel, specialize
from .stats import slot_range_keys32


@intrinsic
def prefetch(typingctx, arr, i):
    """Hint the CPU to bring element ``i`` of the contiguous array ``arr`` (counted from its
    first element, possibly past its end: a prefetch never faults) into its caches.

    For kernels that make two passes over a row, one bound by memory and one by arithmetic:
    prefetching the next row during the arithmetic lets the two overlap."""
    sig = types.void(arr, i)

    def codegen(context, builder, signature, args):
        a = context.make_array(signature.args[0])(context, builder, args[0])
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        p = builder.bitcast(builder.gep(a.data, [args[1]]), i8p)
        # a read, kept in every cache level, of data
        builder.call(fn, [p, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return sig, codegen


# True in the builds of the fused kernels for finite input (``specialize``): a work item
# holding a NaN or an infinity is marked -1 in ``nonfinite`` and the call's results are
# void (the caller runs the complete build); without the code for such values they compile
# ~20% faster
FINITE = False


@helper
def _row_keys(xr, iblock, symmetric, kmin, kmax):
    """The order keys of each group's min/max along the row ``xr`` (groups of ``iblock``),
    counting NaN/inf like any value; whether a group held one (then the caller computes the
    row again with :func:`slot_range_keys32`). Symmetric modes need only the largest
    magnitude: one integer max of the bits without the sign, its key as both ends."""
    n = np.uint64(xr.shape[0])
    ub = np.uint64(iblock)
    bad = False
    for pi in range(kmin.size):  # index bounds, not slices (see errors.sums_at)
        i0 = np.uint64(pi) * ub
        i1 = min(n, i0 + ub)
        if symmetric:
            b = np.int32(0)
            for i in range(i0, i1):
                b = max(b, bits32(xr[i]) & MAG32)
            kmin[pi] = ~b  # the key of -|x|max
            kmax[pi] = b
            bad |= b > FINITE_KEY32_MAX
        else:
            a = KEY32_MAX
            b = KEY32_MIN
            for i in range(i0, i1):
                k = order_key32(xr[i])
                a = min(a, k)
                b = max(b, k)
            kmin[pi] = a
            kmax[pi] = b
            bad |= (a < FINITE_KEY32_MIN) | (b > FINITE_KEY32_MAX)
    return bad


@helper
def _column_keys(x, o, c0, c1, symmetric, kmin, kmax):
    """:func:`_row_keys` for a parameter per element along the rows (groups are columns of
    rows ``c0 .. c1`` of ``x[o]``): vertical min/max, so the loop vectorises."""
    kmin[:] = KEY32_MAX
    kmax[:] = KEY32_MIN
    for c in range(c0, c1):
        xr = x[o, c]
        for j in range(kmin.size):
            if symmetric:
                kmax[j] = max(kmax[j], bits32(xr[j]) & MAG32)
            else:
                k = order_key32(xr[j])
                kmin[j] = min(kmin[j], k)
                kmax[j] = max(kmax[j], k)
    bad = False
    for j in range(kmin.size):
        if symmetric:
            kmin[j] = ~kmax[j]  # the key of -|x|max
        bad |= (kmin[j] < FINITE_KEY32_MIN) | (kmax[j] > FINITE_KEY32_MAX)
    return bad


@helper
def _params(kmin, kmax, mode, qmin, qmax, steps, zp_sym, scale_mode, ss, zs):
    """Each group's scale and zero point from its finite range's order keys
    (:func:`~qstream.kernels.affine.range_params`)."""
    for pi in range(kmin.size):
        empty = kmin[pi] == KEY32_MAX and kmax[pi] == KEY32_MIN
        vlo = 0.0 if empty else np.float64(from_order_key32(kmin[pi]))
        vhi = 0.0 if empty else np.float64(from_order_key32(kmax[pi]))
        s32, z = range_params(vlo, vhi, mode, qmin, qmax, steps, zp_sym, scale_mode)
        ss[pi] = s32
        zs[pi] = np.float32(z)


@parallel_kernel(fastmath=FASTMATH, inputs=1)
def dynamic_rows_half_to_even(
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
    scale_mode,
    scale,
    zero_point,
    out,
    nonfinite,
    errors,
    sums,
    gx2,
    ge2,
    gmax,
):
    """The fused pass where groups are runs along the rows (``iblock > 1``: blocked along
    the last axis); the arguments: :func:`dynamic_kernel`."""
    n_outer, n_c, n_inner = x.shape
    n_cp = scale.shape[1]
    n_ip = scale.shape[2]
    n_work = n_outer * n_cp  # a work item: a row of parameter blocks
    parts = min(n_work, PARTS)
    un = np.uint64(n_inner)
    ub = np.uint64(iblock)
    n_tiles = (n_inner + TILE - 1) // TILE
    partial = np.zeros((n_outer * n_c * n_tiles if errors else 0, N_SUMS))
    for p in prange(parts):  # contiguous runs of work items, scratch allocated once per run
        kmin = np.empty(n_ip, np.int32)
        kmax = np.empty(n_ip, np.int32)
        acc = np.zeros(N_SUMS)  # the current tile's sums
        for w in range(p * n_work // parts, (p + 1) * n_work // parts):
            o = w // n_cp
            pc = w - o * n_cp
            c0 = pc * cblock
            c1 = min(n_c, c0 + cblock)
            nonfinite[w] = 0
            if cblock > 1 or _row_keys(x[o, c0], iblock, mode != ASYM, kmin, kmax):
                if FINITE:
                    nonfinite[w] = -1
                    break
                kmin[:] = KEY32_MAX
                kmax[:] = KEY32_MIN
                nonfinite[w] = slot_range_keys32(x, o, c0, c1, iblock, kmin, kmax)
            ss = scale[o, pc]
            zs = zero_point[o, pc]
            _params(kmin, kmax, mode, qmin, qmax, steps, zp_sym, scale_mode, ss, zs)
            for c in range(c0, c1):
                xr = x[o, c]
                orow = out[o, c]
                t0 = (o * n_c + c) * n_tiles
                for pi in range(n_ip):  # index bounds, not slices (see errors.sums_at)
                    s = ss[pi]
                    z = zs[pi]
                    i0 = np.uint64(pi) * ub
                    i1 = min(un, i0 + ub)
                    # the next row, for its range pass: one hint per cache line (16 float32)
                    for j in range(i0, i1, np.uint64(16)):
                        prefetch(xr, j + un)
                    for j in range(i0, i1):
                        orow[j] = np.int32(min(max(lo, np.rint(xr[j] / s) + z), hi))
                    if errors:
                        if FINITE:
                            sx2, se2, emax = finite_run_sums(
                                xr, orow, i0, i1, s, z, qmin, qmax, acc
                            )
                        else:
                            sx2, se2, emax = run_sums(xr, orow, i0, i1, s, z, qmin, qmax, acc)
                        gx2[o, pc, pi] = sx2
                        ge2[o, pc, pi] = se2
                        gmax[o, pc, pi] = from_bits(emax)
                        if i1 == un or i1 % np.uint64(TILE) == 0:  # the tile ends here
                            row = partial[t0 + (np.int64(i1) - 1) // TILE]
                            for k in range(N_SUMS):  # (no array assignment: its shape check
                                row[k] = acc[k]  # compiles string formatting, ~2-4 s)
                                acc[k] = 0.0
                    if mask:
                        for j in range(i0, i1):
                            orow[j] &= mask
    for t in range(partial.shape[0]):  # tile order, as error_sums folds
        fold_partial(sums[0], partial[t])


@parallel_kernel(fastmath=FASTMATH, inputs=1)
def dynamic_columns_half_to_even(
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
    scale_mode,
    scale,
    zero_point,
    out,
    nonfinite,
    errors,
    sums,
    gx2,
    ge2,
    gmax,
):
    """The fused pass where each element along the rows has its own parameter (``iblock ==
    1``: blocked along an outer axis): groups are columns of ``cblock`` rows, their ranges
    and error sums taken down the columns (vertical min/max and sums: the loops vectorise);
    the arguments: :func:`dynamic_kernel`."""
    n_outer, n_c, n_inner = x.shape
    n_cp = scale.shape[1]
    n_ip = scale.shape[2]
    n_work = n_outer * n_cp  # a work item: a block of rows
    parts = min(n_work, PARTS)
    partial = np.zeros((n_work if errors else 0, N_SUMS))
    for p in prange(parts):  # contiguous runs of work items, scratch allocated once per run
        kmin = np.empty(n_ip, np.int32)
        kmax = np.empty(n_ip, np.int32)
        cols = column_scratch(STRIP if errors else 0)
        for w in range(p * n_work // parts, (p + 1) * n_work // parts):
            o = w // n_cp
            pc = w - o * n_cp
            c0 = pc * cblock
            c1 = min(n_c, c0 + cblock)
            nonfinite[w] = 0
            if _column_keys(x, o, c0, c1, mode != ASYM, kmin, kmax):
                if FINITE:
                    nonfinite[w] = -1
                    break
                kmin[:] = KEY32_MAX
                kmax[:] = KEY32_MIN
                nonfinite[w] = slot_range_keys32(x, o, c0, c1, iblock, kmin, kmax)
            ss = scale[o, pc]
            zs = zero_point[o, pc]
            _params(kmin, kmax, mode, qmin, qmax, steps, zp_sym, scale_mode, ss, zs)
            for c in range(c0, c1):  # one loop along each row
                xr = x[o, c]
                orow = out[o, c]
                for j in range(n_inner):
                    v = np.rint(xr[j] / ss[j]) + zs[j]
                    orow[j] = np.int32(min(max(lo, v), hi))
            if errors:  # the block's rows are in cache: down the columns
                column_sums(
                    x, out, o, c0, c1, ss, zs, qmin, qmax, cols, partial[w],
                    gx2[o, pc], ge2[o, pc], gmax[o, pc], True,
                )  # fmt: skip
            if mask:
                for c in range(c0, c1):
                    orow = out[o, c]
                    for j in range(n_inner):
                        orow[j] &= mask
    for t in range(partial.shape[0]):  # work item order, as error_sums folds
        fold_partial(sums[0], partial[t])


dynamic_rows_finite = specialize(dynamic_rows_half_to_even, "finite", FINITE=True)
dynamic_columns_finite = specialize(dynamic_columns_half_to_even, "finite", FINITE=True)


def dynamic_kernel(iblock: int, finite: bool = False):
    """The fused kernel for a layout's ``iblock``: :func:`dynamic_columns_half_to_even` for a
    parameter per element along the rows (``iblock == 1``), else
    :func:`dynamic_rows_half_to_even`; ``finite``: its build for finite input (see
    :data:`FINITE`). Separate kernels, not one with every path: a job compiles the one it
    needs (a first run's group-wise conversion spends most of its time compiling it), and
    each compiles in less than half the time of the one they replace.

    They take ``(x, cblock, iblock, mode, qmin, qmax, steps, zp_sym, lo, hi, mask, scale_mode,
    scale, zero_point, out, nonfinite, errors, sums, gx2, ge2, gmax)``: ``x`` float32 ``[O,
    C, I]``; parameter block ``(o, c // cblock, i // iblock)`` of ``scale`` / ``zero_point``
    (float32; zero points are integers of at most 16 bits) ``[O, Cp, Ip]``; ``mode``,
    ``steps``, ``zp_sym`` and ``scale_mode`` as
    :func:`~qstream.kernels.affine.range_params` takes them; ``lo``/``hi`` float32
    saturation bounds; ``out`` the codes in the widened integer type, ``mask``:
    nonzero for signed sub-byte types, whose stored bytes are the codes masked to their bits;
    ``nonfinite[O * Cp]``: per row of parameter blocks, how many pieces of it held a NaN or
    an infinity (the caller applies its NaN policy to them).

    ``errors`` (a layout where ``errors.groups_in_pass``): the error sums of
    ``qstream.kernels.error_stats.error_sums`` added to ``sums[1, N_SUMS]`` and each group's into
    ``gx2``/``ge2``/``gmax`` ``[O, Cp, Ip]`` in the same pass, while the group is in cache;
    the same numbers as that kernel (the same runs, tiles or columns, and fold order)."""
    if iblock == 1:
        return dynamic_columns_finite if finite else dynamic_columns_half_to_even
    return dynamic_rows_finite if finite else dynamic_rows_half_to_even


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
