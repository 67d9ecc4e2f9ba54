"""Group-wise (blocked dynamic) quantization: the fused kernel (ranges, parameters and
values in one pass) against the unfused path it replaces, bit for bit, and both against the
in-memory quantizer with the stored parameters."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import zarr
from hypothesis import given, settings
from hypothesis import strategies as st

import qstream as qs
from qstream import QuantSpec
from qstream.engine.blocks.work import QuantizeWork

from ..support import oracle


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


def _case_spec(dtype, axis, bs, sym, scale_dtype) -> QuantSpec:
    """The spec of a CASES row (NaN to the zero point; int8 groups of 16 narrow-range)."""
    return QuantSpec(
        dtype=dtype,
        axis=axis,
        block_size=bs,
        method="dynamic",
        symmetric=sym,
        nan_policy="zero_point",
        narrow_range=dtype == "int8" and bs == 16,
        scale_dtype=scale_dtype,
    )


@pytest.mark.parametrize("dtype, axis, bs, sym, scale_dtype", CASES)
def test_fused_groupwise_kernel_is_bit_identical_to_the_unfused_path(
    tmp_path, monkeypatch, dtype, axis, bs, sym, scale_dtype
):
    src, x = _source(tmp_path)
    spec = _case_spec(dtype, axis, bs, sym, scale_dtype)
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


@pytest.mark.parametrize(
    "dtype, axis, bs, sym",
    [
        ("int8", 1, 32, True),
        ("uint4", 1, 128, False),
        ("int4", 1, 64, True),
        ("int8", 0, 32, True),
        ("uint4", 0, 16, False),
    ],
)
def test_errors_taken_in_the_fused_pass_equal_the_error_kernel(dtype, axis, bs, sym):
    """Along the rows: rows longer than the error kernel's tile (16384) and a short last
    group; along axis 0: groups that are columns, the last block short. With NaN/inf and a
    huge value, the sums the fused pass takes while the values are in cache, and every
    group's, are the error kernel's bit for bit."""
    from qstream.engine.blocks.blockmath import block_errors_fused, dynamic_blocked
    from qstream.qtypes import qtype

    rng = np.random.default_rng(4)
    shape = (5, 40_010) if axis == 1 else (70, 3_000)
    x = (rng.standard_normal(shape) * 0.05).astype(np.float32)
    x.flat[16_380:16_390] = [np.nan, np.inf, -np.inf, 1, 2, 3, np.nan, 4, 5, 6]
    x.flat[-30] = np.float32(3e38)
    x[3, 100:132] = 0.0
    x.flat[-80:] = np.nan  # along the rows, a short last group with no finite value
    qt = qtype(dtype)
    spec = QuantSpec(dtype=dtype, axis=axis, block_size=bs, method="dynamic", symmetric=sym)
    q = np.empty(x.shape, qt.dtype)
    s, z, layout, nonfinite, (stats, groups) = dynamic_blocked(x, qt, spec, axis, q, True)
    assert nonfinite >= 3  # the (row, group) pieces holding NaN or inf
    want_groups = tuple(np.zeros(layout.pshape3) for _ in range(3))
    lo_q = qt.qrange(False)[0]
    want = block_errors_fused(x, q, s, z, layout, qt, lo_q, None, want_groups)
    for field in ("count", "sum_x2", "sum_e2", "sum_xy", "sum_y2", "max_abs", "clipped"):
        assert getattr(stats, field).tobytes() == getattr(want, field).tobytes(), field
    assert (stats.nan, stats.posinf, stats.neginf) == (want.nan, want.posinf, want.neginf)
    assert (int(stats.nan[0]), int(stats.posinf[0]), int(stats.neginf[0])) == (82, 1, 1)
    for got, exp in zip(groups, want_groups, strict=True):
        assert got.tobytes() == exp.tobytes()
    # and the sums are right: a NumPy statement of them, to float rounding
    fin = np.isfinite(x)
    xf = np.where(fin, x, 0).astype(np.float64)
    assert int(stats.count[0]) == int(fin.sum())
    assert stats.sum_x2[0] == pytest.approx(float((xf * xf).sum()), rel=1e-12)


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
        ("uint4", 1, 64, "dynamic", (32, 64)),  # one group across each chunk's rows
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


# --- quantize_dynamic: the in-memory entry point ---------------------------------------------

QRANGE = {"int8": (-128, 127), "uint8": (0, 255), "int4": (-8, 7), "uint4": (0, 15)}


def _oracle_group_params(x, dtype, axis, bs, symmetric):
    """Per group of ``bs`` along ``axis``: the finite range widened to hold 0, then
    ``absmax / steps`` (symmetric; unsigned types centred on the mid code) or ``(hi - lo) /
    (qmax - qmin)`` with ``zp = clip(rint(qmin - lo / s))`` (asymmetric), rounded to float32
    and never below the smallest positive float32; scale 1 for an all-zero or all-non-finite
    group. Plain Python floats, one group at a time."""
    tiny = np.float32(2.0**-149)
    qmin, qmax = QRANGE[dtype]
    xm = np.moveaxis(x, axis, -1)
    ng = -(-xm.shape[-1] // bs)
    s = np.empty((*xm.shape[:-1], ng), np.float32)
    z = np.empty(s.shape, np.float64)
    for idx in np.ndindex(*s.shape):
        g = xm[idx[:-1]][idx[-1] * bs : (idx[-1] + 1) * bs].astype(np.float64)
        g = g[np.isfinite(g)]
        lo = min(float(g.min()), 0.0) if g.size else 0.0
        hi = max(float(g.max()), 0.0) if g.size else 0.0
        if symmetric:
            zp = 0.0 if qmin < 0 else float((qmin + qmax + 1) // 2)
            steps = float(min(qmax, -qmin)) if qmin < 0 else float(min(qmax - zp, zp - qmin))
            amax = max(-lo, hi)
            s[idx] = max(np.float32(amax / steps), tiny) if amax > 0 else np.float32(1.0)
            z[idx] = zp
        else:
            span = hi - lo
            s[idx] = max(np.float32(span / (qmax - qmin)), tiny) if span > 0 else np.float32(1.0)
            z[idx] = min(max(float(np.rint(qmin - lo / float(s[idx]))), qmin), qmax)
    return np.moveaxis(s, -1, axis), np.moveaxis(z, -1, axis)


@pytest.mark.parametrize("dtype, axis, bs, sym, scale_dtype", CASES)
@pytest.mark.parametrize("source_dtype", ["float32", "float64"])
def test_quantize_dynamic_gives_the_codes_and_parameters_of_quantize_store(
    tmp_path, dtype, axis, bs, sym, scale_dtype, source_dtype
):
    _, x = _source(tmp_path)
    x = x.astype(source_dtype)
    spec = _case_spec(dtype, axis, bs, sym, scale_dtype)
    r = qs.quantize_dynamic(x, spec)
    qs.quantize_store(x, tmp_path / "q.zarr", spec)
    g = zarr.open_group(str(tmp_path / "q.zarr"), mode="r")
    assert r.q.dtype == qs.QTYPES[dtype].dtype and r.zero_point.dtype == r.q.dtype
    np.testing.assert_array_equal(r.q.view(np.asarray(g["data"]).dtype), g["data"][...])
    np.testing.assert_array_equal(r.scale, g["scale"][...])
    assert r.scale.dtype == np.dtype(scale_dtype)
    zp = g["zero_point"][...].astype(np.int64)
    np.testing.assert_array_equal(r.zero_point.astype(np.int64), zp)
    assert (r.axis, r.block_size) == (axis, bs)


@settings(max_examples=60, deadline=None)
@given(
    data=st.data(),
    case=st.sampled_from(
        [("int8", True), ("uint8", True), ("int4", True), ("uint4", False), ("int8", False)]
    ),
    axis=st.sampled_from([0, 1]),
    bs=st.sampled_from([1, 3, 16, 32]),
)
def test_quantize_dynamic_matches_a_numpy_oracle_on_any_float32(data, case, axis, bs):
    dtype, symmetric = case
    shape = data.draw(st.tuples(st.integers(1, 5), st.integers(1, 70)))
    special = st.sampled_from(
        [0.0, -0.0, np.inf, -np.inf, np.nan, 3.4028235e38, -3.4028235e38, 1e-45, -1e-45, 1.2e-38]
    )
    values = st.one_of(st.floats(width=32, allow_nan=True, allow_infinity=True), special)
    x = np.array(data.draw(st.lists(values, min_size=math.prod(shape), max_size=math.prod(shape))))
    x = x.astype(np.float32).reshape(shape)
    r = qs.quantize_dynamic(
        x, dtype=dtype, axis=axis, block_size=bs, symmetric=symmetric, nan_policy="min"
    )
    s, z = _oracle_group_params(x, dtype, axis, bs, symmetric)
    np.testing.assert_array_equal(r.scale, s)
    np.testing.assert_array_equal(r.zero_point.astype(np.float64), z)
    finite = np.isfinite(x)
    want = oracle.quantize(np.where(finite, x, 0), s, z, *QRANGE[dtype], axis=axis, block_size=bs)
    np.testing.assert_array_equal(r.q.astype(np.int64)[finite], want[finite])
    # non-finite values saturate, NaN to the type's minimum (ONNX Runtime), as quantize_store
    lo, hi = QRANGE[dtype]
    q = r.q.astype(np.int64)
    assert (q[np.isposinf(x)] == hi).all() and (q[np.isneginf(x)] == lo).all()
    assert (q[np.isnan(x)] == lo).all()


def test_quantize_dynamic_refuses_nan_by_default_naming_the_first(tmp_path):
    _, x = _source(tmp_path)
    with pytest.raises(qs.NonFiniteInputError) as e:
        qs.quantize_dynamic(x, dtype="int8", axis=1, block_size=32)
    msg = str(e.value)
    assert (
        "first at index (3, 17)" in msg and "35 non-finite values (33 NaN, 1 +inf, 1 -inf)" in msg
    )
    x64 = x.astype(np.float64)  # the unfused path checks the same
    with pytest.raises(qs.NonFiniteInputError, match=r"first at index \(3, 17\)"):
        qs.quantize_dynamic(x64, dtype="int8", axis=1, block_size=32)


def test_quantize_dynamic_nan_to_zero_point_policy(tmp_path):
    _, x = _source(tmp_path)
    r = qs.quantize_dynamic(
        x, dtype="uint4", axis=1, block_size=32, symmetric=False, nan_policy="zero_point"
    )
    zp = np.repeat(r.zero_point.astype(np.int64), 32, axis=1)[:, : x.shape[1]]
    nan = np.isnan(x)
    np.testing.assert_array_equal(r.q.astype(np.int64)[nan], zp[nan])


def test_quantize_dynamic_round_trips_through_dequantize_within_half_a_step():
    x = (np.random.default_rng(3).standard_normal((40, 250)) * 0.02).astype(np.float32)
    r = qs.quantize_dynamic(x, dtype="int8", axis=-1, block_size=32)
    assert r.axis == 1 and r.scale.shape == (40, 8)
    y = r.dequantize()
    np.testing.assert_array_equal(
        y, qs.dequantize(r.q, r.scale, r.zero_point, axis=1, block_size=32)
    )
    step = np.repeat(r.scale, 32, axis=1)[:, :250]
    assert (np.abs(y - x) <= step / 2 * (1 + 1e-6)).all()


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda x: qs.quantize_dynamic(x, dtype="int8", axis=1), "needs block_size"),
        (lambda x: qs.quantize_dynamic(x, dtype="int8", axis=1, block_size=8, method="minmax"),
         "needs method='dynamic'"),
        (lambda x: qs.quantize_dynamic(x, QuantSpec(dtype="int8", axis=1, block_size=8,
                                                    method="dynamic"), dtype="int4"),
         "either a QuantSpec or its fields"),
        (lambda x: qs.quantize_dynamic(x.astype(np.int32), dtype="int8", axis=1, block_size=8),
         "must be a floating array"),
        (lambda x: qs.quantize_dynamic(x, dtype="int8", axis=2, block_size=8), "axis 2 is out"),
        (lambda x: qs.quantize_dynamic(x, dtype="int8", axis=1, block_size=0), "block_size"),
    ],
)  # fmt: skip
def test_quantize_dynamic_rejects_bad_arguments_by_name(call, message):
    x = np.ones((4, 16), np.float32)
    with pytest.raises(qs.QStreamError, match=message):
        call(x)


def test_kernel_half_scale_rounds_like_numpy_float16_at_ties_and_boundaries():
    from numba import njit

    from qstream.calibration.params import half_scales
    from qstream.kernels.affine import half_scale

    @njit
    def each(a):
        out = np.empty_like(a)
        for i in range(a.size):
            out[i] = half_scale(a[i])
        return out

    rng = np.random.default_rng(0)
    a = rng.integers(1, 0x7F800000, 200_000, dtype=np.int64).astype(np.int32).view(np.float32)
    h = np.arange(1, 0x7C00, dtype=np.uint16).view(np.float16).astype(np.float64)
    ties = ((h[:-1] + h[1:]) / 2).astype(np.float32)  # exact: float16 midpoints fit float32
    edges = np.float32([65504, 65519, 65520, 1e30, 2.0**-24, 2.0**-25, 1e-45, 2.0**-14])
    a = np.concatenate(
        [a, h.astype(np.float32), ties, *(np.nextafter(ties, t) for t in (0, np.inf)), edges]
    ).astype(np.float32)
    np.testing.assert_array_equal(each(a).view(np.int32), half_scales(a).view(np.int32))


@pytest.mark.parametrize("dtype, sym", [("int8", True), ("uint4", False)])
def test_memory_store_output_equals_the_disk_output_across_many_blocks(tmp_path, dtype, sym):
    # the engine reuses its buffers from block to block; an in-memory store must not keep them
    _, x = _source(tmp_path, shape=(256, 512))
    x = np.nan_to_num(x, nan=0.0, posinf=1.0, neginf=-1.0)
    spec = QuantSpec(dtype=dtype, axis=1, block_size=32, method="dynamic", symmetric=sym)
    qs.quantize_store(x, tmp_path / "d.zarr", spec, max_memory=1 << 20)
    qs.quantize_store(x, "memory://many-blocks", spec, max_memory=1 << 20, overwrite=True)
    disk, mem = qs.open_quantized(tmp_path / "d.zarr"), qs.open_quantized("memory://many-blocks")
    np.testing.assert_array_equal(mem.quantized(...), disk.quantized(...))
    np.testing.assert_array_equal(mem.scale, disk.scale)
    np.testing.assert_array_equal(mem.zero_point, disk.zero_point)
    np.testing.assert_array_equal(
        qs.open_quantized("memory://many-blocks")[...], qs.open_quantized(tmp_path / "d.zarr")[...]
    )


def test_float16_bits_of_every_positive_float16_value():
    from qstream.kernels.blocked import float16_bits
    from qstream.kernels.runtime import run

    h = np.arange(1, 0x7C00, dtype=np.uint16)  # every positive finite float16, subnormals too
    out = np.empty_like(h)
    run(float16_bits, h.view(np.float16).astype(np.float32), out)
    np.testing.assert_array_equal(out, h)
