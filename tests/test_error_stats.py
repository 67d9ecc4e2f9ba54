"""The fused error-statistics kernel against a direct NumPy computation of the same sums."""

import numpy as np
import pytest

import qstream as qs
from qstream.core.affine import affine_dequantize, affine_quantize
from qstream.core.layout import plan_layout
from qstream.engine.blockmath import block_errors, block_errors_fused

CASES = [
    ((50, 70), None, None, "int8"),
    ((50, 70), 0, None, "uint8"),
    ((50, 70), 1, None, "int8"),
    ((6, 50, 70), 1, None, "int16"),
    ((50, 64), 1, 16, "int8"),
    ((8, 64, 5), 1, 16, "int4"),
    ((30, 40), 0, None, "int32"),
    ((40000,), None, None, "uint8"),
]


@pytest.mark.parametrize(("shape", "axis", "block", "dtype"), CASES)
def test_fused_error_sums_equal_numpy_statement(shape, axis, block, dtype):
    rng = np.random.default_rng(len(shape) + (axis or 0))
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    x.flat[3], x.flat[7], x.flat[11] = np.nan, 1e9, -np.inf
    qt = qs.QTYPES[dtype]
    if axis is None:
        s, z = np.float32(0.05), np.float64(3 if qt.signed else 100)
    else:
        pshape = list(shape) if block else [shape[axis]]
        if block:
            pshape[axis] = -(-shape[axis] // block)
        s = rng.uniform(0.01, 0.1, pshape).astype(np.float32)
        z = np.zeros(pshape) + (0 if qt.signed else 7)
    s, z = np.asarray(s), np.asarray(z)
    layout = plan_layout(x.shape, s.shape, axis, block)
    q = affine_quantize(x, s, z, layout, qt)
    xhat = affine_dequantize(q, s, z, layout, qt)
    want = block_errors(
        x,
        xhat,
        layout.expand(s).astype(np.float64),
        layout.expand(z).astype(np.float64),
        qt,
        qt.qmin,
        qt.qmax,
        axis,
    )
    got = block_errors_fused(x, q, s, z, layout, qt, qt.qmin, axis)
    for k in ("count", "clipped", "nonfinite", "max_abs"):
        np.testing.assert_array_equal(getattr(got, k), getattr(want, k))
    for k in ("sum_x2", "sum_e2", "sum_xy", "sum_y2"):
        np.testing.assert_allclose(getattr(got, k), getattr(want, k), rtol=1e-12)
    assert got.nonfinite.sum() == 2 and got.clipped.sum() >= 1
