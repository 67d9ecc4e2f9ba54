"""The NumPy twins (qstream.kernels.numpy_twins) against the Numba kernels they stand for:
the same bits for ranges, histograms, percentile ranges and codes (every round code), and the
same error figures (sums up to float64 rounding), on values with NaN, infinities and signed
zeros (hypothesis)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from qstream.budget import TILE
from qstream.kernels import numpy_twins as tw
from qstream.kernels.affine import QUANTIZE_KERNELS
from qstream.kernels.error_stats import N_SUMS, error_sums
from qstream.kernels.runtime import run
from qstream.kernels.search import percentile_ranges
from qstream.kernels.stats import channel_histograms, channel_ranges

SPECIAL = st.sampled_from([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -3.4e38, 3.4e38])
VALUES = st.one_of(st.floats(-1e4, 1e4, width=32), SPECIAL)
ZEROS = st.sampled_from([0.0, -0.0, 1.5, -2.0, np.nan])


def arrays3(outer: int, channels: int, inner: int, elements=VALUES):
    shapes = st.tuples(st.integers(1, outer), st.integers(1, channels), st.integers(1, inner))
    return arrays(np.float32, shapes, elements=elements)


def ranges_both(x):
    outs = []
    for fn in (channel_ranges, tw.channel_ranges):
        c = x.shape[1]
        o = [np.full(c, np.inf), np.full(c, -np.inf)] + [np.zeros(c, np.int64) for _ in range(4)]
        fn(x, *o)
        outs.append(o)
    return outs


def same_bits(a, b):
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape
    assert a.tobytes() == b.tobytes(), (a, b)


@given(x=st.one_of(arrays3(4, 9, 40), arrays3(4, 9, 12, elements=ZEROS)))
def test_channel_ranges_twin_gives_the_kernels_bits(x):
    kernel, twin = ranges_both(x)
    for k, t in zip(kernel, twin, strict=True):
        same_bits(k, t)


def test_channel_ranges_twin_across_tiles_and_signed_zeros():
    rng = np.random.default_rng(0)
    x = rng.choice(np.array([0.0, -0.0, 1.0], np.float32), size=(2, 3, 2 * TILE + 5))
    x[1, 2, TILE + 7] = np.nan  # one tile compared value by value
    x[0, 1, :] = np.where(x[0, 1] == 1.0, 0.0, x[0, 1])
    kernel, twin = ranges_both(x)
    for k, t in zip(kernel, twin, strict=True):
        same_bits(k, t)


@given(x=arrays3(4, 12, 30), use_abs=st.booleans(), nbins=st.sampled_from([1, 7, 64]))
def test_channel_histograms_twin_counts_as_the_kernel(x, use_abs, nbins):
    c = x.shape[1]
    fin = np.where(np.isfinite(x), x, 0).astype(np.float64)
    lo = np.zeros(c) if use_abs else fin.min(axis=(0, 2))
    hi = np.abs(fin).max(axis=(0, 2)) if use_abs else fin.max(axis=(0, 2))
    hk = np.zeros((c, nbins), np.int64)
    ht = np.zeros((c, nbins), np.int64)
    channel_histograms(x, lo, hi, use_abs, hk)
    tw.channel_histograms(x, lo, hi, use_abs, ht)
    same_bits(hk, ht)


@given(
    counts=arrays(
        np.int64, st.tuples(st.integers(1, 6), st.integers(1, 40)), elements=st.integers(0, 50)
    ),
    percentile=st.sampled_from([50.0, 90.0, 99.0, 99.99, 100.0]),
    symmetric=st.booleans(),
)
def test_percentile_ranges_twin_gives_the_kernels_bits(counts, percentile, symmetric):
    n = counts.shape[0]
    hlo = np.zeros(n) if symmetric else np.linspace(-3.0, -1.0, n)
    hhi = np.linspace(0.5, 4.0, n)
    lo, hi = hlo - 0.25, hhi - 0.5
    outs = []
    for fn in (lambda *a: run(percentile_ranges, *a), tw.percentile_ranges):
        out_lo, out_hi = np.empty(n), np.empty(n)
        fn(counts, hlo, hhi, lo, hi, percentile, symmetric, out_lo, out_hi)
        outs.append((out_lo, out_hi))
    for k, t in zip(*outs, strict=True):
        same_bits(k, t)


LAYOUTS = [  # x [O, C, I] -> (param shape [Op, Cp, Ip], cblock, iblock), as plan_layout makes
    lambda o, c, i: ((1, 1, 1), c, i),  # per tensor
    lambda o, c, i: ((1, c, 1), 1, i),  # per channel, channels in the middle
    lambda o, c, i: ((1, 1, i), c, 1),  # per channel on the inner axis
    lambda o, c, i: ((o, c, -(-i // 4)), 1, 4),  # blocks of 4 along the inner axis
    lambda o, c, i: ((1, -(-c // 2), 1), 2, i),  # blocks of 2 rows
]


@settings(max_examples=60)
@given(
    x=arrays3(3, 6, 20),
    code=st.integers(0, len(QUANTIZE_KERNELS) - 1),
    layout=st.sampled_from(LAYOUTS),
    qtype=st.sampled_from(
        [("int8", -128, 127, 0xFF), ("uint8", 0, 255, 0xFF), ("int16", -32768, 32767, 0xFFFF)]
    ),
    wide=st.booleans(),
    data=st.data(),
)
def test_quantize_twin_gives_every_round_codes_bits(x, code, layout, qtype, wide, data):
    shape, cblock, iblock = layout(*x.shape)
    ft = np.float64 if wide else np.float32
    scale = data.draw(
        arrays(ft, shape, elements=st.sampled_from([0.01, 0.5, 1.0, 3.0, 1e-3, 7.25]))
    )
    zp = data.draw(arrays(ft, shape, elements=st.sampled_from([0.0, 3.0, -5.0, 100.0])))
    name, qmin, qmax, mask = qtype
    xk = x.astype(ft)
    container = np.uint16 if name == "int16" else np.uint8
    outs = []
    for fn in (lambda *a: run(QUANTIZE_KERNELS[code], *a), lambda *a: tw.quantize(code, *a)):
        out = np.zeros(x.shape, container)
        fn(xk, scale, zp, cblock, iblock, np.float32(qmin), np.float32(qmax), np.int32(mask), out)
        outs.append(out)
    same_bits(*outs)


#: (layout, whose channels the errors are summed for), as the error pass pairs them: one per
#: tensor, the middle axis's channels, or the inner axis's (a layout without per-row
#: parameters: the kernel reads each row's parameters once)
ERROR_LAYOUTS = [
    (LAYOUTS[0], "tensor"),
    (LAYOUTS[1], "outer"),
    (LAYOUTS[4], "outer"),
    (LAYOUTS[2], "inner"),
    (LAYOUTS[0], "inner"),
]


@settings(max_examples=80)
@given(x=arrays3(3, 6, 30), case=st.sampled_from(ERROR_LAYOUTS), data=st.data())
def test_error_sums_twin_matches_the_kernel(x, case, data):
    layout, per = case
    shape, cblock, iblock = layout(*x.shape)
    scale = data.draw(arrays(np.float32, shape, elements=st.sampled_from([0.01, 0.5, 3.0])))
    zp = data.draw(arrays(np.float32, shape, elements=st.sampled_from([0.0, 3.0, -5.0])))
    q = data.draw(arrays(np.int8, x.shape, elements=st.integers(-128, 127)))
    channels = {"tensor": 1, "outer": x.shape[1], "inner": x.shape[2]}[per]
    chan_inner = per == "inner"
    k = np.zeros((channels, N_SUMS))
    t = np.zeros((channels, N_SUMS))
    error_sums(x, q, scale, zp, cblock, iblock, -128.0, 127.0, chan_inner, k)
    tw.error_sums(x, q, scale, zp, cblock, iblock, -128.0, 127.0, chan_inner, t)
    exact = [0, 5, 6, 7, 8, 9]
    same_bits(k[:, exact], t[:, exact])
    # (sum x*y may cancel: its terms are bounded by (x^2 + y^2) / 2)
    bound = 1e-12 * (k[:, 1] + k[:, 2] + k[:, 4])[:, None]
    assert (np.abs(t[:, 1:5] - k[:, 1:5]) <= bound).all()


def test_error_sums_twin_refuses_group_sums():
    x = np.zeros((1, 1, 4), np.float32)
    g = np.zeros((1, 1, 1))
    with pytest.raises(ValueError, match="groups"):
        tw.error_sums(
            x, x.astype(np.int8), g, g, 1, 1, -128.0, 127.0, False, np.zeros((1, 10)), (g, g, g)
        )


def test_percentile_ranges_twin_across_runs_of_channels():
    rng = np.random.default_rng(3)
    counts = rng.integers(0, 4, (150, 300))  # (more channels than the twin takes at once)
    counts[7] = 0
    n = counts.shape[0]
    hlo, hhi = -rng.random(n) - 1.0, rng.random(n) + 1.0
    for symmetric in (True, False):
        outs = []
        for fn in (lambda *a: run(percentile_ranges, *a), tw.percentile_ranges):
            out_lo, out_hi = np.empty(n), np.empty(n)
            fn(counts, hlo, hhi, hlo * 0.9, hhi * 0.9, 99.5, symmetric, out_lo, out_hi)
            outs.append((out_lo, out_hi))
        for k, t in zip(*outs, strict=True):
            same_bits(k, t)


@pytest.mark.parametrize("percentile", [0.0, 50.0, 99.99, 100.0])
def test_percentile_ranges_twin_on_mostly_empty_histograms(percentile):
    # a few values per channel in many bins (a small tensor's channels in 2048 bins), with
    # empty channels, one-bin channels and channels whose every count sits in the last bin
    rng = np.random.default_rng(11)
    n, nb = 300, 2048
    counts = np.zeros((n, nb), np.int64)
    for c in range(n):
        k = int(rng.integers(0, 40))
        np.add.at(counts[c], rng.integers(0, nb, k), rng.integers(1, 5, k))
    counts[5] = 0
    counts[6, 0] = 9
    counts[7, -1] = 3
    hlo, hhi = -rng.random(n) - 1.0, rng.random(n) + 1.0
    for symmetric in (True, False):
        outs = []
        for fn in (lambda *a: run(percentile_ranges, *a), tw.percentile_ranges):
            out_lo, out_hi = np.empty(n), np.empty(n)
            fn(counts, hlo, hhi, hlo * 0.9, hhi * 0.9, percentile, symmetric, out_lo, out_hi)
            outs.append((out_lo, out_hi))
        for k, t in zip(*outs, strict=True):
            same_bits(k, t)
