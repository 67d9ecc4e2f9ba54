"""nGraph's reference kernels evaluate everything in the input's real type (float32 or float64).

The oracle below is the kernel (NervanaSystems/ngraph master, ``runtime/reference/quantize.hpp``
and ``dequantize.hpp``) written expression by expression in NumPy arithmetic of that type, with
the profile's documented choices where the C++ is undefined (NaN -> the type's minimum; a value
clamped to ``float(INT32_MAX)`` = 2**31 -> INT32_MAX).
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from qstream.compat import ngraph

MODES = list(ngraph.ROUND_MODES)
QTYPES = {"int8": np.int8, "uint8": np.uint8, "int32": np.int32}


def oracle_quantize(x, scale, offset, qdtype, mode):
    """``clamp(ROUND(x / s) + offset)`` with every step in ``x.dtype`` (scale/offset already
    broadcast to x's shape)."""
    R = x.dtype.type
    half = R(0.5)
    info = np.iinfo(qdtype)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        q = x / scale
        if mode in ("ROUND_NEAREST_TOWARD_INFINITY", "HALF_AWAY_FROM_ZERO"):
            t = np.floor(np.fabs(q) + half)
            q = np.where(q < R(0), -t, t)
        elif mode == "ROUND_NEAREST_TOWARD_ZERO":
            t = np.ceil(np.fabs(q) - half)
            q = np.where(q < R(0), -t, t)
        elif mode == "ROUND_NEAREST_UPWARD":
            q = np.floor(q + half)
        elif mode == "ROUND_NEAREST_DOWNWARD":
            q = np.ceil(q - half)
        elif mode == "ROUND_NEAREST_TOWARD_EVEN":
            up = np.floor(q + half)
            dn = np.ceil(q - half)
            q = np.where(np.fmod(up.astype(np.float64), 2.0) == 0.0, up, dn)
        elif mode == "ROUND_TOWARD_INFINITY":
            t = np.ceil(np.fabs(q))
            q = np.where(q < R(0), -t, t)
        elif mode == "ROUND_TOWARD_ZERO":
            t = np.floor(np.fabs(q))
            q = np.where(q < R(0), -t, t)
        elif mode == "ROUND_UP":
            q = np.ceil(q)
        elif mode == "ROUND_DOWN":
            q = np.floor(q)
        q = q + np.asarray(offset).astype(R)  # the offset converted to R, added in R
        lo, hi = R(info.min), R(info.max)
        q = np.where(q < lo, lo, q)  # std::max<REAL>(q, lo)
        q = np.where(hi < q, hi, q)  # std::min<REAL>(q, hi)
        nan = np.isnan(q)
        top = q >= 2.0**31  # only float(INT32_MAX): its cast is undefined in C++
        out = np.where(nan | top, 0, q).astype(np.int64)
    out = np.where(nan, info.min, np.where(top, info.max, out))
    return out.astype(qdtype)


def oracle_dequantize(q, scale, offset):
    """``(REAL)(q - offset) * scale``: int difference (wrapped to 32 bits), converted, then
    multiplied in the scale's type."""
    d = (q.astype(np.int64) - np.asarray(offset).astype(np.int64)).astype(np.int32)
    return d.astype(scale.dtype) * scale


def _values(rng, dtype, n=4000):
    """Random magnitudes over many binades, ties, values around 2**23 / 2**24 (float32) and
    2**52 / 2**53 (float64), the largest values below one half, and specials."""
    mant = 52 if dtype == np.float64 else 23
    mag = 2.0 ** rng.uniform(-3, 34, n)
    x = rng.choice([-1.0, 1.0], n) * mag
    ints = rng.integers(2**mant - 64, 2 ** (mant + 2) + 64, 300).astype(np.float64)
    near_half = np.nextafter(dtype(0.5), dtype(0))
    special = [0.5, 1.5, 2.5, -2.5, -3.5, 0.0, -0.0, np.nan, np.inf, -np.inf]
    special += [near_half, -near_half, 8388609, 8388608.5, 16777216, 2.0**31, -(2.0**31)]
    ties = rng.integers(-(2**24), 2**24, 300) + 0.5
    parts = [x, ints, -ints, ties, np.array(special)]
    return np.concatenate([np.asarray(p).astype(dtype) for p in parts])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("real", [np.float32, np.float64])
@pytest.mark.parametrize("qname", list(QTYPES))
def test_quantize_matches_the_kernel_in_the_real_type(mode, real, qname):
    rng = np.random.default_rng(MODES.index(mode) * 7 + list(QTYPES).index(qname))
    x = _values(rng, real)
    info = np.iinfo(QTYPES[qname])
    for scale, offset in [(1.0, 0), (0.3, 7), (1e-3, -5), (3.0, 1)] + [
        (float(rng.uniform(1e-4, 4)), int(rng.integers(info.min, info.max, endpoint=True)))
        for _ in range(3)
    ]:
        s, z = real(scale), QTYPES[qname](max(offset, info.min))
        got = ngraph.quantize(x, s, z, type=qname, round_mode=mode)
        np.testing.assert_array_equal(got, oracle_quantize(x, s, z, QTYPES[qname], mode))


def test_issue_examples_float32_steps():
    f32 = np.float32
    rne = "ROUND_NEAREST_TOWARD_EVEN"
    # 8388609 + 0.5f rounds to 8388610 in float32: nGraph gives 8388610, exact math 8388609.
    x = f32([8388609, 8388611, 8388608])
    assert ngraph.quantize(x, f32(1), np.int32(0), type="i32", round_mode=rne).tolist() == [
        8388610,
        8388612,
        8388608,
    ]
    # + offset in float32: 16777216 + 1 stays 16777216.
    assert ngraph.quantize(f32([16777216]), f32(1), np.int32(1), type="i32")[0] == 16777216
    # the int32 offset is rounded to float32 first: 2**24 + 1 -> 2**24.
    assert ngraph.quantize(f32([0]), f32(1), np.int32(2**24 + 1), type="int32")[0] == 2**24
    # 0.49999997 + 0.5f is 1.0f: the upward modes give 1 (exact math 0).
    half = f32(0.49999997)
    for mode, want in [
        ("ROUND_NEAREST_UPWARD", 1),
        ("ROUND_NEAREST_TOWARD_INFINITY", 1),
        ("ROUND_NEAREST_TOWARD_EVEN", 0),
        ("ROUND_NEAREST_DOWNWARD", 0),
    ]:
        assert (
            ngraph.quantize(np.array([half]), f32(1), np.int8(0), type="i8", round_mode=mode)[0]
            == want
        ), mode
    # float64: the same effect one binade lower.
    h64 = np.nextafter(0.5, 0)
    got = ngraph.quantize(
        np.array([h64, -h64]),
        np.float64(1),
        np.int8(0),
        type="i8",
        round_mode="ROUND_NEAREST_UPWARD",
    )
    assert got.tolist() == [1, 0]
    got = ngraph.quantize(
        np.array([-h64]), np.float64(1), np.int8(0), type="i8", round_mode="ROUND_NEAREST_DOWNWARD"
    )
    assert got.tolist() == [-1]


def test_float32_int32_saturation_at_the_float_bound():
    f32 = np.float32
    x = f32([2147483520, 2.0**31, 1e10, np.inf, -(2.0**31), -1e10, -np.inf, np.nan])
    got = ngraph.quantize(x, f32(1), np.int32(0), type="i32", round_mode="ROUND_DOWN")
    want = [2147483520, 2**31 - 1, 2**31 - 1, 2**31 - 1, -(2**31), -(2**31), -(2**31), -(2**31)]
    assert got.tolist() == want


@pytest.mark.parametrize("real", [np.float32, np.float64])
@pytest.mark.parametrize("qname", list(QTYPES))
def test_dequantize_two_roundings(real, qname):
    rng = np.random.default_rng(7)
    info = np.iinfo(QTYPES[qname])
    q = rng.integers(info.min, info.max, 50_000, endpoint=True).astype(QTYPES[qname])
    q[:4] = [info.min, info.max, 0, 1]
    for scale in [1.0, 0.1, 3.3, 1e-7, float(rng.uniform(1e-3, 10))]:
        for offset in [0, 1, info.min, info.max, int(rng.integers(info.min, info.max))]:
            s, z = real(scale), QTYPES[qname](offset)
            got = ngraph.dequantize(q, s, z, type=np.dtype(real).name)
            want = oracle_dequantize(q, s, z)
            assert got.dtype == real
            np.testing.assert_array_equal(got, want)


def test_dequantize_float32_differs_from_one_rounding():
    """``float(q - zp) * s`` rounds twice; the exact product rounded once differs here."""
    q = np.array([-1373955579], np.int32)
    s = np.float32(0.1)
    got = ngraph.dequantize(q, s, np.int32(0), type="f32")[0]
    assert got == np.float32(q[0]) * s
    assert got != np.float32(np.float64(q[0]) * np.float64(s))


@pytest.mark.parametrize("axes", [(0,), (1,), (2,), (0, 2), (1, 2), (0, 1, 2)])
@pytest.mark.parametrize("real", [np.float32, np.float64])
def test_several_axes_match_the_kernel(axes, real):
    rng = np.random.default_rng(len(axes))
    x = (rng.standard_normal((4, 5, 6)) * 2.0 ** rng.uniform(0, 30, (4, 5, 6))).astype(real)
    pshape = tuple(x.shape[a] for a in axes)
    s = rng.uniform(0.01, 3, pshape).astype(real)
    z = rng.integers(-(2**31), 2**31, pshape).astype(np.int32)
    dims = [x.shape[d] if d in axes else 1 for d in range(3)]
    sb, zb = s.reshape(dims), z.reshape(dims)
    for mode in ("ROUND_NEAREST_TOWARD_EVEN", "ROUND_NEAREST_TOWARD_ZERO", "ROUND_UP"):
        got = ngraph.quantize(x, s, z, type="i32", axes=set(axes), round_mode=mode)
        np.testing.assert_array_equal(got, oracle_quantize(x, sb, zb, np.int32, mode))
    y = ngraph.dequantize(got, s, z, type=real, axes=set(axes))
    np.testing.assert_array_equal(y, oracle_dequantize(got, sb, zb))


@given(
    x=hnp.arrays(np.float32, st.integers(0, 40), elements=st.floats(width=32)),
    scale=st.floats(width=32, allow_nan=False, allow_infinity=False).filter(lambda v: v != 0),
    offset=st.integers(-(2**31), 2**31 - 1),
    mode=st.sampled_from(MODES),
)
def test_any_float32_value(x, scale, offset, mode):
    s, z = np.float32(scale), np.int32(offset)
    got = ngraph.quantize(x, s, z, type="i32", round_mode=mode)
    np.testing.assert_array_equal(got, oracle_quantize(x, s, z, np.int32, mode))
    q8 = ngraph.quantize(x, s, np.int8(offset % 256 - 128), type="i8", round_mode=mode)
    np.testing.assert_array_equal(
        q8, oracle_quantize(x, s, np.int8(offset % 256 - 128), np.int8, mode)
    )


@given(
    q=hnp.arrays(np.int32, st.integers(0, 40)),
    scale=st.floats(width=32, allow_nan=False, allow_infinity=False),
    offset=st.integers(-(2**31), 2**31 - 1),
    real=st.sampled_from([np.float32, np.float64]),
)
def test_any_int32_dequantize(q, scale, offset, real):
    s, z = real(scale), np.int32(offset)
    with np.errstate(over="ignore", invalid="ignore"):
        want = oracle_dequantize(q, s, z)
    np.testing.assert_array_equal(ngraph.dequantize(q, s, z, type=real), want)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: ngraph.quantize(np.zeros(2, np.float16), np.float16(1), np.int8(0), type="i8"),
            "f32",
        ),
        (
            lambda: ngraph.quantize(
                np.zeros(2, np.float32), np.float32(1), np.int16(0), type="int16"
            ),
            "i8, u8, i32",
        ),
        (
            lambda: ngraph.dequantize(np.zeros(2, np.int16), np.float32(1), np.int16(0)),
            "quantized type",
        ),
        (
            lambda: ngraph.dequantize(np.zeros(2, np.int8), np.float16(1), np.int8(0), type="f16"),
            "f32, f64",
        ),
    ],
)
def test_types_outside_the_kernels_are_refused(call, message):
    with pytest.raises(TypeError, match=message):
        call()
