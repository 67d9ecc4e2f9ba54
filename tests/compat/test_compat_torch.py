"""The torch profile against torch 2.13 (CPU)."""

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from qstream.compat import torch as qtorch

torch = pytest.importorskip("torch")
warnings.filterwarnings("ignore", message=".*deprecated.*")

TYPES = {"qint8": torch.qint8, "quint8": torch.quint8, "qint32": torch.qint32}
ZP = {"qint8": 3, "quint8": 128, "qint32": 1000}


def _inputs(seed=0, n=200_000):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * 200).astype(np.float32)
    special = np.array(
        [
            0.5,
            1.5,
            2.5,
            -2.5,
            -117.75000762939453,
            -3.8349997997283936,
            -1.225000023841858,
            -178.84999084472656,
            1e10,
            -1e10,
            np.nan,
            np.inf,
            -np.inf,
            0.0,
            -0.0,
        ],
        np.float32,
    )
    return np.concatenate([x, special])


@pytest.mark.parametrize("name", list(TYPES))
@pytest.mark.parametrize("scale", [0.01, 0.3, 0.7, 0.0123456789012345, 3.3])
def test_quantize_per_tensor_matches_torch(name, scale):
    x = _inputs()
    want = torch.quantize_per_tensor(torch.from_numpy(x), scale, ZP[name], TYPES[name])
    got = qtorch.quantize_per_tensor(x, scale, ZP[name], name)
    np.testing.assert_array_equal(got, want.int_repr().numpy())
    np.testing.assert_array_equal(
        qtorch.dequantize(got, scale, ZP[name]), want.dequantize().numpy()
    )


@pytest.mark.parametrize("name", list(TYPES))
@pytest.mark.parametrize("axis", [0, 1, 2])
def test_quantize_per_channel_matches_torch(name, axis):
    rng = np.random.default_rng(axis)
    x = _inputs(axis, 60 * 70 * 8 - 15).reshape(60, 70, 8)
    c = x.shape[axis]
    scales = rng.uniform(0.001, 3, c)
    zps = rng.integers(-20, 20, c) + (128 if name == "quint8" else 0)
    want = torch.quantize_per_channel(
        torch.from_numpy(x), torch.from_numpy(scales), torch.from_numpy(zps), axis, TYPES[name]
    )
    got = qtorch.quantize_per_channel(x, scales, zps, axis, name)
    np.testing.assert_array_equal(got, want.int_repr().numpy())
    y = qtorch.dequantize(got, scales, zps, axis=axis)
    np.testing.assert_array_equal(y, want.dequantize().numpy())


def test_reciprocal_ties_differ_from_onnx_division_as_torch_does():
    x = np.array([-117.75000762939453, -3.8349997997283936], np.float32)
    assert qtorch.quantize_per_tensor(x[:1], 0.3, 0, "qint32")[0] == -393
    assert qtorch.quantize_per_tensor(x[1:], 0.01, 0, "qint32")[0] == -383


def test_torch_profile_rejects_what_torch_rejects():
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(TypeError, match="Quantize only works on Float Tensor, got Half"):
        qtorch.quantize_per_tensor(x.astype(np.float16), 1.0, 0, "qint8")
    with pytest.raises(ValueError, match="zero_point 200 is above upper bound"):
        qtorch.quantize_per_tensor(x, 1.0, 200, "qint8")
    with pytest.raises(ValueError, match="Channel axis out of range"):
        qtorch.quantize_per_channel(x, [1.0, 1.0, 1.0], [0, 0, 0], -1, "qint8")
    with pytest.raises(ValueError, match="length of scales must equal to channel"):
        qtorch.quantize_per_channel(x, [1.0, 1.0], [0, 0], 1, "qint8")
    with pytest.raises(TypeError, match="unsupported torch quantized dtype"):
        qtorch.quantize_per_tensor(x, 1.0, 0, "quint4x2")


def _int32_values(rng, shape):
    """int32 values over the whole range (most with |q - zp| >= 2**24), plus the extremes."""
    q = rng.integers(-(2**31), 2**31, shape, dtype=np.int64).astype(np.int32)
    flat = q.reshape(-1)
    flat[:6] = [-(2**31), 2**31 - 1, 0, 1, -1, 2**24 + 1]
    return q


@pytest.mark.parametrize(
    ("shape", "axis"),
    [
        ((9, 40_001), 0),
        ((3001, 7), 1),
        ((4, 5, 3001), 1),
        ((4, 5, 3001), 2),
        ((2, 3, 4, 2501), 3),
        ((2, 3, 4, 2501), 0),
    ],
)
@pytest.mark.parametrize("zp_range", [0, 1000, 2**31])
def test_qint32_per_channel_dequantize_every_value(shape, axis, zp_range):
    rng = np.random.default_rng(axis * 10 + len(shape) + zp_range % 97)
    q = _int32_values(rng, shape)
    c = shape[axis]
    scales = rng.uniform(1e-4, 3, c)
    scales[0] = 1.0
    zps = rng.integers(-zp_range, zp_range + 1, c) if zp_range else np.zeros(c, np.int64)
    qt = torch._make_per_channel_quantized_tensor(
        torch.from_numpy(q), torch.from_numpy(scales), torch.from_numpy(zps), axis
    )
    want = qt.dequantize().numpy()
    got = qtorch.dequantize(q, scales, zps, axis=axis)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)
    # the old single rounding (exact difference times scale) differs on a large share
    exact = (
        (q.astype(np.int64) - np.expand_dims(zps, tuple(d for d in range(q.ndim) if d != axis)))
        * np.expand_dims(scales, tuple(d for d in range(q.ndim) if d != axis))
    ).astype(np.float32)
    assert np.mean(exact != want) > 0.05


@pytest.mark.parametrize("zp", [0, 1000, -77777, 2**31 - 1, -(2**31), 123456789])
@pytest.mark.parametrize("scale", [1.0, 0.3, 1e-3, 3.3, 1e-7])
def test_qint32_per_tensor_dequantize_every_value(zp, scale):
    rng = np.random.default_rng(abs(zp) % 1000)
    q = _int32_values(rng, (3, 33_333))
    want = torch._make_per_tensor_quantized_tensor(torch.from_numpy(q), scale, zp).dequantize()
    np.testing.assert_array_equal(qtorch.dequantize(q, scale, zp), want.numpy())


def _large_floats(rng, n):
    """float32 values with |x| from 0.25 to 2**33, and x.5 ties below 2**24."""
    x = rng.choice([-1.0, 1.0], n) * 2.0 ** rng.uniform(-2, 33, n)
    ties = rng.integers(-(2**24), 2**24, n // 4) + 0.5
    return np.concatenate([x, ties]).astype(np.float32)


@pytest.mark.parametrize("zp", [0, 1000, -77777, 2**31 - 1, -(2**31), 2**24 + 1])
@pytest.mark.parametrize("scale", [1.0, 0.3, 0.01, 7.0])
def test_qint32_quantize_per_tensor_large_values(zp, scale):
    x = _large_floats(np.random.default_rng(abs(zp) % 1000), 40_003)
    want = torch.quantize_per_tensor(torch.from_numpy(x), scale, zp, torch.qint32)
    got = qtorch.quantize_per_tensor(x, scale, zp, "qint32")
    np.testing.assert_array_equal(got, want.int_repr().numpy())
    np.testing.assert_array_equal(qtorch.dequantize(got, scale, zp), want.dequantize().numpy())


@pytest.mark.parametrize(
    ("shape", "axis"), [((7, 30_001), 0), ((300, 7), 1), ((4, 5, 3001), 1), ((2, 3, 4, 5001), 3)]
)
@pytest.mark.parametrize("zp_range", [1000, 2**31])
def test_qint32_quantize_per_channel_large_values(shape, axis, zp_range):
    rng = np.random.default_rng(axis + zp_range % 89)
    n = int(np.prod(shape))
    x = rng.permutation(_large_floats(rng, n))[:n].reshape(shape)
    c = shape[axis]
    scales = rng.uniform(1e-3, 3, c)
    scales[0] = 1.0
    zps = rng.integers(-zp_range, zp_range, c)
    want = torch.quantize_per_channel(
        torch.from_numpy(x), torch.from_numpy(scales), torch.from_numpy(zps), axis, torch.qint32
    )
    got = qtorch.quantize_per_channel(x, scales, zps, axis, "qint32")
    np.testing.assert_array_equal(got, want.int_repr().numpy())
    y = qtorch.dequantize(got, scales, zps, axis=axis)
    np.testing.assert_array_equal(y, want.dequantize().numpy())


@settings(max_examples=40)
@given(
    q=hnp.arrays(np.int32, st.tuples(st.integers(1, 5), st.integers(1, 40))),
    data=st.data(),
)
def test_per_channel_dequantize_any_values(q, data):
    c = q.shape[0]
    scales = np.array(data.draw(st.lists(st.floats(1e-8, 1e4), min_size=c, max_size=c)), np.float64)
    zps = np.array(
        data.draw(st.lists(st.integers(-(2**31), 2**31 - 1), min_size=c, max_size=c)), np.int64
    )
    qt = torch._make_per_channel_quantized_tensor(
        torch.from_numpy(q), torch.from_numpy(scales), torch.from_numpy(zps), 0
    )
    np.testing.assert_array_equal(
        qtorch.dequantize(q, scales, zps, axis=0), qt.dequantize().numpy()
    )
