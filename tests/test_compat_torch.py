"""The torch profile against torch 2.13 (CPU)."""

import warnings

import numpy as np
import pytest

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
    exact = np.abs(got.astype(np.int64)) < 2**24  # documented bound for qint32 per-channel
    np.testing.assert_array_equal(y[exact], want.dequantize().numpy()[exact])


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
