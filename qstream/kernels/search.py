"""Threshold searches over fixed-edge histograms (Numba, no I/O).

Each reproduces a peer's published algorithm step for step, so that given the same histogram
it picks the same threshold:

- ``entropy_search``: NVIDIA pytorch-quantization / TensorRT ``_compute_amax_entropy`` (KL
  divergence between the clipped reference and its ``nlevels``-level quantization, last
  argmin). Candidates are bin counts ``i``; the threshold is edge ``i``.
- ``mse_search``: NVIDIA ``_compute_amax_mse`` (fake-quantize bin centres, float32, first
  argmin). Returns the chosen centre index.
- ``l2_search``: PyTorch ``HistogramObserver._non_linear_param_search`` (greedy quantile walk,
  analytic L2 error, stop at the first increase). Returns (start_bin, end_bin).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange


@njit(cache=True, nogil=True)
def entropy_search(hist, nlevels, start_bin, stride):
    """The bin count ``i`` whose clipped distribution has the least KL divergence."""
    n = hist.shape[0]
    bins = hist.astype(np.float64)
    if n > 1:
        bins[0] = bins[1]  # suppress the spike at zero, as TensorRT does
    tail = np.zeros(n + 1)
    for j in range(n - 1, -1, -1):
        tail[j] = tail[j + 1] + bins[j]
    gsum = np.zeros(nlevels)
    gcnt = np.zeros(nlevels)
    best = np.inf
    best_i = start_bin
    for i in range(start_bin, n + 1, stride):
        gsum[:] = 0.0
        gcnt[:] = 0.0
        for j in range(i):
            if bins[j] != 0:
                g = (j * nlevels) // i
                gsum[g] += bins[j]
                gcnt[g] += 1.0
        p_total = tail[0]
        q_total = 0.0
        for j in range(i):
            if bins[j] != 0:
                g = (j * nlevels) // i
                q_total += gsum[g] / gcnt[g]
        kl = 0.0
        for j in range(i):
            p = bins[j] + (tail[i] if j == i - 1 else 0.0)
            if p <= 0:
                continue
            if bins[j] == 0:
                kl = np.inf
                break
            g = (j * nlevels) // i
            pk = p / p_total
            qk = (gsum[g] / gcnt[g]) / q_total
            kl += pk * np.log(pk / qk)
        if kl <= best:  # ties: the last candidate wins
            best = kl
            best_i = i
    return best_i


@njit(cache=True, nogil=True)
def mse_search(hist, hi, max_bound, start_bin, stride):
    """Index of the bin centre that, used as amax, minimises the histogram-weighted MSE."""
    n = hist.shape[0]
    counts = hist.astype(np.float32)
    edges = np.empty(n + 1, np.float32)
    for k in range(n + 1):
        edges[k] = np.float32(k * (hi / n))
    centers = np.empty(n, np.float32)
    for k in range(n):
        centers[k] = (edges[k + 1] + edges[k]) / np.float32(2)
    best = np.inf
    best_i = start_bin
    for i in range(start_bin, n, stride):
        amax = centers[i]
        scale = np.float32(max_bound) / amax
        acc = 0.0
        for k in range(n):
            q = np.rint(centers[k] * scale)
            q = min(max(q, np.float32(-max_bound - 1)), np.float32(max_bound)) / scale
            d = q - centers[k]
            acc += np.float64(d * d * counts[k])
        if acc < best:  # ties: the first candidate wins
            best = acc
            best_i = i
    return best_i


@njit(cache=True, nogil=True)
def _l2_error(hist, bin_width, start, end, dst_nbins):
    nb = hist.shape[0]
    dst_w = bin_width * (end - start + 1) / dst_nbins
    if dst_w == 0.0:
        return 0.0
    total = 0.0
    for k in range(nb):
        density = hist[k] / bin_width
        b = (k - start) * bin_width
        e = b + bin_width
        db = min(max(np.floor(b / dst_w), 0.0), dst_nbins - 1.0)
        de = min(max(np.floor(e / dst_w), 0.0), dst_nbins - 1.0)
        lo = b - (db + 0.5) * dst_w
        hi = dst_w / 2
        norm = density * (hi * hi * hi - lo * lo * lo) / 3
        norm += (de - db - 1) * density * (hi * hi * hi - (-hi) * (-hi) * (-hi)) / 3
        lo2 = -dst_w / 2
        hi2 = e - (de * dst_w + dst_w / 2)
        norm += density * (hi2 * hi2 * hi2 - lo2 * lo2 * lo2) / 3
        total += norm
    return total


@njit(cache=True, nogil=True)
def l2_search(hist, lo, hi, dst_nbins):
    """PyTorch's greedy walk: returns the (start_bin, end_bin) that bound the chosen range."""
    nb = hist.shape[0]
    h = hist.astype(np.float64)
    bin_width = (hi - lo) / nb
    csum = np.cumsum(h)
    total = csum[-1]
    stepsize = 1e-5
    alpha = 0.0
    beta = 1.0
    start = 0
    end = nb - 1
    norm_min = np.inf
    while alpha < beta:
        next_alpha = alpha + stepsize
        next_beta = beta - stepsize
        left = start
        right = end
        while left < end and csum[left] < next_alpha * total:
            left += 1
        while right > start and csum[right] > next_beta * total:
            right -= 1
        next_start = start
        next_end = end
        if (left - start) > (end - right):
            next_start = left
            alpha = next_alpha
        else:
            next_end = right
            beta = next_beta
        if next_start == start and next_end == end:
            continue
        norm = _l2_error(h, bin_width, next_start, next_end, dst_nbins)
        if norm > norm_min:
            break
        norm_min = norm
        start = next_start
        end = next_end
    return start, end


@njit(inline="always", cache=True)
def _py_max(a, b):
    """Python's ``max(a, b)``: ``a`` unless ``b`` is greater (so ``max(0.0, -0.0)`` is 0.0)."""
    return b if b > a else a


@njit(inline="always", cache=True)
def _py_min(a, b):
    """Python's ``min(a, b)``: ``a`` unless ``b`` is smaller."""
    return b if b < a else a


@njit(inline="always", cache=True)
def _linspace_at(start, stop, nb, i):
    """``np.linspace(start, stop, nb + 1)[i]``, computed as NumPy does."""
    if i == nb:
        return stop
    delta = stop - start
    step = delta / nb
    if step == 0:
        return (i / nb) * delta + start
    return i * step + start


@njit(inline="always", cache=True)
def _search_left(counts, total, v):
    """``np.searchsorted(np.cumsum(counts / total), v)`` (left), without the arrays."""
    acc = 0.0
    for i in range(counts.size):
        acc += counts[i] / total
        if acc >= v:
            return i
    return counts.size


@njit(parallel=True, cache=True, nogil=True)
def percentile_ranges(counts, hlo, hhi, lo, hi, percentile, symmetric, out_lo, out_hi):
    """Per channel (in parallel) what ``qstream.calibration.histogram.percentile_range``
    computes channel by channel, with the same float64 operations in the same order."""
    nb = counts.shape[1]
    for c in prange(counts.shape[0]):
        total = 0
        for i in range(nb):
            total += counts[c, i]
        if total == 0:
            out_lo[c] = lo[c]
            out_hi[c] = hi[c]
            continue
        if symmetric:
            t = _linspace_at(hlo[c], hhi[c], nb, _search_left(counts[c], total, percentile / 100.0))
            out_lo[c] = _py_max(lo[c], -t)
            out_hi[c] = _py_min(hi[c], t)
        else:
            cut = (100.0 - percentile) / 200.0
            a = _linspace_at(hlo[c], hhi[c], nb, _search_left(counts[c], total, cut))
            b = _linspace_at(hlo[c], hhi[c], nb, _search_left(counts[c], total, 1.0 - cut))
            out_lo[c] = _py_max(lo[c], a)
            out_hi[c] = _py_min(hi[c], b)


ENTROPY, MSE, L2 = 0, 1, 2


@njit(parallel=True, cache=True, nogil=True)
def channel_searches(counts, method, hlo, hhi, nlevels, start, max_bound, dst_nbins, a, b):
    """The threshold search of every non-empty channel, in parallel: ``a[c]`` the bin index
    (entropy, mse) or start bin (l2, with ``b[c]`` its end bin); -1 for an empty channel."""
    for c in prange(counts.shape[0]):
        total = 0
        for i in range(counts.shape[1]):
            total += counts[c, i]
        if total == 0:
            a[c] = -1
            continue
        if method == ENTROPY:
            a[c] = entropy_search(counts[c], nlevels, start, 1)
        elif method == MSE:
            a[c] = mse_search(counts[c], hhi[c], max_bound, start, 1)
        else:
            s, e = l2_search(counts[c], hlo[c], hhi[c], dst_nbins)
            a[c] = s
            b[c] = e
