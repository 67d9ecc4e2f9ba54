"""Numba kernels: pure functions over arrays, no I/O."""

# the names the folders above may use; the submodules named here are loaded on demand
__all__ = [
    "affine",
    "blocked",
    "digest",
    "error_stats",
    "kquants",
    "legacy_quants",
    "numpy_twins",
    "offset",
    "packing",
    "quantize_sums",
    "runtime",
    "search",
    "stats",
]
