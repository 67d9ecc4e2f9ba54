"""qstream.compat.gguf against gguf-py's own quantize/dequantize, byte for byte."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from qstream.compat import gguf as qg
from qstream.errors import InvalidParameterError

gguf = pytest.importorskip("gguf")
T = gguf.GGMLQuantizationType
QUANTIZED = ["Q8_0", "Q4_0", "Q4_1", "BF16"]


def edge_rows() -> np.ndarray:
    """Blocks that exercise every rule: zeros, one value, a negative largest magnitude, ties
    of |max|, exact halves, float16 underflow and overflow of the scale/minimum, a constant."""
    rows = np.zeros((12, 32), np.float32)
    rows[1, 3] = 0.7
    rows[2, 5] = -0.7
    rows[3] = np.linspace(-8, 3, 32)
    rows[4, :2] = [5.0, -5.0]
    rows[5] = np.arange(32) - 15.5  # halves of x * (1/d)
    rows[6] = [127.0] + [0.5] * 31
    rows[7] = [8.0, -0.5, 0.5, 0.49999997] + [0.0] * 28
    rows[8] = 1e-8
    rows[8, 0] = 3e-8
    rows[9] = 7e4
    rows[9, 1] = 7.1e4
    rows[10] = 3.25
    rows[11] = np.random.default_rng(0).standard_normal(32).astype(np.float32) * 1e3
    return rows


@pytest.mark.parametrize("qtype", [*QUANTIZED, "F16", "F32"])
def test_gguf_profile_bytes_equal_gguf_py_on_edge_blocks(qtype):
    x = edge_rows()
    with np.errstate(over="ignore"):
        mine = qg.quantize(x, qtype)
        theirs = gguf.quants.quantize(x, T[qtype])
    assert mine.dtype == theirs.dtype and mine.shape == theirs.shape
    np.testing.assert_array_equal(mine.view(np.uint8), theirs.view(np.uint8))
    back = qg.dequantize(mine, qtype)
    want = gguf.quants.dequantize(theirs, T[qtype])
    np.testing.assert_array_equal(back.view(np.uint32), want.view(np.uint32))


finite = st.floats(-1e4, 1e4, width=32, allow_nan=False, allow_infinity=False)


@settings(max_examples=150, deadline=None)
@given(
    qtype=st.sampled_from(QUANTIZED),
    x=arrays(
        np.float32,
        st.tuples(st.integers(1, 4), st.integers(1, 3).map(lambda k: 32 * k)),
        elements=finite,
    ),
)
def test_gguf_profile_equals_gguf_py_on_any_finite_rows(qtype, x):
    mine = qg.quantize(x, qtype)
    theirs = gguf.quants.quantize(x, T[qtype])
    np.testing.assert_array_equal(mine, theirs)
    np.testing.assert_array_equal(
        qg.dequantize(mine, qtype).view(np.uint32),
        gguf.quants.dequantize(theirs, T[qtype]).view(np.uint32),
    )


def test_gguf_profile_refuses_a_ragged_last_axis_and_unknown_types():
    with pytest.raises(Exception, match="multiple of 32"):
        qg.quantize(np.zeros((2, 40), np.float32), "Q8_0")
    with pytest.raises(Exception, match="multiple of 256"):
        qg.quantize(np.zeros((2, 32), np.float32), "Q5_K")
    with pytest.raises(Exception, match="unknown GGUF type"):
        qg.quantize(np.zeros((2, 32), np.float32), "IQ4_NL")


@pytest.mark.parametrize("qtype", ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"])
def test_the_profile_quantizes_k_quants_that_gguf_py_decodes_to_its_own_values(qtype):
    """``qstream.compat.gguf`` takes the K-quants (issue 47's contract: ``quantize(x, "Q4_K",
    imatrix=w)``, ``dequantize(blocks, "Q4_K", shape)``); gguf-py decodes its blocks to the
    values qstream's dequantize gives (their bytes equal llama.cpp's: tests/kernels)."""
    import gguf

    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 512)).astype(np.float32)
    w = rng.uniform(0.1, 2.0, 512).astype(np.float32)
    for imatrix in (None, w):
        blocks = qg.quantize(x, qtype, imatrix=imatrix)
        assert blocks.shape == qg.byte_shape(x.shape, qtype)
        ours = qg.dequantize(blocks, qtype, x.shape)
        theirs = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType[qtype])
        np.testing.assert_array_equal(ours.view(np.uint32), theirs.view(np.uint32))
    with pytest.raises(InvalidParameterError, match="importance matrix"):
        qg.quantize(x, "Q8_0", imatrix=w)
