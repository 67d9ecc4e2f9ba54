"""The fused error-statistics kernel against a direct NumPy computation of the same sums."""

import numpy as np
import pytest

import qstream as qs
from qstream.core.affine import affine_dequantize, affine_quantize
from qstream.core.layout import plan_layout
from qstream.engine.blocks.blockmath import block_errors, block_errors_fused

CASES = [
    ((50, 70), None, None, "int8"),
    ((50, 70), 0, None, "uint8"),
    ((50, 70), 1, None, "int8"),
    ((6, 50, 70), 1, None, "int16"),
    ((50, 64), 1, 16, "int8"),
    ((8, 64, 5), 1, 16, "int4"),
    ((30, 40), 0, None, "int32"),
    ((40000,), None, None, "uint8"),
    ((50, 1), 1, None, "int8"),  # one channel, on the inner axis: a per-tensor layout
]


@pytest.mark.parametrize(("shape", "axis", "block", "dtype"), CASES)
def test_fused_error_sums_equal_numpy_statement(shape, axis, block, dtype):
    rng = np.random.default_rng(len(shape) + (axis or 0))
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    x.flat[3], x.flat[7], x.flat[11], x.flat[15] = np.nan, 1e9, -np.inf, np.inf
    qt = qs.QTYPES[dtype]
    if axis is None:
        s, z = np.float32(0.05), np.float64(3 if qt.signed else 100)
    else:
        pshape = list(shape) if block else [shape[axis]]
        if block:
            pshape[axis] = -(-shape[axis] // block)
        s = rng.uniform(0.01, 0.1, pshape).astype(np.float32)
        z = np.zeros(pshape) + (0 if qt.signed else 7)
    s, z = np.asarray(s), np.asarray(z)
    layout = plan_layout(x.shape, s.shape, axis, block)
    q = affine_quantize(x, s, z, layout, qt)
    xhat = affine_dequantize(q, s, z, layout, qt)
    want = block_errors(
        x,
        xhat,
        layout.expand(s).astype(np.float64),
        layout.expand(z).astype(np.float64),
        qt,
        qt.qmin,
        qt.qmax,
        axis,
    )
    got = block_errors_fused(x, q, s, z, layout, qt, qt.qmin, axis)
    for k in ("count", "clipped", "nan", "posinf", "neginf", "max_abs"):
        np.testing.assert_array_equal(getattr(got, k), getattr(want, k))
    for k in ("sum_x2", "sum_e2", "sum_xy", "sum_y2"):
        np.testing.assert_allclose(getattr(got, k), getattr(want, k), rtol=1e-12)
    assert got.nonfinite.sum() == 3 and got.clipped.sum() >= 1
    assert (got.nan.sum(), got.posinf.sum(), got.neginf.sum()) == (1, 1, 1)


@pytest.mark.parametrize("axis", [None, 0, 1])
@pytest.mark.parametrize("dtype", ["int8", "float8_e4m3fn"])
def test_report_splits_non_finite_counts_per_tensor_and_per_channel(tmp_path, axis, dtype):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((40, 300)).astype(np.float32)
    x[2, 7] = x[2, 9] = np.nan
    x[5, 20] = np.inf
    x[9, 299] = x[9, 298] = x[30, 1] = -np.inf
    spec = qs.QuantSpec(dtype=dtype, axis=axis, nan_policy="zero_point")
    rep = qs.quantize_store(x, tmp_path / "q.zarr", spec, max_memory=1 << 20)
    e = rep.error
    assert (e["nonfinite"], e["nan"], e["posinf"], e["neginf"]) == (6, 2, 1, 3)
    stored = qs.open_quantized(tmp_path / "q.zarr").summary()["error"]
    assert (stored["nan"], stored["posinf"], stored["neginf"]) == (2, 1, 3)
    if axis is None:
        assert "nonfinite_channels" not in e
        return
    counts: dict[int, list[int]] = {}
    for kind, test in enumerate((np.isnan, np.isposinf, np.isneginf)):
        for idx in zip(*np.nonzero(test(x)), strict=True):
            counts.setdefault(int(idx[axis]), [0, 0, 0])[kind] += 1
    want = sorted(counts.items(), key=lambda kv: (-sum(kv[1]), kv[0]))[:5]
    got = [(r["channel"], [r["nan"], r["posinf"], r["neginf"]]) for r in e["nonfinite_channels"]]
    assert got == want


def test_a_piece_one_channel_wide_on_the_inner_axis_sums_its_channel(tmp_path):
    """Channels on the inner axis, 65 of them in chunks of 64: the last piece holds one
    channel, whose layout is per tensor. Its error sums are that channel's (they once ran
    as 64 channels into a one-channel array, writing beyond it)."""
    import zarr

    rng = np.random.default_rng(65)
    x = rng.standard_normal((64, 65)).astype(np.float32)
    x[0, 64] = 40.0  # (an outlier: the last channel's SQNR is the worst)
    src = zarr.create_array(tmp_path / "x.zarr", shape=x.shape, chunks=(64, 64), dtype="f4")
    src[...] = x
    spec = qs.QuantSpec(dtype="int8", axis=1)
    rep = qs.quantize_store(tmp_path / "x.zarr", tmp_path / "q.zarr", spec, max_memory=1 << 20)
    q = qs.open_quantized(tmp_path / "q.zarr")
    xhat = np.asarray(q[...], np.float64)
    e = x.astype(np.float64) - xhat
    assert rep.error["count"] == x.size
    want = 10 * np.log10((x.astype(np.float64) ** 2).sum() / (e**2).sum())
    assert rep.error["sqnr_db"] == pytest.approx(want, rel=1e-9)
    per_channel = 10 * np.log10((x.astype(np.float64) ** 2).sum(0) / (e**2).sum(0))
    order = np.argsort(per_channel, kind="stable")[:5]
    worst = rep.error["worst_channels"]
    assert [c["channel"] for c in worst] == order.tolist() and order[0] == 64
    for c in worst:
        assert c["sqnr_db"] == pytest.approx(per_channel[c["channel"]], rel=1e-9)


@pytest.mark.parametrize("serial", [False, True])
@pytest.mark.parametrize(("rows", "width", "cblock"), [(300, 128, 1), (64, 513, 3), (7, 16384, 1)])
def test_rows_per_channel_sum_exactly_as_tiles(rows, width, cblock, serial):
    """One row per channel (a pack's layout) adds its error sums straight to its channel:
    the same bytes as the tiles kernel, which gives each row a partial and folds it, with
    NaN, infinities and signed zeros, onto sums already holding an earlier block's."""
    from qstream.kernels.error_stats import (
        N_SUMS,
        NO_GROUPS,
        _error_sums_channel_rows,
        _error_sums_tiles,
    )

    rng = np.random.default_rng(rows)
    x = (rng.standard_normal((1, rows, width)) * 4).astype(np.float32)
    flat = x.reshape(-1)
    k = rng.choice(flat.size, flat.size // 40, replace=False)
    flat[k[0::4]], flat[k[1::4]], flat[k[2::4]], flat[k[3::4]] = np.nan, np.inf, -np.inf, -0.0
    n_p = -(-rows // cblock)
    s = rng.uniform(0.01, 0.05, (1, n_p, 1))
    z = rng.integers(-3, 4, (1, n_p, 1)).astype(np.int32)
    per_row = np.repeat(s, cblock, axis=1)[:, :rows]
    zr = np.repeat(z, cblock, axis=1)[:, :rows]
    q = np.clip(np.rint(np.nan_to_num(x) / per_row) + zr, -128, 127).astype(np.int8)
    start = np.abs(rng.standard_normal((rows, N_SUMS)))
    start[:, [0, 6, 7, 8, 9]] = np.round(start[:, [0, 6, 7, 8, 9]] * 100)  # (counts: whole)
    direct, tiles = start.copy(), start.copy()
    pick = (lambda k: k.serial) if serial else (lambda k: k)
    pick(_error_sums_channel_rows)(x, q, s, z, cblock, -128, 127, direct)
    pick(_error_sums_tiles)(x, q, s, z, cblock, width, -128, 127, tiles, *(NO_GROUPS,) * 3, False)
    assert direct.tobytes() == tiles.tobytes()


def test_error_sums_refuses_sums_that_do_not_fit_the_inner_channels():
    from qstream.kernels.error_stats import N_SUMS, error_sums

    x = np.ones((1, 1, 64), np.float32)
    q = np.ones((1, 1, 64), np.int8)
    s, z = np.ones((1, 1, 1), np.float32), np.zeros((1, 1, 1), np.float32)
    with pytest.raises(ValueError, match="sums for 1 channels, 64 on the inner axis"):
        error_sums(x, q, s, z, 1, 64, -128.0, 127.0, True, np.zeros((1, N_SUMS)))


def _stats(kind, channels, rng, signed_zero=False):
    from dataclasses import fields

    values = {}
    for f in fields(kind):
        if f.name == "first_nonfinite":
            continue
        ints = f.name in ("count", "clipped", "nan", "posinf", "neginf")
        v = rng.integers(0, 9, channels) if ints else rng.standard_normal(channels)
        if signed_zero and not ints:
            v[::2] = -0.0
        values[f.name] = v.astype(np.int64 if ints else np.float64)
    return kind(**values)


@pytest.mark.parametrize("kind", ["RangeStats", "ErrorStats"])
def test_merged_stats_keep_a_whole_first_part_with_the_values_merging_gives(kind):
    """A first part covering every channel is kept rather than merged into empties: the
    same values, bit for bit (-0.0 sums made +0.0, as adding them to zeros does), and a
    later part merges into a copy, leaving the kept part as it was."""
    from dataclasses import fields

    from qstream.spec import MergedStats, merge_into
    from qstream.spec import stats as S

    cls = getattr(S, kind)
    rng = np.random.default_rng(3)

    def arrays(st):
        return {
            f.name: getattr(st, f.name).tobytes() for f in fields(st) if f.name != "first_nonfinite"
        }

    first, second = _stats(cls, 6, rng, signed_zero=True), _stats(cls, 6, rng)
    want = cls.empty(6)
    merge_into(want, first)
    merged = MergedStats(cls, 6)
    merged.add(_stats(cls, 6, np.random.default_rng(3), signed_zero=True))
    assert arrays(merged.total) == arrays(want)
    kept = merged.total
    kept_bytes = arrays(kept)
    merge_into(want, second)
    merged.add(second)
    assert arrays(merged.total) == arrays(want)
    assert arrays(kept) == kept_bytes and merged.total is not kept
    # parts of some channels, or of another dtype, are merged as before
    part = MergedStats(cls, 6)
    piece = _stats(cls, 3, rng)
    part.add(piece, 3)
    want = cls.empty(6)
    merge_into(want, piece, 3)
    assert arrays(part.total) == arrays(want)
    assert arrays(MergedStats(cls, 4).total) == arrays(cls.empty(4))
