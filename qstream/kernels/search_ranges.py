"""The MSE and L2 threshold searches and the percentile ranges, each with its direct form; see
:mod:`.search`."""

from __future__ import annotations

import numpy as np
from numba import prange

from .runtime import helper, njit, parallel_kernel


@njit(cache=True, nogil=True)
def mse_search_reference(hist, hi, max_bound, start_bin, stride):
    """Index of the bin centre that, used as amax, minimises the histogram-weighted MSE.

    The direct form (every bin of every candidate, summed in bin order): the reference
    ``mse_search`` reproduces."""
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
def _mse_terms(centers, counts, m, scale, max_bound, out):
    """The reference's float32 terms ``(fq(c) - c)**2 * count`` of ``m`` bins (element-wise
    IEEE operations: vectorised, the same values)."""
    lo = np.float32(-max_bound - 1)
    hi = np.float32(max_bound)
    for k in range(m):
        q = np.rint(centers[k] * scale)
        q = min(max(q, lo), hi) / scale
        d = q - centers[k]
        out[k] = d * d * counts[k]


@njit(cache=True, nogil=True, fastmath={"reassoc"})
def _sum_any_order(v, m):
    """``sum(float64(v[:m]))`` in whatever order is fastest (reassociated, vectorised)."""
    s = 0.0
    for k in range(m):
        s += np.float64(v[k])
    return s


@njit(cache=True, nogil=True)
def _sum_in_order(v, m):
    """``sum(float64(v[:m]))`` in order, as the reference accumulates."""
    s = 0.0
    for k in range(m):
        s += np.float64(v[k])
    return s


@njit(cache=True, nogil=True)
def mse_scratch(nbins):
    """Work arrays of ``mse_search_fast`` for one channel of ``nbins`` bins (reusable)."""
    return (
        np.empty(nbins, np.float32),
        np.empty(nbins, np.float32),
        np.empty(nbins, np.float32),
        np.empty(max(1, nbins)),
        np.empty(nbins, np.int64),
        np.empty((3, nbins + 1)),
    )


@njit(inline="always", cache=True)
def _centre(i, hi, n):
    """Bin centre ``i`` as the reference forms it (float32 edges from float64 ``k * (hi / n)``)."""
    return (np.float32((i + 1) * (hi / n)) + np.float32(i * (hi / n))) / np.float32(2)


@njit(cache=True, nogil=True)
def mse_search_fast(hist, hi, max_bound, start_bin, stride, scratch, slack=1.0):
    """``mse_search`` with its work arrays given (see there); ``slack`` > 1 widens the
    near-tie bound (tests: more ties decided by summing in bin order)."""
    n = hist.shape[0]
    # every term of an empty bin is +0.0 (adds nothing) when the fake-quantized centres are
    # finite: 1e-20 < hi < 1e18, an integer 1 <= max_bound < 2**22 and a finite scale;
    # otherwise the reference
    if not (1e-20 < hi < 1e18 and 1.0 <= max_bound < 2.0**22 and max_bound % 1.0 == 0.0):
        return mse_search_reference(hist, hi, max_bound, start_bin, stride)
    cen, cnt, terms, sums, pos, suf = scratch
    m = 0
    for k in range(n):  # the non-empty bins' centres and counts (as the reference forms them)
        c = np.float32(hist[k])
        if not c >= 0:
            return mse_search_reference(hist, hi, max_bound, start_bin, stride)
        if c != 0:
            cen[m] = _centre(k, hi, n)
            cnt[m] = c
            pos[m] = k
            m += 1
    ncand = max(0, (n - 1 - start_bin) // stride + 1)
    if ncand == 0:
        return start_bin
    # suffix sums of count, c * count, c**2 * count (float64) for the clipping lower bound
    suf[0, m] = 0.0
    suf[1, m] = 0.0
    suf[2, m] = 0.0
    for j in range(m - 1, -1, -1):
        c = np.float64(cen[j])
        w = np.float64(cnt[j])
        suf[0, j] = suf[0, j + 1] + w
        suf[1, j] = suf[1, j + 1] + c * w
        suf[2, j] = suf[2, j + 1] + c * c * w
    top = np.float32(max_bound)
    best = np.inf
    j = m
    # from the top down (the optimum is usually near it): a candidate whose clipped bins
    # alone (every bin >= i lands on the top level q = max_bound) provably cost more than the
    # best so far is skipped; each term is (V - c)**2 * count to within 4 float32 roundings
    for t in range(ncand - 1, -1, -1):
        i = start_bin + t * stride
        scale = np.float32(max_bound) / _centre(i, hi, n)
        if not scale < np.inf:
            return mse_search_reference(hist, hi, max_bound, start_bin, stride)
        while j > 0 and pos[j - 1] >= i:
            j -= 1
        if best < np.inf and j < m:
            v = np.float64(top / scale)
            a = v * v * suf[0, j]
            b = 2.0 * v * suf[1, j]
            clip = (a - b + suf[2, j]) - 2.0**-50 * (n + 8) * (a + b + suf[2, j])
            clip -= 2.0**-140 * (suf[0, j] + m)  # float32 underflow of tiny terms
            if clip * (1.0 - 2.0**-20) > best * (1.0 + 2.0**-20):
                sums[t] = np.inf
                continue
        _mse_terms(cen, cnt, m, scale, max_bound, terms)
        s = _sum_any_order(terms, m)
        sums[t] = s
        best = min(best, s)
    if not best < np.inf:  # overflowing terms: the reference's own arithmetic
        return mse_search_reference(hist, hi, max_bound, start_bin, stride)
    # both orders of summing m non-negative float64 terms are within (m - 1) * 2**-53
    # (relative) of the exact sum; candidates within twice that (and margin) of the smallest
    # are summed again in bin order, which decides ties as the reference does
    lim = best + best * (slack * 8.0 * (m + 2) * 2.0**-53)
    close = 0
    only = -1
    for u in range(ncand):
        if sums[u] <= lim:
            close += 1
            only = u
    if close == 1:
        return start_bin + only * stride
    best = np.inf
    best_i = start_bin
    for u in range(ncand):
        if sums[u] <= lim:
            i = start_bin + u * stride
            _mse_terms(cen, cnt, m, np.float32(max_bound) / _centre(i, hi, n), max_bound, terms)
            acc = _sum_in_order(terms, m)
            if acc < best:
                best = acc
                best_i = i
    return best_i


@njit(cache=True, nogil=True)
def mse_search(hist, hi, max_bound, start_bin, stride):
    """Index of the bin centre that, used as amax, minimises the histogram-weighted MSE.

    NVIDIA ``_compute_amax_mse``: for each candidate ``amax = centers[i]`` the bin centres
    are fake-quantized in float32 (``scale = max_bound / amax``, ``rint``, clamp, ``/
    scale``) and ``sum((fq(c) - c)**2 * count)`` is formed; the first argmin wins. The same
    choice as ``mse_search_reference``, faster: empty bins add exactly nothing and are
    skipped, the float32 terms are the same (vectorised), and their float64 sum is taken in
    any order; the candidates within the two orders' rounding bound of the smallest are
    summed again in bin order, which decides ties exactly as the reference does.
    """
    return mse_search_fast(hist, hi, max_bound, start_bin, stride, mse_scratch(hist.shape[0]))


@helper
def _l2_term(hist, k, start, bin_width, dst_w, dst_nbins):
    """Bin ``k``'s share of PyTorch's analytic L2 error for the range ``start ..`` on a grid of
    ``dst_nbins`` bins of width ``dst_w``."""
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
    return norm


@njit(cache=True, nogil=True)
def _l2_error(hist, bin_width, start, end, dst_nbins):
    dst_w = bin_width * (end - start + 1) / dst_nbins
    if dst_w == 0.0:
        return 0.0
    total = 0.0
    for k in range(hist.shape[0]):
        total += _l2_term(hist, k, start, bin_width, dst_w, dst_nbins)
    return total


@njit(cache=True, nogil=True)
def _l2_walk(h, bin_width, dst_nbins, bins, m):
    """PyTorch's greedy quantile walk over the float64 histogram ``h``; the L2 error of a
    range sums every bin (``m < 0``, the reference) or the ``m`` non-empty ``bins``."""
    nb = h.shape[0]
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
        if m < 0:
            norm = _l2_error(h, bin_width, next_start, next_end, dst_nbins)
        else:
            norm = _l2_error_of(h, bins, m, bin_width, next_start, next_end, dst_nbins)
        if norm > norm_min:
            break
        norm_min = norm
        start = next_start
        end = next_end
    return start, end


@njit(cache=True, nogil=True)
def l2_search_reference(hist, lo, hi, dst_nbins):
    """PyTorch's greedy walk: returns the (start_bin, end_bin) that bound the chosen range.

    The direct form (every bin in every error): the reference ``l2_search`` reproduces."""
    nb = hist.shape[0]
    h = hist.astype(np.float64)
    bin_width = (hi - lo) / nb
    return _l2_walk(h, bin_width, dst_nbins, np.empty(0, np.int64), -1)


@njit(cache=True, nogil=True)
def _l2_error_of(hist, bins, m, bin_width, start, end, dst_nbins):
    """``_l2_error`` over the bins ``bins[:m]`` only (the same terms in the same order)."""
    dst_w = bin_width * (end - start + 1) / dst_nbins
    if dst_w == 0.0:
        return 0.0
    total = 0.0
    for j in range(m):
        total += _l2_term(hist, bins[j], start, bin_width, dst_w, dst_nbins)
    return total


@njit(cache=True, nogil=True)
def l2_search(hist, lo, hi, dst_nbins):
    """PyTorch's greedy walk: returns the (start_bin, end_bin) that bound the chosen range.

    ``HistogramObserver._non_linear_param_search``: move whichever end trims more bins by a
    quantile step of 1e-5, compute the analytic L2 error of the ``dst_nbins`` grid over the
    kept range, stop at the first increase. The same walk as ``l2_search_reference``, whose
    errors sum every bin: an empty bin's term is exactly +-0 (finite factors times a zero
    density) and adds nothing, so only the non-empty bins are summed, in the same order.
    """
    nb = hist.shape[0]
    h = hist.astype(np.float64)
    bin_width = (hi - lo) / nb
    if not abs(bin_width) * nb < 1e100:  # cubes could overflow: every bin, as the reference
        return l2_search_reference(hist, lo, hi, dst_nbins)
    bins = np.empty(nb, np.int64)
    m = 0
    for k in range(nb):
        if h[k] != 0:
            bins[m] = k
            m += 1
    return _l2_walk(h, bin_width, dst_nbins, bins, m)


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


@parallel_kernel(serial_scale=64)  # a bin is read once: threads pay off for many channels only
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
