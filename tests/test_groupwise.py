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
    (dtype, axis, bs, sym)
    for dtype in ("int8", "uint8", "int4", "uint4", "int2", "uint2", "int16")
    for axis, bs in ((1, 32), (1, 128), (0, 16))
    for sym in (True, False)
] + [("int8", 1, 256, True), ("uint4", 1, 64, False), ("int8", 1, 16, True)]


@pytest.mark.parametrize("dtype, axis, bs, sym", CASES)
def test_fused_groupwise_kernel_is_bit_identical_to_the_unfused_path(
    tmp_path, monkeypatch, dtype, axis, bs, sym
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
