"""Quantize a piece whose rows are its channels and sum its errors, in one kernel call (and,
for a one-block job calibrated per channel by its range, take each row's range and parameters
in the same call).

A pack's stacked tensors, and most weight matrices quantized per channel, are one row per
channel, each no longer than a tile (:func:`~qstream.kernels.stats.channel_rows`). Their quantize
kernel and their error kernel each take a row at a time; here one kernel does both for a
row while it is still in the CPU's cache, and the piece takes one call where it took two
a run of rows (in a conversion, each call hands Python's lock to another thread and waits to
take it back).

The codes are the quantize kernel's (the same element operation in
:func:`~qstream.kernels.affine.quantize_tile`) and the sums the error kernel's
(:func:`~qstream.kernels.error_stats.row_sums`, compiled on its own with the error kernels'
fast-math flags), so both are bit-identical to the two kernels'. The codes are written through
the array the sums read (the codes' own type, the integer container's bytes): Numba may
compile a parallel loop as if its arrays never overlapped.
"""

from __future__ import annotations

import threading
from typing import Any

from numba import prange

from . import rounding as r
from .affine import PARTS, QUANTIZE_KERNELS, quantize_run, quantize_tile, range_params
from .error_stats import row_sums
from .runtime import njit, parallel_kernel, specialize, specialize_function
from .stats import fold_counts, row_range

ROUND = r.half_to_even  # the element operation; each round code's build has its own


@parallel_kernel(inputs=6)
def quantize_rows_sums(xq, sq, zq, xe, se, ze, cblock, lo, hi, mask, qmin, qmax, q, sums):
    """Quantize each row ``c`` of ``xq[1, C, I]`` with the parameters ``sq``/``zq[0, c //
    cblock, 0]`` into ``q`` (as :data:`~qstream.kernels.affine.QUANTIZE_KERNELS` do: saturated
    to ``[lo, hi]``, masked), then add its error sums (``xe``, ``q``, ``se``/``ze``, the
    error kernels' arguments) to the row ``c`` of ``sums[C, N_SUMS]``."""
    n = xq.shape[2]
    for c in prange(xq.shape[1]):
        pc = c // cblock
        quantize_tile(xq[0, c], sq[0, pc], zq[0, pc], q[0, c], 0, n, 1, lo, hi, mask, ROUND)
        row_sums(xe[0, c], q[0, c], se[0, pc, 0], ze[0, pc, 0], qmin, qmax, sums[c])


@njit(cache=True, nogil=True, error_model="numpy")  # (as parallel_kernel's builds)
def calibrate_rows(
    c0, c1, xq, xe, mode, pmin, pmax, steps, zp_sym, scale_mode, lo, hi, mask, qmin, qmax,
    mins, maxs, counts, nans, posinf, neginf, scale, zero_point, sq, zq, se, ze, q, sums,
):  # fmt: skip
    """The rows ``c0 .. c1`` of :func:`calibrate_rows_sums`, compiled on its own: the
    parallel loop that calls it compiles in a fraction of the time it takes with this body
    inside it (Numba's parallel passes grow faster than the loop body they analyse)."""
    for c in range(c0, c1):
        mn, mx, k, nan, pinf, ninf = row_range(xe[0, c])
        fold_counts(mn, mx, k, nan, pinf, ninf, c, mins, maxs, counts, nans, posinf, neginf)
        vlo = mins[c] if counts[c] > 0 else 0.0
        vhi = maxs[c] if counts[c] > 0 else 0.0
        s, z = range_params(vlo, vhi, mode, pmin, pmax, steps, zp_sym, scale_mode)
        scale[c] = s
        zero_point[c] = z
        sq[0, c, 0] = s
        zq[0, c, 0] = z
        se[0, c, 0] = s
        ze[0, c, 0] = z
        quantize_run(xq[0, c], sq[0, c, 0], zq[0, c, 0], q[0, c], lo, hi, mask, ROUND)
        row_sums(xe[0, c], q[0, c], se[0, c, 0], ze[0, c, 0], qmin, qmax, sums[c])


CALIBRATE_ROWS = calibrate_rows  # the rows' function of a build (each round code has its own)


@parallel_kernel(inputs=2)
def calibrate_rows_sums(
    xq, xe, mode, pmin, pmax, steps, zp_sym, scale_mode, lo, hi, mask, qmin, qmax,
    mins, maxs, counts, nans, posinf, neginf, scale, zero_point, sq, zq, se, ze, q, sums,
):  # fmt: skip
    """:func:`quantize_rows_sums` of a piece whose parameters come from its rows' own ranges,
    each row its channel (``sq``/``zq``/``se``/``ze``, ``[1, C, 1]``, are written here): per
    row ``c``, the range of ``xe[0, c]`` folded into the ranges kernel's outputs (``mins`` ..
    ``neginf[C]``, as ``stats.channel_ranges`` gives them), its scale and zero point
    (:func:`~qstream.kernels.affine.range_params` of the finite range, 0 where none is
    finite: ``mode``, ``pmin``/``pmax``, ``steps``, ``zp_sym``, ``scale_mode``) into
    ``scale``/``zero_point[C]`` and each parameter array in its own type, then its codes and
    its error sums (:func:`calibrate_rows`, in runs of rows)."""
    n_c = xq.shape[1]
    parts = min(n_c, PARTS)
    for p in prange(parts):
        CALIBRATE_ROWS(
            p * n_c // parts, (p + 1) * n_c // parts, xq, xe, mode, pmin, pmax, steps, zp_sym,
            scale_mode, lo, hi, mask, qmin, qmax, mins, maxs, counts, nans, posinf, neginf,
            scale, zero_point, sq, zq, se, ze, q, sums,
        )  # fmt: skip


_builds: dict[tuple[int, bool], Any] = {}
_making = threading.Lock()


def fused_kernel(code: int, calibrate: bool = False) -> Any:
    """:func:`quantize_rows_sums` (``calibrate``: :func:`calibrate_rows_sums`) for the round
    code ``code`` (``qstream.rounding``), made on first use with the element operation of that
    code's quantize kernel (``q_<name>`` applies ``rounding.<name>``): each code's build
    compiles and is cached apart (``quantize_rows_sums__r<code>``; ``calibrate_rows_sums__r<code>``
    and the rows' function it calls, ``calibrate_rows__r<code>``)."""
    kernel = _builds.get((code, calibrate))
    if kernel is None:
        with _making:
            kernel = _builds.get((code, calibrate))
            if kernel is None:
                op = getattr(r, QUANTIZE_KERNELS[code].__name__.removeprefix("q_"))
                if calibrate:
                    rows = specialize_function(calibrate_rows, f"r{code}", ROUND=op)
                    kernel = specialize(calibrate_rows_sums, f"r{code}", CALIBRATE_ROWS=rows)
                else:
                    kernel = specialize(quantize_rows_sums, f"r{code}", ROUND=op)
                _builds[code, calibrate] = kernel
    return kernel
