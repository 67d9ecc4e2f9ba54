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

from numba import prange

from .runtime import parallel_kernel
from .search_entropy import (
    LOG_TABLE_SIZE,
    entropy_groups,
    entropy_scratch,
    entropy_search,
    entropy_search_fast,
    entropy_search_reference,
    log_table,
    use_windows,
)
from .search_ranges import (
    l2_search,
    l2_search_reference,
    mse_scratch,
    mse_search,
    mse_search_fast,
    mse_search_reference,
    percentile_ranges,
)

__all__ = [
    "CHANNELS_PER_TASK",
    "ENTROPY",
    "L2",
    "LOG_TABLE_SIZE",
    "MSE",
    "channel_searches",
    "entropy_groups",
    "entropy_scratch",
    "entropy_search",
    "entropy_search_fast",
    "entropy_search_reference",
    "l2_search",
    "l2_search_reference",
    "log_table",
    "mse_scratch",
    "mse_search",
    "mse_search_fast",
    "mse_search_reference",
    "percentile_ranges",
    "use_windows",
]


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
    windows = use_windows(nlevels, nb)
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
                a[c] = entropy_search_fast(
                    counts[c], nlevels, start, 1, logt, idx, off, windows, es
                )
            elif method == MSE:
                a[c] = mse_search_fast(counts[c], hhi[c], max_bound, start, 1, ms)
            else:
                s, e = l2_search(counts[c], hlo[c], hhi[c], dst_nbins)
                a[c] = s
                b[c] = e
