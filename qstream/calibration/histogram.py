"""Thresholds from fixed-edge histograms (edges fixed by an exact min/max pass)."""

from __future__ import annotations

import numpy as np


def percentile_range(hist: dict, lo, hi, percentile: float, *, symmetric: bool):
    """Per-channel range keeping ``percentile`` percent of the values.

    As ONNX Runtime's PercentileCalibrater and NVIDIA's ``_compute_amax_percentile``:
    ``cdf = cumsum(hist / total)``; symmetric (``|x|`` histogram): ``T = edges[searchsorted(cdf,
    p / 100)]`` and the range ``[-T, T]``; asymmetric: ``(100 - p) / 200`` is cut from each side,
    ``[edges[searchsorted(cdf, cut)], edges[searchsorted(cdf, 1 - cut)]]``. The range is then
    clamped to the observed one.
    """
    from ..kernels.runtime import run
    from ..kernels.search import percentile_ranges

    counts = np.ascontiguousarray(hist["counts"], np.int64)
    out_lo, out_hi = np.array(lo, np.float64), np.array(hi, np.float64)
    n = counts.shape[0]

    def per_channel(v):
        return np.ascontiguousarray(np.broadcast_to(np.asarray(v, np.float64), (n,)))

    run(
        percentile_ranges,
        counts,
        per_channel(hist["lo"]),
        per_channel(hist["hi"]),
        per_channel(lo),
        per_channel(hi),
        float(percentile),
        bool(symmetric),
        out_lo.reshape(n),
        out_hi.reshape(n),
    )
    return out_lo, out_hi


def method_range(hist: dict, lo, hi, spec, bits: int):
    """Per-channel range of a histogram method (``spec.method``: percentile, entropy, mse,
    l2) from the channels' histograms ``hist`` and observed ranges ``lo``/``hi``."""
    if spec.method == "percentile":
        return percentile_range(hist, lo, hi, spec.percentile, symmetric=spec.symmetric)
    return search_range(hist, lo, hi, spec.method, bits, symmetric=spec.symmetric)


def search_range(hist: dict, lo, hi, method: str, bits: int, *, symmetric: bool):
    """Per-channel range from a threshold search (entropy, mse over ``|x|``; l2 signed).

    entropy: TensorRT KL over ``2**(bits-1)`` levels, candidates from bin 128; mse: NVIDIA's
    bin-centre MSE with ``max_bound = 2**(bits-1) - 1``; l2: PyTorch HistogramObserver's walk
    with ``2**bits`` destination bins (its min/max arithmetic in float32).
    """
    from ..kernels import search
    from ..kernels.runtime import run

    counts = np.ascontiguousarray(hist["counts"], np.int64)
    n, nb = counts.shape
    out_lo, out_hi = np.array(lo, np.float64), np.array(hi, np.float64)
    start = min(128, nb)
    hlo = np.ascontiguousarray(np.broadcast_to(np.asarray(hist["lo"], np.float64), (n,)))
    hhi = np.ascontiguousarray(np.broadcast_to(np.asarray(hist["hi"], np.float64), (n,)))
    found = np.empty(n, np.int64)
    end = np.zeros(n, np.int64)
    code = {"entropy": search.ENTROPY, "mse": search.MSE, "l2": search.L2}[method]
    run(
        search.channel_searches,
        counts,
        code,
        hlo,
        hhi,
        2 ** (bits - 1),
        start,
        float(2 ** (bits - 1) - 1),
        2**bits,
        found,
        end,
    )
    for c in range(n):  # the searches ran in parallel; thresholds as the peers form them
        if found[c] < 0:
            continue
        top = float(hist["hi"][c])
        if method == "l2":
            lo32, hi32 = np.float32(hist["lo"][c]), np.float32(top)
            width = (hi32 - lo32) / np.float32(nb)
            out_lo[c] = float(lo32 + width * np.float32(found[c]))
            out_hi[c] = float(lo32 + width * np.float32(end[c] + 1))
            continue
        if method == "entropy":
            t = int(found[c]) * (top / nb)
        else:
            t = (int(found[c]) + 0.5) * (top / nb)
        if symmetric:
            out_lo[c], out_hi[c] = -t, t
        else:
            out_lo[c], out_hi[c] = max(lo[c], -t), min(hi[c], t)
    return out_lo, out_hi
