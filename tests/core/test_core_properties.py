"""Kernels against the slow oracle: shapes (empty, size-1), every axis, blocks, types, threads."""

import numba
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import qstream as qs
from qstream.rounding import ROUND_MODES

from ..support import oracle

INT_TYPES = ["int8", "uint8", "int16", "uint16", "int32", "int4", "uint4", "int2", "uint2"]

# Values that exercise ties, saturation and non-finite handling.
floats32 = st.one_of(
    st.floats(-300, 300, width=32),
    st.sampled_from([0.5, 1.5, 2.5, -0.5, -2.5, 127.5, 128.5, -128.5, 1e10, -1e10]),
    st.sampled_from([np.nan, np.inf, -np.inf, 0.49999997, -0.49999997, 2.5000002]),
)


@st.composite
def problems(draw, float_dtype=np.float32):
    ndim = draw(st.integers(1, 4))
    shape = tuple(draw(st.lists(st.integers(0, 5), min_size=ndim, max_size=ndim)))
    x = draw(hnp.arrays(float_dtype, shape, elements=floats32))
    gran = draw(st.sampled_from(["tensor", "axis", "block"]))
    qt = qs.QTYPES[draw(st.sampled_from(INT_TYPES))]
    axis = block = None
    if gran == "tensor":
        pshape = ()
    else:
        axis = draw(st.integers(-ndim, ndim - 1))
        d = shape[axis]
        if gran == "axis":
            pshape = (d,)
        else:
            block = draw(st.integers(1, 4))
            pshape = list(shape)
            pshape[axis] = -(-d // block)
            pshape = tuple(pshape)
    scale = draw(hnp.arrays(np.float32, pshape, elements=st.floats(0.0625, 8, width=32)))
    lo, hi = int(max(qt.qmin, -1000)), int(min(qt.qmax, 1000))
    zp = draw(hnp.arrays(np.int64, pshape, elements=st.integers(lo, hi)))
    return x, scale, zp, axis, block, qt


@pytest.mark.parametrize("threads", [1, 2])
@given(p=problems(), mode=st.sampled_from(ROUND_MODES))
def test_quantize_matches_oracle_for_every_granularity(threads, p, mode):
    x, scale, zp, axis, block, qt = p
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    got = qs.quantize(x, scale, zp, axis=axis, block_size=block, dtype=qt.name, round_mode=mode)
    want = oracle.quantize(x, scale, zp, qt.qmin, qt.qmax, axis=axis, block_size=block, mode=mode)
    assert got.dtype == qt.dtype and got.shape == x.shape
    np.testing.assert_array_equal(got.astype(np.int64), want)


@given(p=problems())
def test_dequantize_matches_oracle(p):
    x, scale, zp, axis, block, qt = p
    q = qs.quantize(x, scale, zp, axis=axis, block_size=block, dtype=qt.name)
    got = qs.dequantize(q, scale, zp, axis=axis, block_size=block)
    want = oracle.dequantize(q, scale, zp, axis=axis, block_size=block)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)


@given(p=problems(float_dtype=np.float64))
def test_float64_input_divides_in_float64(p):
    x, scale, zp, axis, block, qt = p
    s64 = scale.astype(np.float64)
    got = qs.quantize(x, s64, zp, axis=axis, block_size=block, dtype=qt.name)
    want = oracle.quantize(x, s64, zp, qt.qmin, qt.qmax, axis=axis, block_size=block)
    np.testing.assert_array_equal(got.astype(np.int64), want)


@pytest.mark.parametrize("dtype", [np.float16, "bfloat16"])
def test_half_precision_scale_rounds_quotient_to_its_type(dtype):
    import ml_dtypes

    dt = np.dtype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
    x = (np.random.default_rng(0).standard_normal(5000) * 100).astype(dt)
    s = np.array(0.3, dt)
    got = qs.quantize(x, s, np.int16(0))
    want = oracle.quantize(x, s, None, -32768, 32767)
    np.testing.assert_array_equal(got.astype(np.int64), want)


def test_result_is_identical_for_every_thread_count_on_a_large_array():
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((64, 3000)) * 40).astype(np.float32)
    s = rng.uniform(0.1, 2, 64).astype(np.float32)
    outs = []
    for t in range(1, numba.config.NUMBA_NUM_THREADS + 1):
        numba.set_num_threads(t)
        outs.append(qs.quantize(x, s, axis=0, dtype="int8"))
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])
