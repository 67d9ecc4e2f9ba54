"""Thresholds from fixed-edge histograms (edges fixed by an exact min/max pass)."""

from __future__ import annotations

import numpy as np


def percentile_range(hist: dict, lo, hi, percentile: float, *, symmetric: bool):
    """Per-channel range keeping ``percentile`` percent of the values (ORT PercentileCalibrater).

    Symmetric: the threshold T is the upper edge of the first bin of the ``|x|`` histogram
    whose cumulative share reaches ``percentile``; the range is ``[-T, T]`` clamped to the
    observed range. Asymmetric: ``(100 - percentile) / 2`` percent is cut from each side.
    """
    counts = hist["counts"]
    nb = counts.shape[1]
    width = (hist["hi"] - hist["lo"]) / nb
    out_lo, out_hi = np.array(lo, np.float64), np.array(hi, np.float64)
    for c in range(counts.shape[0]):
        total = counts[c].sum()
        if total == 0:
            continue
        cdf = np.cumsum(counts[c]) / total
        if symmetric:
            k = int(np.searchsorted(cdf, percentile / 100.0))
            t = hist["lo"][c] + min(k + 1, nb) * width[c]
            out_lo[c] = max(lo[c], -t)
            out_hi[c] = min(hi[c], t)
        else:
            cut = (100.0 - percentile) / 200.0
            k_lo = int(np.searchsorted(cdf, cut))
            k_hi = int(np.searchsorted(cdf, 1.0 - cut))
            out_lo[c] = max(lo[c], hist["lo"][c] + k_lo * width[c])
            out_hi[c] = min(hi[c], hist["lo"][c] + min(k_hi + 1, nb) * width[c])
    return out_lo, out_hi
