"""The SQNR sums of GGUF exports (``kquants.row_error_sums``): per row, the bits NumPy's
float64 reductions give (``(a * a).sum(axis=1)`` etc. on float64 copies, its pairwise
order), for every width class of NumPy's pairwise sum, float32 and float64 sources, with
one importance vector or one per row."""

from __future__ import annotations

import numpy as np
import pytest

from qstream.kernels import kquants


def numpy_rows(x: np.ndarray, y: np.ndarray, w: np.ndarray | None) -> np.ndarray:
    """The reference: NumPy's own reductions of float64 copies, as the export summed them."""
    a, b = x.astype(np.float64), y.astype(np.float64)
    e = a - b
    cols = [(a * a).sum(axis=1), (e * e).sum(axis=1), (a * b).sum(axis=1), (b * b).sum(axis=1)]
    if w is not None:
        wr = w.astype(np.float64)
        cols += [(wr * a * a).sum(axis=1), (wr * e * e).sum(axis=1)]
    return np.stack([*cols, np.abs(e).max(axis=1)], axis=1)


@pytest.mark.parametrize("cols", [1, 7, 8, 15, 128, 129, 136, 256, 1000, 2048, 5632])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_row_error_sums_are_numpys_float64_reductions_bit_for_bit(cols, dtype):
    rng = np.random.default_rng(cols)
    rows = 9
    scale = rng.choice([1e-30, 1e-6, 1.0, 1e6, 1e30], (rows, cols))
    x = (rng.standard_t(3, (rows, cols)) * scale).astype(dtype)
    x[0, : min(cols, 3)] = 0.0  # (zeros and a row of exact values)
    y = (x * (1 + 0.05 * rng.standard_normal((rows, cols)))).astype(np.float32)
    y[1] = x[1]
    program = kquants.pairwise_program(cols)
    for w in (None, rng.lognormal(0, 2, (1, cols)), rng.lognormal(0, 2, (rows, cols))):
        w32 = None if w is None else w.astype(np.float32)
        out = np.full((rows, 7), np.nan)
        no_w = np.zeros((0, 0), np.float32)
        kquants.row_error_sums(x, y, no_w if w32 is None else w32, program, out)
        want = numpy_rows(x, y, w32)
        got = out if w32 is not None else out[:, [0, 1, 2, 3, 6]]
        assert got.tobytes() == want.tobytes()


def test_pairwise_program_splits_as_numpy_does():
    """Leaves of at most 128 values, the first half a multiple of 8 (NumPy's
    ``pairwise_sum``): 1000 = 496 + 504, 496 = 248 + 248, 504 = 248 + 256, 248 = 120 + 128,
    256 = 128 + 128; an addition after each pair."""
    prog = kquants.pairwise_program(1000).tolist()
    leaves = [(lo, n) for op, lo, n in prog if op == 0]
    assert leaves == [(0, 120), (120, 128), (248, 120), (368, 128), (496, 120), (616, 128),
                      (744, 128), (872, 128)]  # fmt: skip
    assert sum(op for op, _, _ in prog) == len(leaves) - 1
    assert kquants.pairwise_program(128).tolist() == [[0, 0, 128]]
