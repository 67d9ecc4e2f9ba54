"""Small per-tensor calls take a direct path to the kernel; it must give what the general
path gives, byte for byte, and leave every error to the general path."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import qstream as qs
from qstream.api import direct as small
from qstream.core import checks
from qstream.core.affine import affine_dequantize, affine_quantize
from qstream.core.layout import plan_layout
from qstream.rounding import round_code

INT_TYPES = ["int8", "uint8", "int16", "uint16", "int4", "uint4", "int2", "uint2"]


def _general_quantize(x, scale, zero_point, dtype, round_mode):
    scale = checks.as_scale(scale)
    qt = checks.resolve_output_type(dtype, zero_point)
    zp = checks.as_zero_point(zero_point, qt, scale.shape)
    layout = plan_layout(x.shape, scale.shape, None, None)
    return affine_quantize(x, scale, zp, layout, qt, code=round_code(round_mode))


values = st.floats(allow_nan=True, allow_infinity=True, width=32)


@given(
    x=st.lists(values, min_size=1, max_size=300).map(lambda v: np.array(v, np.float32)),
    scale=st.floats(2.0**-20, 2.0**20, width=32),
    dtype=st.sampled_from(INT_TYPES),
    zp_frac=st.floats(0, 1),
    mode=st.sampled_from(list(qs.ROUND_MODES)),
    zp_kind=st.sampled_from(["none", "int", "numpy"]),
)
def test_direct_quantize_equals_the_general_path(x, scale, dtype, zp_frac, mode, zp_kind):
    qt = qs.QTYPES[dtype]
    z = int(qt.qmin + zp_frac * (qt.qmax - qt.qmin))
    if zp_kind == "numpy" and qt.bits < 8:
        zp_kind = "int"  # sub-byte scalars are ml_dtypes types: the general path takes them
    zp = {"none": None, "int": z, "numpy": np.array(z, qt.dtype)[()] if qt.bits >= 8 else z}
    zp = zp[zp_kind]
    got = small.quantize(x, np.float32(scale), zp, dtype, mode)
    assert got is not None
    want = _general_quantize(x, np.float32(scale), zp, dtype, mode)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == want.tobytes()
    assert qs.quantize(x, np.float32(scale), zp, dtype=dtype, round_mode=mode).tobytes() == (
        want.tobytes()
    )


@given(
    q=st.lists(st.integers(-128, 127), min_size=1, max_size=300),
    scale=st.floats(2.0**-20, 2.0**20, width=32),
    z=st.integers(-128, 127),
)
def test_direct_dequantize_equals_the_general_path(q, scale, z):
    q = np.array(q, np.int8)
    got = small.dequantize(q, np.float32(scale), np.int8(z))
    layout = plan_layout(q.shape, (), None, None)
    want = affine_dequantize(
        q, np.asarray(np.float32(scale)), np.asarray(float(z)), layout, qs.QTYPES["int8"]
    )
    assert got is not None and got.tobytes() == want.tobytes()


@pytest.mark.parametrize(
    "call",
    [
        lambda x: small.quantize(x, 0.0, None, "int8", "half_to_even"),  # zero scale
        lambda x: small.quantize(x, float("nan"), None, "int8", "half_to_even"),
        lambda x: small.quantize(x, 0.1, 300, "int8", "half_to_even"),  # zp out of range
        lambda x: small.quantize(x, 0.1, None, "int32", "half_to_even"),  # 32-bit
        lambda x: small.quantize(x, 0.1, None, "float8_e4m3fn", "half_to_even"),
        lambda x: small.quantize(x, 0.1, None, "int8", "bankers"),  # unknown mode
        lambda x: small.quantize(x.astype(np.float64), 0.1, None, "int8", "half_to_even"),
        lambda x: small.quantize(x[::2], 0.1, None, "int8", "half_to_even"),  # strided
        lambda x: small.quantize(x, np.float64(0.1), None, "int8", "half_to_even"),
        lambda x: small.dequantize(np.zeros(4, np.int8), 0.1, np.uint8(3)),  # zp type
    ],
)
def test_anything_unusual_is_left_to_the_general_path(call):
    assert call(np.linspace(-1, 1, 16, dtype=np.float32)) is None


def test_bad_arguments_still_raise_the_general_errors():
    x = np.ones(8, np.float32)
    with pytest.raises(qs.InvalidParameterError, match="scale must be finite and > 0"):
        qs.quantize(x, 0.0, 0, dtype="int8")
    with pytest.raises(qs.InvalidParameterError, match="outside the int8 range"):
        qs.quantize(x, 0.1, 300, dtype="int8")
    with pytest.raises(qs.InvalidParameterError, match="unknown round_mode"):
        qs.quantize(x, 0.1, 0, dtype="int8", round_mode="bankers")
