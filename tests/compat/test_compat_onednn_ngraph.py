"""oneDNN Graph and nGraph profiles against their documented formulas (no runnable reference)."""

from fractions import Fraction

import numpy as np
import pytest

from qstream.compat import ngraph, onednn

from ..support import oracle

# nGraph RoundMode table (semantics.md): outputs for 2.5, -2.5, -3.5
NGRAPH_TABLE = {
    "ROUND_NEAREST_TOWARD_INFINITY": [3, -3, -4],
    "HALF_AWAY_FROM_ZERO": [3, -3, -4],
    "ROUND_NEAREST_TOWARD_ZERO": [2, -2, -3],
    "ROUND_NEAREST_UPWARD": [3, -2, -3],
    "ROUND_NEAREST_DOWNWARD": [2, -3, -4],
    "ROUND_NEAREST_TOWARD_EVEN": [2, -2, -4],
    "ROUND_TOWARD_INFINITY": [3, -3, -4],
    "ROUND_TOWARD_ZERO": [2, -2, -3],
    "ROUND_UP": [3, -2, -3],
    "ROUND_DOWN": [2, -3, -4],
}


@pytest.mark.parametrize("mode", list(NGRAPH_TABLE))
def test_ngraph_round_modes_match_the_reference_table(mode):
    x = np.array([2.5, -2.5, -3.5], np.float32)
    got = ngraph.quantize(x, np.float32(1), np.int8(0), type="int8", round_mode=mode)
    assert got.tolist() == NGRAPH_TABLE[mode]


@pytest.mark.parametrize("axes", [(), (0,), (1,), (2,), (0, 2), (0, 1, 2), (1, 2)])
@pytest.mark.parametrize("mode", ["ROUND_NEAREST_TOWARD_ZERO", "ROUND_DOWN", "HALF_AWAY_FROM_ZERO"])
def test_ngraph_projects_parameters_on_any_axis_set(axes, mode):
    rng = np.random.default_rng(len(axes))
    x = (rng.standard_normal((3, 4, 5)) * 40).astype(np.float32)
    pshape = tuple(x.shape[a] for a in axes)
    s = rng.uniform(0.25, 2, pshape).astype(np.float32)
    z = rng.integers(-10, 10, pshape).astype(np.int8)
    got = ngraph.quantize(x, s, z, type="int8", axes=set(axes), round_mode=mode)
    want = np.empty(x.shape, np.int64)
    for idx in np.ndindex(*x.shape):
        p = tuple(idx[a] for a in axes)
        v = float(np.float32(x[idx] / s[p]))
        r = oracle.round_exact(v, ngraph.ROUND_MODES[mode]) + int(z[p])
        want[idx] = min(max(r, -128), 127)
    np.testing.assert_array_equal(got, want)
    y = ngraph.dequantize(got, s, z, type="float32", axes=set(axes))
    np.testing.assert_array_equal(y, oracle.expand_dequant(got, s, z, axes))


def test_ngraph_rejects_mismatched_types_and_axes():
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(TypeError, match="Scale element type"):
        ngraph.quantize(x, np.float64(1), np.int8(0), type="int8")
    with pytest.raises(TypeError, match="Offset element type"):
        ngraph.quantize(x, np.float32(1), np.uint8(0), type="int8")
    with pytest.raises(ValueError, match="less than rank"):
        ngraph.quantize(x, np.ones(3, np.float32), np.zeros(3, np.int8), type="int8", axes={2})


def _onednn_oracle(x, s, z, lo, hi):
    out = []
    for xi in x:
        v = float(np.float32(np.float32(xi / np.float32(s)) + np.float32(z)))
        if np.isnan(v) or np.isinf(v):
            out.append(lo if np.isnan(v) or v < 0 else hi)
        else:
            out.append(int(min(max(oracle.round_exact(v, "half_to_even"), lo), hi)))
    return np.array(out)


@pytest.mark.parametrize(("dst", "lo", "hi", "zp"), [("s8", -128, 127, 3), ("u8", 0, 255, 100)])
def test_onednn_adds_zero_point_before_rounding(dst, lo, hi, zp):
    rng = np.random.default_rng(0)
    x = np.concatenate(
        [
            (rng.standard_normal(3000) * 50).astype(np.float32),
            np.array([2.4999998, 0.5, -0.5, 1e9, -1e9, np.nan, np.inf], np.float32),
        ]
    )
    got = onednn.quantize(x, scales=[0.7], zps=[zp], dst_dtype=dst)
    np.testing.assert_array_equal(got, _onednn_oracle(x, 0.7, zp, lo, hi))
    assert onednn.quantize(np.float32([2.4999998]), scales=[1.0], zps=[3])[0] == 6
    assert Fraction(float(np.float32(2.4999998))) < Fraction(5, 2)


def test_onednn_per_channel_and_dequantize():
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((4, 6)) * 20).astype(np.float32)
    s = rng.uniform(0.2, 2, 6).astype(np.float32)
    z = rng.integers(-5, 5, 6)
    q = onednn.quantize(x, scales=s, zps=z, qtype="per_channel", axis=-1)
    want = np.stack([_onednn_oracle(x[:, c], s[c], z[c], -128, 127) for c in range(6)], axis=1)
    np.testing.assert_array_equal(q, want)
    y = onednn.dequantize(q, scales=s, zps=z, qtype="per_channel", axis=1)
    np.testing.assert_array_equal(y, ((q - z).astype(np.float32) * s))
    with pytest.raises(ValueError, match="per_tensor quantization takes exactly one scale"):
        onednn.quantize(x, scales=[1.0, 2.0])
    with pytest.raises(ValueError, match="zps are not supported for f8"):
        onednn.quantize(x, scales=[1.0], zps=[1], dst_dtype="f8_e4m3")
