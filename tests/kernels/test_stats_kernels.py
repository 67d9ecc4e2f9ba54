"""Range and histogram kernels against direct NumPy statements (hypothesis)."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from qstream.engine.blocks.blockmath import block_ranges, block_slot_ranges, channel_view
from qstream.kernels.stats import channel_histograms

SPECIAL = st.sampled_from([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -3.4e38, 3.4e38])
VALUES = st.one_of(st.floats(-1e6, 1e6, width=32), SPECIAL)


def float32_arrays(outer: int, channels: int, inner: int):
    """3-D float32 arrays up to the given sizes, with NaN, infinities, signed zeros."""
    shapes = st.tuples(st.integers(1, outer), st.integers(1, channels), st.integers(1, inner))
    return arrays(np.float32, shapes, elements=VALUES)


@given(
    x=float32_arrays(5, 40, 70),
    axis=st.sampled_from([None, 0, 1, 2]),
)
def test_block_ranges_equal_numpy_per_channel(x, axis):
    got = block_ranges(x, axis)
    xs = (
        np.moveaxis(x, axis, 0).reshape(x.shape[axis], -1) if axis is not None else x.reshape(1, -1)
    )
    for c, row in enumerate(xs):
        fin = row[np.isfinite(row)]
        assert got.count[c] == fin.size
        assert got.nan[c] == np.isnan(row).sum()
        assert got.posinf[c] == np.isposinf(row).sum()
        assert got.neginf[c] == np.isneginf(row).sum()
        if fin.size:
            assert got.min[c] == fin.min() and got.max[c] == fin.max()
    flat = x.reshape(-1)
    bad = ~np.isfinite(flat)
    assert got.first_nonfinite == (int(np.argmax(bad)) if bad.any() else -1)


@pytest.mark.filterwarnings("ignore:All-NaN slice")
@given(
    x=float32_arrays(3, 12, 300),
    use_abs=st.booleans(),
    nbins=st.sampled_from([16, 100, 2048]),
)
def test_channel_histograms_bin_by_the_stated_formula(x, use_abs, nbins):
    v = channel_view(x, 1)
    c = v.shape[1]
    fin = np.where(np.isfinite(v), v, np.nan).astype(np.float64)
    vals = np.abs(fin) if use_abs else fin
    with np.errstate(invalid="ignore"):
        lo = np.zeros(c) if use_abs else np.nan_to_num(np.nanmin(vals, axis=(0, 2)), nan=0.0)
        hi = np.nan_to_num(np.nanmax(vals, axis=(0, 2)), nan=0.0)
    h = np.zeros((c, nbins), np.int64)
    channel_histograms(v, lo, hi, use_abs, h)
    for ch in range(c):
        row = vals[:, ch].reshape(-1)
        row = row[~np.isnan(row)]
        w = hi[ch] - lo[ch]
        k = (
            np.clip(((row - lo[ch]) / w * nbins).astype(np.int64), 0, nbins - 1)
            if w > 0
            else np.zeros(row.size, np.int64)
        )
        np.testing.assert_array_equal(h[ch], np.bincount(k, minlength=nbins))


@pytest.mark.filterwarnings("ignore:All-NaN slice")
@given(
    x=float32_arrays(4, 50, 40),
    axis=st.sampled_from([0, 1, 2]),
    block=st.sampled_from([1, 3, 8, 32]),
)
def test_block_slot_ranges_equal_numpy_nanmin_nanmax(x, axis, block):
    lo, hi = block_slot_ranges(x, axis, block)
    m = np.moveaxis(np.where(np.isfinite(x), x, np.nan).astype(np.float64), axis, -1)
    n = m.shape[-1]
    nb = -(-n // block)
    pad = np.full((*m.shape[:-1], nb * block - n), np.nan)
    m = np.concatenate([m, pad], axis=-1).reshape(*m.shape[:-1], nb, block)
    want_lo = np.moveaxis(np.nanmin(m, axis=-1), -1, axis)
    want_hi = np.moveaxis(np.nanmax(m, axis=-1), -1, axis)
    np.testing.assert_array_equal(lo, want_lo)
    np.testing.assert_array_equal(hi, want_hi)


@given(x=float32_arrays(1, 60, 300), serial=st.booleans())
def test_rows_per_channel_fold_exactly_as_tiles(x, serial):
    """One row per channel (a pack's layout) folds its range straight into its channel: the
    same bytes as the tiles kernel, which gives each row a partial and folds it."""
    from qstream.kernels.stats import _ranges_channel_rows, _ranges_tiles, channel_rows

    assert channel_rows(x.shape, x.shape[1])
    c = x.shape[1]
    rng = np.random.default_rng(c)
    start = rng.standard_normal(c)  # outputs already holding an earlier block's figures
    got = []
    for kernel in (_ranges_channel_rows, _ranges_tiles):
        out = (
            np.where(start > 0, start, np.inf),
            np.where(start < 0, start, -np.inf),
            *(np.arange(c, dtype=np.int64) for _ in range(4)),
        )
        (kernel.serial if serial else kernel)(x, *out)
        got.append(b"".join(a.tobytes() for a in out))
    assert got[0] == got[1]
