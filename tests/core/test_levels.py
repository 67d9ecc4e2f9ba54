"""symmetric_levels="full": symmetric integer types that use every code (int4: 16 levels)."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

import qstream as qs


def oracle(x: np.ndarray, steps: float, lo: int, hi: int, axis_reduce) -> tuple:
    """scale = float32(absmax / steps) (float64 division), q = clip(rint(x / s), lo, hi)."""
    amax = np.abs(x.astype(np.float64)).max(axis=axis_reduce, keepdims=True)
    s = np.where(amax > 0, amax / steps, 1.0).astype(np.float32)
    q = np.clip(np.rint(x / s), lo, hi)
    return q, s


def sqnr(x, y) -> float:
    return 10 * np.log10(
        np.sum(x.astype(np.float64) ** 2) / np.sum((x - y).astype(np.float64) ** 2)
    )


@pytest.mark.parametrize("dtype,steps,lo,hi", [("int4", 7.5, -8, 7), ("int8", 127.5, -128, 127)])
def test_full_levels_groups_match_the_oracle_and_use_every_code(dtype, steps, lo, hi):
    x = np.random.default_rng(1).standard_normal((64, 512)).astype(np.float32)
    g = qs.quantize_dynamic(x, dtype=dtype, axis=1, block_size=128, symmetric_levels="full")
    q, s = oracle(x.reshape(64, 4, 128), steps, lo, hi, 2)
    np.testing.assert_array_equal(np.asarray(g.scale).reshape(64, 4), s.reshape(64, 4))
    np.testing.assert_array_equal(np.asarray(g.q).astype(np.int64), q.reshape(64, 512))
    assert int(np.asarray(g.q).astype(np.int64).min()) == lo  # the lowest code is used


def test_full_levels_gain_sqnr_over_balanced_for_int4():
    # (255 rows: below the kernels' SERIAL_BELOW, the serial build, compiled by other tests)
    x = np.random.default_rng(2).standard_normal((255, 1024)).astype(np.float32)
    gains = []
    for levels in ("balanced", "full"):
        g = qs.quantize_dynamic(x, dtype="int4", axis=1, block_size=128, symmetric_levels=levels)
        gains.append(sqnr(x, g.dequantize()))
    assert gains[1] - gains[0] > 0.3  # measured ~0.5 dB on normal data


def test_full_levels_per_channel_store_job_and_unsigned_type(tmp_path):
    x = np.random.default_rng(3).standard_normal((48, 96)).astype(np.float32)
    src = zarr.create_array(str(tmp_path / "x.zarr"), shape=x.shape, chunks=(16, 96), dtype="f4")
    src[...] = x
    for dtype, zp, lo, hi in [("int4", 0, -8, 7), ("uint4", 8, 0, 15)]:
        out = tmp_path / f"{dtype}.zarr"
        spec = qs.QuantSpec(dtype=dtype, axis=0, symmetric_levels="full")
        qs.quantize_store(str(tmp_path / "x.zarr"), str(out), spec)
        arr = qs.open_quantized(out)
        q, s = oracle(x, 7.5, lo - zp, hi - zp, 1)
        np.testing.assert_array_equal(arr.scale.reshape(-1), s.reshape(-1))
        np.testing.assert_array_equal(arr.quantized(...).astype(np.int64), q + zp)
        assert np.all(arr.zero_point == zp)


def test_full_levels_in_a_recipe_and_spec_round_trip():
    spec = qs.QuantSpec(
        dtype="int4", axis=1, block_size=32, method="dynamic", symmetric_levels="full"
    )
    assert qs.QuantSpec.from_dict(spec.to_dict()) == spec
    assert "symmetric_levels" not in qs.QuantSpec().to_dict()  # default: identities unchanged
    r = qs.Recipe.from_dict({"defaults": {"dtype": "int4", "axis": 0, "symmetric_levels": "full"}})
    assert r.to_dict()["defaults"]["symmetric_levels"] == "full"


@pytest.mark.parametrize(
    "fields,named",
    [
        ({"dtype": "int4", "symmetric": False}, "asymmetric"),
        ({"dtype": "float8_e4m3fn"}, "float type"),
        ({"dtype": "int8", "narrow_range": True}, "narrow_range"),
        ({"dtype": "int8", "method": "mse"}, "method 'mse'"),
        ({"dtype": "int8", "symmetric_levels": "all"}, "unknown symmetric_levels"),
    ],
)
def test_full_levels_refused_where_they_do_not_apply(fields, named):
    with pytest.raises(qs.InvalidParameterError, match=named):
        qs.QuantSpec(symmetric_levels=fields.pop("symmetric_levels", "full"), **fields)
