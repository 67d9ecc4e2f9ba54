"""bfloat16 scales (``QuantSpec(scale_dtype="bfloat16")``): each scale rounded to the nearest
bfloat16, ties to even, as torch's ``.to(torch.bfloat16)``, clamped to the positive finite
bfloat16 range, before anything is quantized with it; the fused group-wise kernel rounds as the
NumPy path does; ``scale_dtype="source"`` resolves to a tensor's own dtype; the JSON round
trip."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import zarr

import qstream as qs
from qstream import QuantSpec
from qstream.core import BF16_MAX, BF16_MIN, SCALE_MODES, bf16_scales, round_scales

BF16 = np.dtype(ml_dtypes.bfloat16)


def _nearest_bf16_oracle(a: np.ndarray) -> np.ndarray:
    """Round float32 values to bfloat16 by comparing the two neighbours in float64 (ties to
    the even mantissa), after clamping to [2**-133, largest finite bfloat16]: a NumPy oracle
    that shares no code with qstream or ml_dtypes."""
    a = np.clip(a.astype(np.float32), np.float32(BF16_MIN), np.float32(BF16_MAX))
    b = a.view(np.uint32).astype(np.uint64)
    down = (b & ~np.uint64(0xFFFF)).astype(np.uint32)
    up = (down.astype(np.uint64) + 0x10000).astype(np.uint32)
    vd = down.view(np.float32).astype(np.float64)
    vu = up.view(np.float32).astype(np.float64)
    x = a.astype(np.float64)
    dd, du = x - vd, vu - x
    even_down = ((down >> 16) & 1) == 0
    pick_up = (du < dd) | ((du == dd) & ~even_down & (b & 0xFFFF != 0))
    return np.where(pick_up, up, down).view(np.float32)


def _probe_values() -> np.ndarray:
    """Random positive float32 bit patterns over every exponent, every bfloat16 value's
    neighbourhood (midpoints: ties, and one ulp either side), subnormals and the ends."""
    rng = np.random.default_rng(0)
    a = rng.integers(1, 0x7F800000, 200_000, dtype=np.int64).astype(np.uint32).view(np.float32)
    hi = rng.integers(1, 0x7F80, 20_000, dtype=np.int64).astype(np.uint32) << np.uint32(16)
    ties = (hi | np.uint32(0x8000)).view(np.float32)
    sub = np.arange(1, 0x800000, 997, dtype=np.uint32).view(np.float32)  # float32 subnormals
    edges = np.float32(
        [0.0, 1e-45, 2.0**-134, 2.0**-133, 2.0**-126, 1.0, 3.0e38, BF16_MAX, 3.39e38, 3.4028235e38]
    )
    return np.concatenate(
        [a, ties, *(np.nextafter(ties, t) for t in (np.float32(0), np.float32(np.inf))),
         hi.view(np.float32), sub, edges]
    ).astype(np.float32)  # fmt: skip


def test_bf16_scales_round_to_nearest_even_as_torch_and_stay_positive_and_finite():
    torch = pytest.importorskip("torch")
    a = _probe_values()
    got = bf16_scales(a)
    want = _nearest_bf16_oracle(a)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    clamped = np.clip(a, np.float32(BF16_MIN), np.float32(BF16_MAX))
    by_torch = torch.from_numpy(clamped).to(torch.bfloat16).to(torch.float32).numpy()
    np.testing.assert_array_equal(got.view(np.uint32), by_torch.view(np.uint32))
    assert np.all(np.isfinite(got)) and got.min() == np.float32(2.0**-133)
    assert got.max() == np.float32(BF16_MAX)
    assert np.array_equal(got.astype(BF16).astype(np.float32), got)  # bfloat16 values
    np.testing.assert_array_equal(round_scales(a, 2), got)


def test_kernel_bf16_scale_rounds_like_the_numpy_path():
    from numba import njit

    from qstream.kernels.affine import SCALE_BF16, SCALE_F16, SCALE_F32, round_scale

    @njit
    def each(a, mode):
        out = np.empty_like(a)
        for i in range(a.size):
            out[i] = round_scale(a[i], mode)
        return out

    assert tuple(SCALE_MODES.values()) == (SCALE_F32, SCALE_F16, SCALE_BF16)
    a = _probe_values()
    for mode in (SCALE_F32, SCALE_F16, SCALE_BF16):
        got = each(a, mode)
        np.testing.assert_array_equal(got.view(np.int32), round_scales(a, mode).view(np.int32))


def _x_with_extreme_groups():
    rng = np.random.default_rng(8)
    x = rng.standard_normal((8, 256)).astype(np.float32)
    x[1, :32] *= 1e-39  # a scale below 2**-133 would be needed: clamped up
    x[2, 32:64] = np.float32(3.3e38)  # scales near the top of the range stay finite
    x[3, 64:96] *= 1e-3
    return x


@pytest.mark.parametrize("method", ["dynamic", "minmax"])
def test_bfloat16_scales_are_stored_as_bfloat16_and_reproduce_the_stored_values(tmp_path, method):
    """The fused group-wise kernel (dynamic) and the calibrated path (minmax) store bfloat16
    scales equal to the float32 spec's scales rounded to bfloat16, and codes quantized with
    those rounded scales."""
    x = _x_with_extreme_groups()
    spec = QuantSpec(dtype="int8", axis=1, block_size=32, method=method, scale_dtype="bfloat16")
    qs.quantize_store(x, tmp_path / "b.zarr", spec)
    f32 = QuantSpec(**{**spec.to_dict(), "scale_dtype": "float32"})
    qs.quantize_store(x, tmp_path / "f.zarr", f32)
    bf, full = qs.open_quantized(tmp_path / "b.zarr"), qs.open_quantized(tmp_path / "f.zarr")
    assert zarr.open_group(str(tmp_path / "b.zarr"))["scale"].dtype == BF16
    np.testing.assert_array_equal(bf.scale.astype(np.float32), bf16_scales(full.scale))
    want = qs.quantize(
        x, bf.scale.astype(np.float32), np.zeros(bf.scale.shape, np.int8), axis=1,
        block_size=32, dtype="int8",
    )  # fmt: skip
    np.testing.assert_array_equal(bf.quantized(...), want)
    assert qs.open_quantized(tmp_path / "b.zarr").scale.min() >= np.float32(2.0**-133)


def test_quantize_dynamic_gives_bfloat16_scales_and_sizes_count_two_bytes_each():
    from qstream.io.outputs import qarray

    x = _x_with_extreme_groups()
    spec = QuantSpec(dtype="int4", axis=1, block_size=32, method="dynamic", scale_dtype="bfloat16")
    r = qs.quantize_dynamic(x, spec)
    q, scale = r[0], r[1]
    assert scale.dtype == BF16
    f32 = qs.quantize_dynamic(x, QuantSpec(**{**spec.to_dict(), "scale_dtype": "float32"}))[1]
    np.testing.assert_array_equal(scale.astype(np.float32), bf16_scales(f32))
    assert q.shape == x.shape
    n = x.size // 32
    assert qarray.quantized_nbytes(x.shape, spec) == x.size // 2 + 2 * n
    half = QuantSpec(**{**spec.to_dict(), "scale_dtype": "float16"})
    assert qarray.quantized_nbytes(x.shape, half) == qarray.quantized_nbytes(x.shape, spec)


def test_scale_dtype_source_resolves_per_tensor_dtype_and_specs_round_trip_as_json():
    src = QuantSpec(dtype="int4", axis=-1, block_size=128, scale_dtype="source")
    assert src.for_source(BF16).scale_dtype == "bfloat16"
    assert src.for_source(np.float16).scale_dtype == "float16"
    assert src.for_source(np.float32).scale_dtype == "float32"
    assert QuantSpec(scale_dtype="float16").for_source(BF16).scale_dtype == "float16"
    with pytest.raises(qs.InvalidParameterError, match="resolved per tensor"):
        _ = src.scale_mode
    for spec in (src, src.for_source(BF16), QuantSpec(scale_dtype="bfloat16")):
        d = spec.to_dict()
        assert QuantSpec.from_dict(d) == spec and d["scale_dtype"] == spec.scale_dtype
    assert "scale_dtype" not in QuantSpec(dtype="int8").to_dict()  # job identities as before
    with pytest.raises(qs.InvalidParameterError, match="unknown scale_dtype"):
        QuantSpec(scale_dtype="float8")
    rec = qs.Recipe.from_dict({"defaults": {"scale_dtype": "source"}, "rules": []})
    assert rec.spec_for("w", (4, 4), BF16).scale_dtype == "bfloat16"
    assert rec.spec_for("w", (4, 4), np.float32).scale_dtype == "float32"
    assert {s.scale_dtype for s in rec.specs()} == {"bfloat16", "float16", "float32"}
    assert qs.Recipe.from_dict(rec.to_dict()) == rec
