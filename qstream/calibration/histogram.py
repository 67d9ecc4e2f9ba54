"""Thresholds from fixed-edge histograms (edges fixed by an exact min/max pass).

The per-channel searches run in parallel Numba kernels over channels. With ``progress``, the
channels are searched in groups (each taking about ``PROGRESS_SECONDS``) and
``progress(done_channels, total_channels)`` is called after each group.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from ..spec import QuantSpec

Progress = Callable[[int, int], None]  # progress(done_channels, total_channels)

PROGRESS_SECONDS = 0.25  # the work between two progress calls (callback overhead << 1%)
_FIRST_GROUP = 64  # channels per thread in the first (timed) group


def _channel_groups(
    n: int, run_group: Callable[[int, int], None], progress: Progress | None
) -> None:
    """``run_group(c0, c1)`` over ``[0, n)``: once when ``progress`` is None, else in groups
    sized from the time the previous ones took, calling ``progress(c1, n)`` after each."""
    if progress is None:
        run_group(0, n)
        return
    from ..kernels.numpy_twins import kernel_threads

    c0 = 0
    size = _FIRST_GROUP * kernel_threads()
    while c0 < n:
        c1 = min(n, c0 + size)
        t = time.perf_counter()
        run_group(c0, c1)
        dt = time.perf_counter() - t
        progress(c1, n)
        per = dt / (c1 - c0)
        if per > 0:
            size = int(min(max(PROGRESS_SECONDS / per, 1), 4 * size + 1))
        else:
            size *= 4
        c0 = c1


def percentile_range(
    hist: dict[str, Any],
    lo: npt.ArrayLike,
    hi: npt.ArrayLike,
    percentile: float,
    *,
    symmetric: bool,
    progress: Progress | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel range keeping ``percentile`` percent of the values.

    As ONNX Runtime's PercentileCalibrater and NVIDIA's ``_compute_amax_percentile``:
    ``cdf = cumsum(hist / total)``; symmetric (``|x|`` histogram): ``T = edges[searchsorted(cdf,
    p / 100)]`` and the range ``[-T, T]``; asymmetric: ``(100 - p) / 200`` is cut from each side,
    ``[edges[searchsorted(cdf, cut)], edges[searchsorted(cdf, 1 - cut)]]``. The range is then
    clamped to the observed one. ``progress``: see the module.
    """
    from ..kernels.numpy_twins import numpy_kernels

    kernel: Callable[..., None]
    if numpy_kernels():
        from ..kernels.numpy_twins import percentile_ranges as kernel
    else:
        from ..kernels.runtime import run
        from ..kernels.search import percentile_ranges

        kernel = functools.partial(run, percentile_ranges)

    counts = np.ascontiguousarray(hist["counts"], np.int64)
    out_lo, out_hi = np.array(lo, np.float64), np.array(hi, np.float64)
    n = counts.shape[0]

    def per_channel(v: npt.ArrayLike) -> np.ndarray:
        return np.ascontiguousarray(np.broadcast_to(np.asarray(v, np.float64), (n,)))

    hlo, hhi, clo, chi = (per_channel(v) for v in (hist["lo"], hist["hi"], lo, hi))
    flat_lo, flat_hi = out_lo.reshape(n), out_hi.reshape(n)

    def group(c0: int, c1: int) -> None:
        kernel(
            counts[c0:c1],
            hlo[c0:c1],
            hhi[c0:c1],
            clo[c0:c1],
            chi[c0:c1],
            float(percentile),
            bool(symmetric),
            flat_lo[c0:c1],
            flat_hi[c0:c1],
        )

    _channel_groups(n, group, progress)
    return out_lo, out_hi


def method_range(
    hist: dict[str, Any],
    lo: npt.ArrayLike,
    hi: npt.ArrayLike,
    spec: QuantSpec,
    bits: int,
    *,
    progress: Progress | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel range of a histogram method (``spec.method``: percentile, entropy, mse,
    l2) from the channels' histograms ``hist`` and observed ranges ``lo``/``hi``.
    ``progress``: see the module."""
    if spec.method == "percentile":
        return percentile_range(
            hist, lo, hi, spec.percentile, symmetric=spec.symmetric, progress=progress
        )
    return search_range(
        hist, lo, hi, spec.method, bits, symmetric=spec.symmetric, progress=progress
    )


_log_table = None


def _logs() -> np.ndarray:
    global _log_table
    if _log_table is None:
        from ..kernels.search import LOG_TABLE_SIZE, log_table

        _log_table = log_table(LOG_TABLE_SIZE)
    return _log_table


def search_range(
    hist: dict[str, Any],
    lo: npt.ArrayLike,
    hi: npt.ArrayLike,
    method: str,
    bits: int,
    *,
    symmetric: bool,
    progress: Progress | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel range from a threshold search (entropy, mse over ``|x|``; l2 signed).

    entropy: TensorRT KL over ``2**(bits-1)`` levels, candidates from bin 128; mse: NVIDIA's
    bin-centre MSE with ``max_bound = 2**(bits-1) - 1``; l2: PyTorch HistogramObserver's walk
    with ``2**bits`` destination bins (its min/max arithmetic in float32). ``progress``: see
    the module.
    """
    import numba

    from ..kernels import search
    from ..kernels.runtime import run

    counts = np.ascontiguousarray(hist["counts"], np.int64)
    n, nb = counts.shape
    out_lo, out_hi = np.array(lo, np.float64), np.array(hi, np.float64)
    start = min(128, nb)
    nlevels = 2 ** (bits - 1)
    hlo = np.ascontiguousarray(np.broadcast_to(np.asarray(hist["lo"], np.float64), (n,)))
    hhi = np.ascontiguousarray(np.broadcast_to(np.asarray(hist["hi"], np.float64), (n,)))
    found = np.empty(n, np.int64)
    end = np.zeros(n, np.int64)
    code = {"entropy": search.ENTROPY, "mse": search.MSE, "l2": search.L2}[method]
    if method == "entropy":
        idx, off = search.entropy_groups(nlevels, nb)
    else:
        idx, off = np.zeros((2, 1, 1), np.int32), np.zeros((1, 2), np.int64)

    def group(c0: int, c1: int) -> None:
        with numba.parallel_chunksize(1):  # channels' costs differ: hand them out as they go
            run(
                search.channel_searches,
                counts[c0:c1],
                code,
                hlo[c0:c1],
                hhi[c0:c1],
                nlevels,
                start,
                float(2 ** (bits - 1) - 1),
                2**bits,
                _logs(),
                idx,
                off,
                found[c0:c1],
                end[c0:c1],
            )

    _channel_groups(n, group, progress)
    # thresholds as the peers form them (element-wise, the same float operations)
    ok = found >= 0
    flo, fhi = out_lo.reshape(n), out_hi.reshape(n)
    clo = np.broadcast_to(np.asarray(lo, np.float64), (n,))
    chi = np.broadcast_to(np.asarray(hi, np.float64), (n,))
    if method == "l2":
        lo32, hi32 = hlo.astype(np.float32), hhi.astype(np.float32)
        width = (hi32 - lo32) / np.float32(nb)
        a = (lo32 + width * found.astype(np.float32)).astype(np.float64)
        b = (lo32 + width * (end + 1).astype(np.float32)).astype(np.float64)
        flo[ok], fhi[ok] = a[ok], b[ok]
        return out_lo, out_hi
    if method == "entropy":
        t = found.astype(np.float64) * (hhi / nb)
    else:
        t = (found.astype(np.float64) + 0.5) * (hhi / nb)
    if symmetric:
        flo[ok], fhi[ok] = -t[ok], t[ok]
    else:  # Python's max / min: the first argument unless the second is larger / smaller
        neg = -t
        flo[ok] = np.where(neg > clo, neg, clo)[ok]
        fhi[ok] = np.where(t < chi, t, chi)[ok]
    return out_lo, out_hi
