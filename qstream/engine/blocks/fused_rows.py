"""Pieces whose rows are their channels (per channel on axis 0, each row no longer than a
tile: a pack's stacked tensors, most weight matrices), each taken by one fused kernel call
(:mod:`qstream.kernels.quantize_sums`) that does for a row, while it is in the CPU's cache,
what separate kernels do over the whole piece, with the same results bit for bit.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from ... import budget
from ...kernels.numpy_twins import numpy_kernels
from ...qtypes import QType
from ...spec import ErrorStats, QuantSpec, RangeStats
from .blockmath import error_inputs, range_mode, stats_of

if TYPE_CHECKING:
    from ...core import Layout


def quantize_rows_with_errors(
    x: np.ndarray,
    s: np.ndarray,
    z: np.ndarray,
    layout: Layout,
    qt: QType,
    spec: QuantSpec,
    out: np.ndarray,
    lo_q: float,
) -> ErrorStats | None:
    """:func:`quantize_spec` then :func:`block_errors_fused` (per channel on axis 0) of a piece
    of at least :data:`~qstream.budget.FUSED_FROM` values whose rows are its channels, each no
    longer than a tile, in one kernel call
    (:func:`~qstream.kernels.quantize_sums.fused_kernel`): each row is quantized, then its
    errors summed while it is still in the CPU's cache. Each row's codes and sums are the two
    kernels', so they are the whole piece's, byte for byte. None where this does not apply;
    the caller then runs both kernels over the whole piece."""
    if numpy_kernels() or x.size < budget.FUSED_FROM:  # (the twins take the whole piece)
        return None
    from ...kernels.runtime import run

    call = _rows_call(x, s, z, layout, qt, spec, out, lo_q)
    if call is None:
        return None
    kernel, (xq, sq, zq, cb, lo, hi, mask), (xe, se, ze, qmin, qmax, qe), sums = call
    run(kernel, xq, sq, zq, xe, se, ze, cb, lo, hi, mask, qmin, qmax, qe, sums)
    return stats_of(sums)


def calibrate_rows_with_errors(
    x: np.ndarray, qt: QType, spec: QuantSpec, out: np.ndarray
) -> tuple[RangeStats, np.ndarray, np.ndarray, ErrorStats] | None:
    """The ranges pass (:func:`block_ranges`), the parameters its ranges give
    (``qstream.calibration.params_from_range`` of each channel's finite range, 0 where none
    is finite) and :func:`quantize_rows_with_errors` of a piece calibrated per channel on axis
    0 whose rows are its channels, in one kernel call that takes each row's range, parameters,
    codes and error sums while the row is in the CPU's cache: ``(ranges, scale (float32),
    zero_point (float64), errors)``, each as the separate passes give it over the piece, bit
    for bit. None where this does not apply (a float type, signed sub-byte codes, rows longer
    than a tile, a parameter per value, the NumPy twins); the caller then runs the passes."""
    if numpy_kernels() or x.ndim < 2 or qt.is_float:
        return None
    from ...core import plan_layout
    from ...kernels.runtime import run

    c = x.shape[0]
    s, z = np.zeros(c, np.float32), np.zeros(c, np.float64)  # (written by the kernel)
    layout = plan_layout(x.shape, (c,), 0, None)
    lo_q, hi_q = qt.qrange(spec.narrow_range)
    call = _rows_call(x, s, z, layout, qt, spec, out, lo_q, calibrate=True)
    if call is None:
        return None
    kernel, (xq, sq, zq, _, lo, hi, mask), (xe, se, ze, qmin, qmax, qe), sums = call
    mode, steps, zp = range_mode(qt, spec)
    st = RangeStats.empty(c)
    derive = (mode, float(lo_q), float(hi_q), steps, zp, spec.scale_mode)
    ranges = (st.min, st.max, st.count, st.nan, st.posinf, st.neginf)
    written = (s, z, sq, zq, se, ze, qe, sums)
    run(kernel, xq, xe, *derive, lo, hi, mask, qmin, qmax, *ranges, *written)
    if st.nonfinite:  # (as block_ranges names it)
        st = replace(st, first_nonfinite=int(np.argmax(~np.isfinite(x.reshape(-1)))))
    return st, s, z, stats_of(sums)


def _rows_call(
    x: np.ndarray,
    s: np.ndarray,
    z: np.ndarray,
    layout: Layout,
    qt: QType,
    spec: QuantSpec,
    out: np.ndarray,
    lo_q: float,
    calibrate: bool = False,
) -> tuple[Any, tuple[Any, ...], tuple[Any, ...], np.ndarray] | None:
    """``(kernel, quantize arguments, error arguments, sums)`` of the fused kernel
    (``calibrate``: the one that calibrates too) for a piece whose rows are its channels,
    each no longer than a tile (per channel on axis 0): the quantize kernel's ``(x, scale,
    zero_point, cblock, lo, hi, mask)``, the error kernel's ``(x, scale, zero_point, qmin,
    qmax, codes)`` (the codes written through them), and ``sums[C, N_SUMS]``; None where
    the kernel does not apply. (Not for the NumPy twins: the caller has checked.)"""
    from ...core import quantize_call
    from ...kernels.error_stats import N_SUMS
    from ...kernels.quantize_sums import fused_kernel
    from ...kernels.stats import channel_rows
    from ...rounding import round_code

    c, i = layout.shape3[1:]
    # (a parameter a row: not a layout of a parameter per element along one row, as a piece
    # of one value per channel has, nor of one row per value, i == 1)
    if layout.axis != 0 or layout.block_size or layout.pshape3 != (1, c, 1) or i < 2:
        return None
    if qt.bits < 8 and qt.signed:  # (int4/int2 codes are sign-extended by a copy: made too soon)
        return None
    if not channel_rows(layout.shape3, c):
        return None
    code = round_code(spec.round_mode)
    call = quantize_call(x, s, z, layout, qt, out, code=code, narrow_range=spec.narrow_range)
    if call is None:
        return None
    _, xq, sq, zq, cb, _, lo, hi, mask, _ = call
    # (the values the quantize kernel reads, when the error kernel reads the same type: a
    # bfloat16 or float16 piece converted once, not twice)
    wanted = np.float64 if x.dtype == np.float64 else np.float32  # (as error_inputs)
    xs = xq.reshape(x.shape) if xq.dtype == wanted else x
    xe, qe, se, ze, _, _, qmin, qmax = error_inputs(xs, out, s, z, layout, qt, lo_q)
    if not np.shares_memory(qe, out):  # (codes widened by a copy: made too soon)
        return None
    sums = np.zeros((N_SUMS, c)).T  # (a channel's sums a row, each figure's contiguous)
    kernel = fused_kernel(code, calibrate)
    return kernel, (xq, sq, zq, cb, lo, hi, mask), (xe, se, ze, qmin, qmax, qe), sums
