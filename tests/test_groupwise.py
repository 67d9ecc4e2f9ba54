"""Group-wise (blocked dynamic) quantization: the fused kernel (ranges, parameters and
values in one pass) against the unfused path it replaces, bit for bit, and both against the
in-memory quantizer with the stored parameters."""

from __future__ import annotations

import json

import numpy as np
import pytest
import zarr

import qstream as qs
from qstream import QuantSpec
from qstream.engine.work import QuantizeWork


def _source(tmp_path, shape=(96, 512), chunks=(32, 512)):
    rng = np.random.default_rng(21)
    x = (rng.standard_normal(shape) * np.exp(rng.normal(0, 1, (shape[0], 1)))).astype(np.float32)
    x[3, 17] = np.nan
    x[40, 5] = np.inf
    x[41, 100] = -np.inf
    x[60, 64:96] = 0.0  # a group of zeros: scale 1
    x[61, 96:128] = np.nan  # a group with no finite value
    path = tmp_path / "src.zarr"
    a = zarr.create_array(str(path), shape=shape, chunks=chunks, dtype="float32")
    a[...] = x
    return path, x


def _run(src, dst, spec):
    r = qs.quantize_store(str(src), dst, spec, max_memory=1 << 20)
    g = zarr.open_group(str(dst), mode="r")
    return r, {m: np.asarray(g[m][...]) for m in ("data", "scale", "zero_point")}


CASES = [
    (dtype, axis, bs, sym, "float32")
    for dtype in ("int8", "uint8", "int4", "uint4", "int2", "uint2", "int16")
    for axis, bs in ((1, 32), (1, 128), (0, 16))
    for sym in (True, False)
] + [
    ("int8", 1, 256, True, "float32"),
    ("uint4", 1, 64, False, "float32"),
    ("int8", 1, 16, True, "float32"),
    ("int8", 1, 32, True, "float16"),
    ("uint4", 1, 128, False, "float16"),
    ("int4", 0, 16, False, "float16"),
    ("uint8", 1, 32, True, "float16"),
]


@pytest.mark.parametrize("dtype, axis, bs, sym, scale_dtype", CASES)
def test_fused_groupwise_kernel_is_bit_identical_to_the_unfused_path(
    tmp_path, monkeypatch, dtype, axis, bs, sym, scale_dtype
):
    src, x = _source(tmp_path)
    spec = QuantSpec(
        dtype=dtype,
        axis=axis,
        block_size=bs,
        method="dynamic",
        symmetric=sym,
        nan_policy="zero_point",
        narrow_range=dtype == "int8" and bs == 16,
        scale_dtype=scale_dtype,
    )
    fused_report, fused = _run(src, tmp_path / "fused.zarr", spec)
    monkeypatch.setattr(QuantizeWork, "_dynamic_fused", lambda self, x, out: None)
    plain_report, plain = _run(src, tmp_path / "plain.zarr", spec)
    for m in fused:
        np.testing.assert_array_equal(fused[m], plain[m])
        assert fused[m].dtype == plain[m].dtype
    assert json.dumps(fused_report.error, sort_keys=True) == json.dumps(
        plain_report.error, sort_keys=True
    )
    # and the values are those of the in-memory quantizer with the stored parameters (at
    # finite inputs; in range, so narrow_range's floor is never reached)
    arr = qs.open_quantized(tmp_path / "fused.zarr")
    finite = np.isfinite(x)
    want = qs.quantize(
        np.where(finite, x, 0),
        arr.scale,
        arr.zero_point.astype(np.int64),
        axis=axis,
        block_size=bs,
        dtype=dtype,
    )
    got = arr.quantized(...)
    np.testing.assert_array_equal(got[finite].astype(np.int32), want[finite].astype(np.int32))
    assert zarr.open_group(str(tmp_path / "fused.zarr"))["scale"].dtype == np.dtype(scale_dtype)


def _x_with_extreme_groups():
    rng = np.random.default_rng(8)
    x = rng.standard_normal((8, 256)).astype(np.float32)
    x[1, :32] *= 1e-9  # needs a scale below 2**-24: clamped up
    x[2, 32:64] *= 1e7  # needs a scale above 65504: clamped, values saturate
    return x


@pytest.mark.parametrize("method", ["dynamic", "minmax"])
def test_float16_scales_round_once_and_reproduce_the_stored_values(tmp_path, method):
    from qstream.calibration.params import half_scales

    x = _x_with_extreme_groups()
    spec = QuantSpec(dtype="int8", axis=1, block_size=32, method=method, scale_dtype="float16")
    rep = qs.quantize_store(x, tmp_path / "h.zarr", spec)
    ref = qs.quantize_store(
        x, tmp_path / "f.zarr", QuantSpec(**{**spec.to_dict(), "scale_dtype": "float32"})
    )
    half, full = qs.open_quantized(tmp_path / "h.zarr"), qs.open_quantized(tmp_path / "f.zarr")
    assert zarr.open_group(str(tmp_path / "h.zarr"))["scale"].dtype == np.float16
    np.testing.assert_array_equal(half.scale.astype(np.float32), half_scales(full.scale))
    assert half.scale.min() == 2.0**-24 and half.scale.max() == 65504
    want = qs.quantize(
        x, half.scale, np.zeros(half.scale.shape, np.int8), axis=1, block_size=32, dtype="int8"
    )
    np.testing.assert_array_equal(half.quantized(...), want)
    assert rep.error["clipped"] > ref.error["clipped"]  # the 1e7 group saturates
    assert spec.to_dict()["scale_dtype"] == "float16"
    assert QuantSpec.from_dict(spec.to_dict()) == spec
    assert "scale_dtype" not in QuantSpec(dtype="int8").to_dict()  # job identities as before


def _oracle_worst_groups(x, restored, axis, bs, keep=5):
    """Per group SQNR over its finite values, straight from the dequantized array (NumPy)."""
    finite = np.isfinite(x)
    xf = np.where(finite, x, 0).astype(np.float64)
    e = xf - np.where(finite, restored, 0).astype(np.float64)
    moved = [np.moveaxis(a, axis, -1) for a in (xf, e)]
    n = x.shape[axis]
    pad = -(-n // bs) * bs - n
    x2, e2, emax = (
        np.pad(a, [(0, 0)] * (x.ndim - 1) + [(0, pad)]).reshape(*a.shape[:-1], -1, bs)
        for a in (moved[0] ** 2, moved[1] ** 2, np.abs(moved[1]))
    )
    x2, e2, emax = x2.sum(-1), e2.sum(-1), emax.max(-1)
    x2, e2, emax = (np.moveaxis(a, -1, axis) for a in (x2, e2, emax))
    flat = np.flatnonzero(e2 > 0)
    sq = 10 * np.log10(x2.reshape(-1)[flat] / e2.reshape(-1)[flat])
    order = np.lexsort((flat, sq))[:keep]
    return [
        ([int(v) for v in np.unravel_index(flat[i], x2.shape)], sq[i], emax.reshape(-1)[flat[i]])
        for i in order
    ]


@pytest.mark.parametrize(
    "dtype, axis, bs, method, chunks",
    [
        ("int4", 1, 32, "dynamic", (32, 512)),
        ("uint4", 1, 128, "dynamic", (96, 200)),  # chunks cut through groups
        ("int8", 0, 16, "dynamic", (24, 512)),
        ("int8", 1, 64, "minmax", (20, 512)),
        ("uint8", 0, 16, "minmax", (32, 100)),
    ],
)
def test_report_names_the_worst_groups_like_a_numpy_oracle(
    tmp_path, dtype, axis, bs, method, chunks
):
    src, x = _source(tmp_path, chunks=chunks)
    spec = QuantSpec(
        dtype=dtype, axis=axis, block_size=bs, method=method, nan_policy="zero_point",
        symmetric=dtype.startswith("int"),
    )  # fmt: skip
    reports = [
        qs.quantize_store(str(src), tmp_path / f"q{m}.zarr", spec, max_memory=m)
        for m in (1 << 20, 64 << 20)
    ]
    restored = np.asarray(qs.open_quantized(tmp_path / "q1048576.zarr")[...])
    want = _oracle_worst_groups(x, restored, axis, bs)
    for r in reports:
        got = r.error["worst_groups"]
        assert [g["group"] for g in got] == [w[0] for w in want]
        np.testing.assert_allclose([g["sqnr_db"] for g in got], [w[1] for w in want], rtol=1e-9)
        np.testing.assert_allclose([g["max_abs"] for g in got], [w[2] for w in want], rtol=1e-12)
        for g in got:
            assert g["first_element"][axis] == g["group"][axis] * bs
    assert reports[0].error["worst_groups"] == reports[1].error["worst_groups"]
    stored = qs.open_quantized(tmp_path / "q1048576.zarr").summary()["error"]["worst_groups"]
    assert stored == reports[0].error["worst_groups"]
