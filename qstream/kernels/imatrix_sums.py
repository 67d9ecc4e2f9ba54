"""The statistic of an importance matrix: per column, the float64 sum of squares of the
activations feeding a weight, added in token order (llama.cpp's ``llama-imatrix`` sums the
same squares in float32)."""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True, error_model="numpy")
def add_squares(x: np.ndarray, acc: np.ndarray) -> None:  # pragma: no cover (compiled)
    """``acc[j] += float64(x[i, j]) ** 2`` for each row ``i`` in order (the token order)."""
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            v = np.float64(x[i, j])
            acc[j] += v * v
