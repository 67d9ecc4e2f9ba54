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

``entropy_search`` and ``mse_search`` are fast forms of the direct loops kept here as
``entropy_search_reference`` / ``mse_search_reference`` (O(nbins) work per candidate), and
choose the same bins: they compute every candidate's value another way, with a bound on how
far both computations can be from the exact value, skip candidates whose lower bound is
provably worse than the best, and let the direct loop's arithmetic decide between the
candidates within those bounds of the best. ``l2_search`` sums its errors over the non-empty
bins only, which gives the same floats as ``l2_search_reference`` (empty bins add exactly 0).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .runtime import parallel_kernel


@njit(cache=True, nogil=True)
def entropy_search_reference(hist, nlevels, start_bin, stride):
    """The bin count ``i`` whose clipped distribution has the least KL divergence.

    The direct form, O(nbins) per candidate: the reference ``entropy_search`` reproduces
    (it decides near-ties with ``_entropy_kl_reference``, this loop's arithmetic)."""
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
        kl = _entropy_kl_reference(bins, tail, nlevels, i, gsum, gcnt)
        if kl <= best:  # ties: the last candidate wins
            best = kl
            best_i = i
    return best_i


@njit(cache=True, nogil=True)
def _entropy_kl_reference(bins, tail, nlevels, i, gsum, gcnt):
    """Candidate ``i``'s divergence, the direct way (O(i)): ``entropy_search_reference``'s
    step, also used by the fast search to decide near-ties to the bit."""
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
    return kl


LOG_TABLE_SIZE = 1 << 15


@njit(cache=True, nogil=True)
def log_table(size):
    """``log(k)`` for ``k < size`` (``[0]`` unused)."""
    t = np.zeros(size)
    for k in range(1, size):
        t[k] = np.log(np.float64(k))
    return t


@njit(inline="always", cache=True)
def _log_int(v, logt):
    """``log(v)`` of a positive integer: from the table when it holds it."""
    if v < logt.shape[0]:
        return logt[v]
    return np.log(np.float64(v))


@njit(cache=True, nogil=True)
def entropy_groups(nlevels, nbins):
    """Where candidate ``i = k * nlevels + r``'s quantization groups lie.

    Group ``g`` of candidate ``i`` (the bins ``j < i`` with ``(j * nlevels) // i == g``) is
    ``[ceil(g * i / nlevels), ceil((g + 1) * i / nlevels))``: it starts at
    ``g * k + off[r, g]`` with ``off[r, g] = ceil(g * r / nlevels)`` and holds ``k`` or ``k + 1``
    bins. ``idx[k % 2, r, g]`` is ``off[r, g]`` plus the offset, in the two-half window table
    of ``_entropy_search_fast`` (``nbins + 1`` entries each, windows of ``k`` bins in half
    ``k % 2``), of the half holding group ``g``'s size."""
    m = nbins + 1
    off = np.empty((nlevels, nlevels + 1), np.int64)
    idx = np.empty((2, nlevels, nlevels), np.int32)
    for r in range(nlevels):
        for g in range(nlevels + 1):
            off[r, g] = (g * r + nlevels - 1) // nlevels
        for g in range(nlevels):
            wide = off[r, g + 1] - off[r, g]  # the group holds k + 1 bins
            for p in range(2):
                half = 1 - p if wide else p
                idx[p, r, g] = off[r, g] + half * m
    return idx, off


@njit(cache=True, nogil=True)
def _fill_windows(win, base, size, s0, s1, cum, nnz, logt):
    """``win[base + s] = W * log(W / N)`` for ``s0 <= s <= s1``: ``W`` the count and ``N`` the
    non-empty bins of ``[s, s + size)`` (0 when the window is empty)."""
    for s in range(s0, s1 + 1):
        w = cum[s + size] - cum[s]
        nz = nnz[s + size] - nnz[s]
        if nz > 0:
            win[base + s] = w * (_log_int(w, logt) - _log_int(nz, logt))
        else:
            win[base + s] = 0.0


@njit(cache=True, nogil=True)
def entropy_scratch(nbins, start_bin, stride):
    """Work arrays of ``_entropy_search_fast`` for one channel of ``nbins`` bins (reusable)."""
    ncand = max(0, (nbins - start_bin) // stride + 1)
    cum = np.empty(nbins + 1, np.int64)
    nnz = np.empty(nbins + 1, np.int64)
    xlogx = np.empty(nbins + 1)
    win = np.empty(2 * (nbins + 1))
    kl = np.empty(max(1, ncand))
    err = np.empty(max(1, ncand))
    return cum, nnz, xlogx, win, kl, err


@njit(cache=True, nogil=True)
def _entropy_search_fast(
    hist, nlevels, start_bin, stride, logt, idx, off, windows, scratch, slack=1.0
):
    """``entropy_search`` with its tables and work arrays given (see there); ``slack`` > 1
    widens the error bounds (tests: more near-ties decided by the direct loop)."""
    n = hist.shape[0]
    if start_bin > n:  # no candidate
        return start_bin
    L = nlevels
    cum, nnz, xlogx, win, klv, err = scratch
    # prefix sums over the bins (bins[0] = bins[1], as TensorRT): counts and non-empty bins
    # exactly (int64), sum of b * log(b) in float64
    cum[0] = 0
    nnz[0] = 0
    xlogx[0] = 0.0
    for j in range(n):
        v = hist[1] if (j == 0 and n > 1) else hist[j]
        b = np.int64(v)
        if b != v or b < 0 or b > 2**52:  # not a count histogram: the direct search
            return entropy_search_reference(hist, nlevels, start_bin, stride)
        cum[j + 1] = cum[j] + b
        nnz[j + 1] = nnz[j] + (1 if b != 0 else 0)
        xlogx[j + 1] = xlogx[j] + (b * _log_int(b, logt) if b > 1 else 0.0)
        if cum[j + 1] > 2**52:
            return entropy_search_reference(hist, nlevels, start_bin, stride)
    total = cum[n]
    ncand = (n - start_bin) // stride + 1
    last = start_bin + (ncand - 1) * stride
    if total == 0:  # every divergence is 0: the last candidate
        return last
    log_total = _log_int(total, logt)
    # error bounds (see entropy_search): this formula's and the direct loop's, per candidate
    lg = log_total + 1.0
    e_fast = slack * 2.0**-52 * (n + L + 30) * lg
    err_max = e_fast + slack * 2.0**-52 * ((n + 6) + 2.0 * (n + 2) * lg)
    half_k = np.array([-1, -1])  # window size held by each half of `win`
    half_n = np.array([0, 0])  # windows built in each half
    m = n + 1
    best = np.inf
    best_t = -1
    # from the last candidate down (the clipping cost grows downwards): a candidate whose
    # lower bound exceeds the best so far by more than the error bounds is skipped
    for t in range(ncand - 1, -1, -1):
        i = start_bin + t * stride
        k = i // L
        r = i - k * L
        tail = total - cum[i]
        blast = cum[i] - cum[i - 1]
        klv[t] = np.inf
        err[t] = 0.0
        if blast == 0 and tail > 0:  # the clipped mass lands in an empty bin of Q
            continue
        glast = ((i - 1) * L) // i  # the last group [sl, i) also receives the clipped tail
        sl = (glast * i + L - 1) // L
        gl = cum[i] - cum[sl]
        if tail > 0 and best < np.inf:
            # KL(P || Q) >= KL of the group masses (log-sum inequality): the other groups
            # hold (Q - G_l) / B of P and (Q - G_l) / Q of Q, the last (G_l + T) / B and G_l / Q
            lq = _log_int(cum[i], logt) - log_total
            t1 = (cum[i] - gl) / total * lq
            t2 = (gl + tail) / total * (_log_int(gl + tail, logt) - _log_int(gl, logt) + lq)
            lb = (t1 + t2) - 2.0**-40 * (abs(t1) + abs(t2) + lg)
            if lb > best + 4.0 * err_max:
                continue
        s = 0.0
        if windows:
            top = min(n, k * L + L - 1)  # the last candidate of this k
            for size in (k, k + 1):
                p = size & 1
                upto = top - size
                if half_k[p] != size:
                    half_k[p] = size
                    half_n[p] = 0
                if half_n[p] <= upto:
                    _fill_windows(win, p * m, size, half_n[p], upto, cum, nnz, logt)
                    half_n[p] = upto + 1
            row = idx[k & 1, r]
            s0 = 0.0
            s1 = 0.0
            s2 = 0.0
            s3 = 0.0
            g = 0
            gk = 0
            while g + 4 <= L:
                s0 += win[gk + row[g]]
                s1 += win[gk + k + row[g + 1]]
                s2 += win[gk + 2 * k + row[g + 2]]
                s3 += win[gk + 3 * k + row[g + 3]]
                g += 4
                gk += 4 * k
            while g < L:
                s0 += win[gk + row[g]]
                g += 1
                gk += k
            s = (s0 + s1) + (s2 + s3)
        else:
            orow = off[r]
            c0 = 0
            z0 = 0
            gk = 0
            for g in range(L):
                gk += k
                e = gk + orow[g + 1]
                c1 = cum[e]
                z1 = nnz[e]
                if z1 > z0:
                    w = c1 - c0
                    s += w * (_log_int(w, logt) - _log_int(z1 - z0, logt))
                c0 = c1
                z0 = z1
        tl = 0.0
        if tail > 0:
            tl = tail * (_log_int(gl, logt) - _log_int(nnz[i] - nnz[sl], logt))
        pl = blast + tail
        plogp = pl * _log_int(pl, logt) if pl > 1 else 0.0
        x = xlogx[i - 1] + plogp - s - tl
        kl = x / total + (_log_int(cum[i], logt) - log_total)
        if kl != kl:  # cannot happen for counts; stay safe
            return entropy_search_reference(hist, nlevels, start_bin, stride)
        klv[t] = kl
        err[t] = e_fast + slack * 2.0**-52 * ((i + 6) + 2.0 * (i + 2) * lg)
        if kl < best:
            best = kl
            best_t = t
    if best_t < 0:  # every candidate infinite: the last one wins the ties
        return last
    lim = klv[best_t] + err[best_t]
    close = 0
    only = -1
    for t in range(ncand):
        if klv[t] - err[t] <= lim:
            close += 1
            only = t
    if close == 1:
        return start_bin + only * stride
    # near-ties: decide them with the direct loop's own values
    bins = hist.astype(np.float64)
    if n > 1:
        bins[0] = bins[1]
    tailv = np.zeros(n + 1)
    for j in range(n - 1, -1, -1):
        tailv[j] = tailv[j + 1] + bins[j]
    gsum = np.zeros(L)
    gcnt = np.zeros(L)
    best = np.inf
    best_i = start_bin
    for t in range(ncand):
        if klv[t] - err[t] <= lim:
            i = start_bin + t * stride
            kl = _entropy_kl_reference(bins, tailv, L, i, gsum, gcnt)
            if kl <= best:
                best = kl
                best_i = i
    return best_i


@njit(inline="always", cache=True)
def _use_windows(nlevels, nbins):
    """Window tables (O(nbins^2 / nlevels) entries) pay off when ``nlevels`` is large."""
    return nbins < 2 * nlevels * nlevels


@njit(cache=True, nogil=True)
def entropy_search(hist, nlevels, start_bin, stride):
    """The bin count ``i`` whose clipped distribution has the least KL divergence.

    NVIDIA / TensorRT ``_compute_amax_entropy``: for each candidate ``i``, P = ``bins[:i]``
    with the clipped tail ``sum(bins[i:])`` added into ``P[i-1]``; Q merges ``bins[:i]`` into
    ``nlevels`` groups ``g = (j * nlevels) // i`` and spreads each group's count evenly over
    its non-empty bins; the last argmin of KL(P || Q) wins. The same choice as
    ``entropy_search_reference`` (the direct O(i) loop per candidate), in O(nlevels) per
    candidate:

    with ``b`` the bins, ``B = sum(b)``, ``T = sum(b[i:])``, ``G_g`` / ``N_g`` group ``g``'s
    count / non-empty bins (prefix sums), ``m_g = G_g / N_g`` and ``p_l = b[i-1] + T``::

        KL(i) = [ sum_{j<i-1} b_j log b_j + p_l log p_l - sum_g G_g log m_g
                  - T log m_last ] / B + log((B - T) / B)

    (infinite when ``b[i-1] == 0 < T``). With nlevels large the terms ``G log m`` of every
    window of ``k`` and ``k + 1`` bins (the group sizes of candidates ``k * nlevels <= i <
    (k + 1) * nlevels``) are tabulated once and a candidate sums ``nlevels`` of them.

    Rounding differs from the direct loop's: each candidate carries a bound on both
    computations' float64 error (``O((nbins + nlevels) * eps * log B)``, from the counts being
    integers); the candidates within those bounds of the smallest are evaluated again by the
    direct loop's arithmetic, which decides ties exactly as it does. Histograms that are not
    integer counts take the direct loop.
    """
    n = hist.shape[0]
    logt = log_table(min(LOG_TABLE_SIZE, 2 * n + 2))
    idx, off = entropy_groups(nlevels, n)
    return _entropy_search_fast(
        hist,
        nlevels,
        start_bin,
        stride,
        logt,
        idx,
        off,
        _use_windows(nlevels, n),
        entropy_scratch(n, start_bin, stride),
    )


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
    """Work arrays of ``_mse_search_fast`` for one channel of ``nbins`` bins (reusable)."""
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
def _mse_search_fast(hist, hi, max_bound, start_bin, stride, scratch, slack=1.0):
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
    return _mse_search_fast(hist, hi, max_bound, start_bin, stride, mse_scratch(hist.shape[0]))


@njit(inline="always", cache=True)
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


ENTROPY, MSE, L2 = 0, 1, 2
CHANNELS_PER_TASK = 4  # channels one prange iteration searches with one set of work arrays


@parallel_kernel
def channel_searches(
    counts, method, hlo, hhi, nlevels, start, max_bound, dst_nbins, logt, idx, off, a, b
):
    """The threshold search of every non-empty channel, in parallel: ``a[c]`` the bin index
    (entropy, mse) or start bin (l2, with ``b[c]`` its end bin); -1 for an empty channel and,
    for mse, an all-zero one (``hhi[c] == 0``): such channels keep their observed range.

    The same results as ``entropy_search`` / ``mse_search`` / ``l2_search`` channel by
    channel; ``logt`` is ``log_table(...)``, ``idx, off = entropy_groups(nlevels, nbins)``."""
    nc, nb = counts.shape
    windows = _use_windows(nlevels, nb)
    tasks = (nc + CHANNELS_PER_TASK - 1) // CHANNELS_PER_TASK
    for q in prange(tasks):
        es = entropy_scratch(nb, start, 1)
        ms = mse_scratch(nb)
        for c in range(q * CHANNELS_PER_TASK, min(nc, (q + 1) * CHANNELS_PER_TASK)):
            total = 0
            for i in range(nb):
                total += counts[c, i]
            if total == 0 or (method == MSE and not hhi[c] > 0):
                a[c] = -1  # empty, or all zeros (no mse candidate: amax 0 divides by 0)
                continue
            if method == ENTROPY:
                a[c] = _entropy_search_fast(
                    counts[c], nlevels, start, 1, logt, idx, off, windows, es
                )
            elif method == MSE:
                a[c] = _mse_search_fast(counts[c], hhi[c], max_bound, start, 1, ms)
            else:
                s, e = l2_search(counts[c], hlo[c], hhi[c], dst_nbins)
                a[c] = s
                b[c] = e
