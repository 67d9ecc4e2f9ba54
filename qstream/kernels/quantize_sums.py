"""Quantize a piece whose rows are its channels and sum its errors, in one kernel call.

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
from .affine import QUANTIZE_KERNELS, quantize_tile
from .error_stats import row_sums
from .runtime import parallel_kernel, specialize

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


_builds: dict[int, Any] = {}
_making = threading.Lock()


def fused_kernel(code: int) -> Any:
    """:func:`quantize_rows_sums` for the round code ``code`` (``qstream.rounding``), made on
    first use with the element operation of that code's quantize kernel (``q_<name>`` applies
    ``rounding.<name>``): each code's build compiles and is cached apart
    (``quantize_rows_sums__r<code>``)."""
    kernel = _builds.get(code)
    if kernel is None:
        with _making:
            kernel = _builds.get(code)
            if kernel is None:
                op = getattr(r, QUANTIZE_KERNELS[code].__name__.removeprefix("q_"))
                kernel = _builds[code] = specialize(quantize_rows_sums, f"r{code}", ROUND=op)
    return kernel
