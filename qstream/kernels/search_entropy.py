"""The entropy threshold search (NVIDIA pytorch-quantization / TensorRT
``_compute_amax_entropy``), its direct form and its fast form; see :mod:`.search`."""

from __future__ import annotations

import numpy as np

from .runtime import njit


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
    of ``entropy_search_fast`` (``nbins + 1`` entries each, windows of ``k`` bins in half
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
    """Work arrays of ``entropy_search_fast`` for one channel of ``nbins`` bins (reusable)."""
    ncand = max(0, (nbins - start_bin) // stride + 1)
    cum = np.empty(nbins + 1, np.int64)
    nnz = np.empty(nbins + 1, np.int64)
    xlogx = np.empty(nbins + 1)
    win = np.empty(2 * (nbins + 1))
    kl = np.empty(max(1, ncand))
    err = np.empty(max(1, ncand))
    return cum, nnz, xlogx, win, kl, err


@njit(cache=True, nogil=True)
def entropy_search_fast(
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
def use_windows(nlevels, nbins):
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
    return entropy_search_fast(
        hist,
        nlevels,
        start_bin,
        stride,
        logt,
        idx,
        off,
        use_windows(nlevels, n),
        entropy_scratch(n, start_bin, stride),
    )
