"""Per-block computations of a job: channel views, statistics, dynamic parameters, errors.

Everything here works on one in-memory block; the pipeline decides which blocks and when.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ...core import scratch
from ...kernels.numpy_twins import numpy_kernels
from ...qtypes import QType
from ...spec import ErrorStats, GroupSQNR, QuantSpec, RangeStats, WorstGroups

if TYPE_CHECKING:
    from ...core import Layout

#: what the error kernels take first (see :func:`error_inputs`)
ErrorInputs = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int, int, float, float]
#: each parameter group's ``(x2, e2, emax)`` sums
GroupSums = tuple[np.ndarray, np.ndarray, np.ndarray]


def channel_view(x: np.ndarray, axis: int | None) -> np.ndarray:
    """``x`` as ``[O, C, I]`` with the channel axis in the middle (C = 1 per tensor)."""
    if axis is None:
        return x.reshape(1, 1, -1)
    return x.reshape(math.prod(x.shape[:axis]), x.shape[axis], math.prod(x.shape[axis + 1 :]))


def block_ranges(x: np.ndarray, axis: int | None) -> RangeStats:
    """Exact per-channel ranges of a block (its own channels along ``axis``)."""
    if numpy_kernels():
        from ...kernels.numpy_twins import channel_ranges
    else:
        from ...kernels.stats import channel_ranges

    v = channel_view(x, axis)
    c = v.shape[1]
    stats = RangeStats.empty(c)
    channel_ranges(v, stats.min, stats.max, stats.count, stats.nan, stats.posinf, stats.neginf)
    first = -1
    if stats.nonfinite:
        first = int(np.argmax(~np.isfinite(x.reshape(-1))))
    stats = RangeStats(
        stats.min, stats.max, stats.count, stats.nan, stats.posinf, stats.neginf, first
    )
    return stats


def block_slot_ranges(x: np.ndarray, axis: int, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Finite min/max of each parameter block of a blocked layout (NaN where none is finite).

    Returns arrays shaped like ``x`` with ``x.shape[axis]`` -> ``ceil(/block_size)``.
    """
    from ...core import blocked_param_shape, plan_layout
    from ...kernels.runtime import run
    from ...kernels.stats import slot_ranges

    pshape = blocked_param_shape(x.shape, axis, block_size)
    layout = plan_layout(x.shape, pshape, axis, block_size)
    lo = np.empty(layout.pshape3)
    hi = np.empty(layout.pshape3)
    run(slot_ranges, layout.view(np.ascontiguousarray(x)), layout.cblock, layout.iblock, lo, hi)
    return lo.reshape(pshape), hi.reshape(pshape)


def dynamic_params(
    x: np.ndarray, qt: QType, spec: QuantSpec, axis: int
) -> tuple[np.ndarray, np.ndarray, Layout]:
    """``(scale, zero_point, layout)`` of ``x``'s parameter blocks for a dynamic blocked
    ``spec`` (``axis`` resolved), each block's parameters from its own finite range (a block
    with none gets scale 1)."""
    from ...calibration import params_from_range
    from ...core import plan_layout

    bs = spec.block_size
    assert bs  # (a blocked spec)
    lo, hi = block_slot_ranges(x, axis, bs)
    lo, hi = np.nan_to_num(lo, nan=0.0), np.nan_to_num(hi, nan=0.0)
    s, z = params_from_range(
        lo,
        hi,
        qt,
        symmetric=spec.symmetric,
        narrow_range=spec.narrow_range,
        scale_mode=spec.scale_mode,
        full_levels=spec.full_levels,
    )
    return s, z, plan_layout(x.shape, s.shape, axis, bs)


def fused_applies(qt: QType, spec: QuantSpec) -> bool:
    """Whether :func:`dynamic_blocked` quantizes float32 values to ``qt`` with ``spec``'s
    rounding (integer types of at most 16 bits, half to even)."""
    from ...rounding import round_code

    return (
        not qt.is_float
        and qt.bits <= 16
        and round_code(spec.round_mode) == round_code("half_to_even")
    )


def dynamic_blocked(
    x: np.ndarray, qt: QType, spec: QuantSpec, axis: int, out: np.ndarray, errors: bool = False
) -> tuple[np.ndarray, np.ndarray, Layout, int, tuple[ErrorStats, GroupSums] | None] | None:
    """:func:`dynamic_params` and the quantized values written to ``out`` (``qt``'s dtype,
    shaped like ``x``) in one fused kernel pass, bit-identical to :func:`dynamic_params` then
    ``affine_quantize``: ``(scale, zero_point, layout, nonfinite, sums)``, ``nonfinite`` the
    number of (row, block) pieces holding NaN or infinities (whose codes the caller's NaN
    policy decides). None where the kernel does not apply (float types, int32, float64
    sources, round modes other than half to even).

    ``errors``: where the layout allows (``groups_in_pass``), the same pass also
    takes the error sums: ``sums`` is then ``(stats, (x2, e2, emax))``, the block's
    :class:`ErrorStats` (NaN not yet counted against ``nan_policy``) and each group's sums,
    as :func:`block_errors_fused` would give them; else None."""
    from ...core import blocked_param_shape, buffers, plan_layout
    from ...kernels import blocked
    from ...kernels.error_stats import N_SUMS, NO_GROUPS, groups_in_pass
    from ...kernels.runtime import run

    if x.dtype != np.float32 or not fused_applies(qt, spec):
        return None
    bs = spec.block_size
    assert bs  # (a blocked spec)
    pshape = blocked_param_shape(x.shape, axis, bs)
    layout = plan_layout(x.shape, pshape, axis, bs)
    qmin, qmax = qt.qrange(spec.narrow_range)
    mode, steps, zp = range_mode(qt, spec)
    s = buffers.empty(layout.pshape3, np.float32)  # large ones from the pool, as results
    z = buffers.empty(layout.pshape3, np.float32)  # integers of at most 16 bits: exact
    nonfinite = np.zeros(layout.pshape3[0] * layout.pshape3[1], np.int64)
    errors = errors and groups_in_pass(layout.cblock, layout.iblock, layout.pshape3[2])
    sums = np.zeros((1, N_SUMS))
    groups: GroupSums = (
        (
            scratch("group-0", layout.pshape3, np.float64),
            scratch("group-1", layout.pshape3, np.float64),
            scratch("group-2", layout.pshape3, np.float64),
        )
        if errors
        else (NO_GROUPS,) * 3
    )
    args = (
        layout.view(np.ascontiguousarray(x)),
        layout.cblock,
        layout.iblock,
        mode,
        float(qmin),
        float(qmax),
        steps,
        zp,
        np.float32(qmin),
        np.float32(qt.qmax),
        np.int32(qt.mask if qt.bits < 8 else 0),
        spec.scale_mode,
        s,
        z,
        layout.view(out.view(qt.widened)),
        nonfinite,
        errors,
        sums,
        *groups,
    )
    run(blocked.dynamic_kernel(layout.iblock, finite=True), *args)
    if nonfinite.min(initial=0) < 0:  # NaN or inf: the build that handles them, from the start
        sums[:] = 0.0
        run(blocked.dynamic_kernel(layout.iblock), *args)
    stats = (stats_of(sums), groups) if errors else None
    return s.reshape(pshape), z.reshape(pshape), layout, int(nonfinite.sum()), stats


def range_mode(qt: QType, spec: QuantSpec) -> tuple[int, float, float]:
    """``(mode, steps, zp_sym)``: how :func:`~qstream.kernels.affine.range_params` derives an
    integer spec's parameters from a range in a kernel, as ``params_from_range`` does."""
    from ...calibration import symmetric_steps
    from ...kernels.affine import ASYM, SYM_SIGNED, SYM_UNSIGNED

    if not spec.symmetric:
        return ASYM, 1.0, 0.0
    steps, zp = symmetric_steps(qt, spec.narrow_range, spec.full_levels)
    return SYM_SIGNED if qt.signed else SYM_UNSIGNED, steps, zp


def quantize_spec(
    x: np.ndarray,
    s: np.ndarray,
    z: np.ndarray,
    layout: Layout,
    qt: QType,
    spec: QuantSpec,
    out: np.ndarray,
) -> None:
    """Quantize ``x`` into ``out`` with the parameters ``s``/``z`` and ``spec``'s rounding and
    range (the unfused path)."""
    from ...core import affine_quantize
    from ...rounding import round_code

    affine_quantize(
        x,
        s,
        z,
        layout,
        qt,
        code=round_code(spec.round_mode),
        narrow_range=spec.narrow_range,
        out=out,
    )


def dynamic_quantize(
    x: np.ndarray, qt: QType, spec: QuantSpec, axis: int, out: np.ndarray
) -> tuple[np.ndarray, np.ndarray, Layout, int]:
    """A dynamic blocked spec's ``(scale, zero_point, layout, nonfinite)`` with ``x``
    quantized into ``out``: :func:`dynamic_blocked` where it applies, else
    :func:`dynamic_params` then :func:`quantize_spec` (``nonfinite`` then 0 or 1)."""
    fused = dynamic_blocked(x, qt, spec, axis, out)
    if fused is not None:
        return fused[:4]
    s, z, layout = dynamic_params(x, qt, spec, axis)
    quantize_spec(x, s, z, layout, qt, spec, out)
    return s, z, layout, 0 if np.isfinite(x).all() else 1


def nan_to_zero_point(
    x: np.ndarray, q: np.ndarray, z: np.ndarray, layout: Layout, qt: QType
) -> None:
    """Set the codes in ``q`` of ``x``'s NaN values to their zero points (the ``zero_point``
    NaN policy; integer types)."""
    nan = np.isnan(x)
    zp_e = np.broadcast_to(layout.expand(z), x.shape)
    q[nan] = zp_e[nan].astype(qt.widened).astype(qt.dtype)


def block_errors(
    x: np.ndarray,
    xhat: np.ndarray,
    scale_e: Any,
    zp_e: Any,
    qt: QType,
    lo_q: float,
    hi_q: float,
    axis: int | None,
) -> ErrorStats:
    """Error statistics of one block; ``scale_e``/``zp_e`` broadcast against ``x``."""
    finite = np.isfinite(x)
    xf = np.where(finite, x, 0).astype(np.float64)
    yf = np.where(finite, xhat, 0).astype(np.float64)
    e = xf - yf
    beyond = finite & ((x > (hi_q - zp_e + 0.5) * scale_e) | (x < (lo_q - zp_e - 0.5) * scale_e))
    red = tuple(d for d in range(x.ndim) if d != axis) if axis is not None else None

    def s(a):
        return np.atleast_1d(a.sum(axis=red))

    c = 1 if axis is None else x.shape[axis]
    stats = ErrorStats(
        s(finite.astype(np.int64)),
        s(xf * xf),
        s(e * e),
        s(xf * yf),
        s(yf * yf),
        np.atleast_1d(np.abs(e).max(axis=red)) if x.size else np.zeros(c),
        s(beyond.astype(np.int64)),
        s(np.isnan(x).astype(np.int64)),
        s((x == np.inf).astype(np.int64)),
        s((x == -np.inf).astype(np.int64)),
    )
    return stats


def error_inputs(
    x: np.ndarray,
    q: np.ndarray,
    s: np.ndarray,
    z: np.ndarray,
    layout: Layout,
    qt: QType,
    lo_q: float,
) -> ErrorInputs:
    """The leading arguments of the error kernels: ``x`` (float32/64) and ``q`` (widened) as
    ``[O, C, I]`` views, the parameters in their float type, ``cblock``, ``iblock`` and the
    code range."""
    compute = np.float64 if qt.bits > 16 else np.float32
    xk = np.ascontiguousarray(x, dtype=np.float64 if x.dtype == np.float64 else np.float32)
    qk = np.ascontiguousarray(q).view(qt.dtype)
    if (qt.bits >= 8 or not qt.signed) and qk.itemsize == np.dtype(qt.widened).itemsize:
        qk = qk.view(qt.widened)  # the stored bytes are the codes themselves: no conversion
    else:  # int4/int2 bytes hold the masked code: sign-extended by the conversion
        qk = qk.astype(qt.widened)
    return (
        layout.view(xk),
        layout.view(qk),
        layout.params(np.asarray(s, compute)),
        layout.params(np.asarray(z, compute)),
        layout.cblock,
        layout.iblock,
        float(lo_q),
        float(qt.qmax),
    )


def block_errors_fused(
    x: np.ndarray,
    q: np.ndarray,
    s: np.ndarray,
    z: np.ndarray,
    layout: Layout,
    qt: QType,
    lo_q: float,
    axis: int | None,
    groups: GroupSums | None = None,
) -> ErrorStats:
    """``block_errors`` for integer types, in one fused kernel pass over ``x`` and ``q``."""
    if numpy_kernels():
        from ...kernels.numpy_twins import N_SUMS, error_sums
    else:
        from ...kernels.error_stats import N_SUMS, error_sums

    # (a piece holding one channel has a per-tensor layout: its channel is the tensor's)
    chan_inner = (
        axis is not None and layout.axis is not None and math.prod(x.shape[axis + 1 :]) == 1
    )
    c = 1 if axis is None else x.shape[axis]
    sums = np.zeros((c, N_SUMS))
    error_sums(*error_inputs(x, q, s, z, layout, qt, lo_q), chan_inner, sums, groups)
    return stats_of(sums)


def stats_of(sums: np.ndarray) -> ErrorStats:
    """The :class:`ErrorStats` of the error kernels' ``sums[channels, N_SUMS]``, each figure
    a contiguous array (read many times after): views of ``sums`` where each of its
    figures is contiguous already (``sums`` the transpose of ``[N_SUMS, channels]``), else
    copies."""
    by_figure = np.ascontiguousarray(sums.T)
    n, clip, nan, pinf, ninf = by_figure[[0, 6, 7, 8, 9]].astype(np.int64)
    x2, e2, xy, y2, emax = by_figure[1:6]
    return ErrorStats(n, x2, e2, xy, y2, emax, clip, nan, pinf, ninf)


def block_worst_groups(
    x: np.ndarray,
    q: np.ndarray,
    s: np.ndarray,
    z: np.ndarray,
    layout: Layout,
    qt: QType,
    lo_q: float,
    first: Sequence[int],
    param_shape: tuple[int, ...],
    sums: GroupSums | None = None,
) -> WorstGroups:
    """The worst parameter groups (lowest SQNR) of one quantized piece of a blocked spec.

    ``first``: the piece's first parameter index along each axis; ``param_shape``: the whole
    parameter array's shape (group indices are flat indices into it); ``sums``: the groups'
    ``(x2, e2, emax)`` when the error kernel gave them already (else :func:`group_sums`
    runs). Groups without error are never among the worst. The result also holds the
    distribution of every group's SQNR (:class:`GroupSQNR`, a few passes over the groups).
    """
    if sums is not None:
        return _worst_of(*sums, layout, first, param_shape)
    from ...kernels.error_stats import group_sums
    from ...kernels.runtime import run

    x2, e2, emax = (np.empty(layout.pshape3) for _ in range(3))
    run(group_sums, *error_inputs(x, q, s, z, layout, qt, lo_q), x2, e2, emax)
    return _worst_of(x2, e2, emax, layout, first, param_shape)


def _worst_of(x2, e2, emax, layout, first, param_shape) -> WorstGroups:
    from ...kernels.error_stats import worst_candidates

    x2, e2, emax = x2.reshape(-1), e2.reshape(-1), emax.reshape(-1)
    groups = GroupSQNR.of_sums(x2, e2)
    # a superset of the worst by ratio (a relative slack far above log10's rounding), then
    # their SQNR as before: the same groups and values as ranking every group by SQNR
    lossy = worst_candidates(x2, e2, WorstGroups.KEEP, 1.0 + 1e-9)
    if lossy.size == 0:
        return WorstGroups.of([], [], [], groups)
    with np.errstate(divide="ignore"):
        sqnr = 10.0 * np.log10(x2[lossy] / e2[lossy])
    local = np.unravel_index(lossy, layout.param_shape)
    index = np.ravel_multi_index(
        tuple(i + f for i, f in zip(local, first, strict=True)), tuple(param_shape)
    )
    return WorstGroups.of(sqnr, index, emax[lossy], groups)
