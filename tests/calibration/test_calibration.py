"""Calibration methods: the peers' threshold searches, given the same histogram, choose the
same threshold; ranges map to parameters by the stated conventions."""

from collections import Counter

import numpy as np
import pytest
from scipy.stats import entropy as scipy_entropy

import qstream as qs
from qstream.calibration.histogram import percentile_range
from qstream.calibration.params import params_from_range
from qstream.kernels.search import entropy_search, l2_search, mse_search


def _hists(n=3, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        x = np.abs(rng.standard_t(3 + k, 100_000)).astype(np.float32)
        out.append((np.histogram(x, bins=2048, range=(0, float(x.max())))[0], float(x.max())))
    return out


def _entropy_oracle(hist, nlevels, start=128):
    """TensorRT / NVIDIA pytorch-quantization KL search, stated directly."""
    bins = hist.astype(np.float64).copy()
    bins[0] = bins[1]
    divergences = []
    for i in range(start, len(bins) + 1):
        group = np.digitize(np.arange(i), np.linspace(0, i, nlevels + 1)) - 1
        group[bins[:i] == 0] = -1
        sums, sizes = np.zeros(nlevels), Counter(group)
        for j, g in enumerate(group):
            if g != -1:
                sums[g] += bins[j]
        q = np.array([sums[g] / sizes[g] if g != -1 else 0.0 for g in group])
        p = bins[:i].copy()
        p[-1] += bins[i:].sum()
        divergences.append(scipy_entropy(p, q))
    d = np.array(divergences)
    return len(d) - 1 - int(np.argmin(d[::-1])) + start


@pytest.mark.parametrize(("hist", "top"), _hists())
def test_entropy_search_matches_tensorrt_kl(hist, top):
    assert entropy_search(hist, 128, 128, 1) == _entropy_oracle(hist, 128)


@pytest.mark.parametrize(("hist", "top"), _hists())
def test_mse_search_matches_nvidia_bin_centre_mse(hist, top):
    torch = pytest.importorskip("torch")
    edges = torch.linspace(0, top, 2049, dtype=torch.float64).float()
    centers = (edges[1:] + edges[:-1]) / 2
    counts = torch.from_numpy(hist).float()
    mses = []
    for i in range(128, len(centers)):
        scale = 127.0 / centers[i]
        q = torch.clamp(torch.round(centers * scale), -128, 127) / scale
        mses.append(((q - centers) ** 2 * counts).double().sum().item())
    assert mse_search(hist, top, 127.0, 128, 1) == 128 + int(np.argmin(mses))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_l2_search_matches_torch_histogram_observer(seed):
    torch = pytest.importorskip("torch")
    from torch.ao.quantization.observer import HistogramObserver

    x = torch.from_numpy(np.random.default_rng(seed).standard_t(4, 50_000).astype(np.float32))
    obs = HistogramObserver(bins=2048)
    obs(x)
    lo, hi = obs.min_val.item(), obs.max_val.item()
    start, end = l2_search(obs.histogram.numpy().astype(np.float64), lo, hi, 256)
    new_min, new_max = obs._non_linear_param_search()
    width = (obs.max_val - obs.min_val) / 2048
    assert (obs.min_val + width * start).item() == new_min.item()
    assert (obs.min_val + width * (end + 1)).item() == new_max.item()


def test_percentile_matches_onnxruntime_percentile_calibrater_formula():
    rng = np.random.default_rng(4)
    x = rng.standard_normal(50_000)
    h, edges = np.histogram(np.abs(x), bins=2048, range=(0, np.abs(x).max()))
    cdf = np.cumsum(h / h.sum())
    want = edges[np.searchsorted(cdf, 0.999)]
    lo, hi = percentile_range(
        {"counts": h[None], "lo": np.zeros(1), "hi": np.array([edges[-1]])},
        np.array([x.min()]),
        np.array([x.max()]),
        99.9,
        symmetric=True,
    )
    assert hi[0] == want and lo[0] == -want


def test_range_to_parameters_conventions():
    i8, u8 = qs.QTYPES["int8"], qs.QTYPES["uint8"]
    s, z = params_from_range(np.array([-1.0]), np.array([2.54]), i8, symmetric=True)
    assert s[0] == np.float32(2.54 / 127) and z[0] == 0
    s, z = params_from_range(np.array([-1.0]), np.array([2.0]), u8, symmetric=False)
    assert s[0] == np.float32(3.0 / 255) and z[0] == np.rint(1.0 / np.float32(3.0 / 255))
    s, z = params_from_range(np.array([1.0]), np.array([5.0]), u8, symmetric=False)
    assert z[0] == 0  # the range is widened to contain 0
    s, z = params_from_range(np.array([0.0]), np.array([0.0]), i8, symmetric=True)
    assert s[0] == 1.0
    s, z = params_from_range(np.array([-2.0]), np.array([1.0]), u8, symmetric=True)
    assert z[0] == 128 and s[0] == np.float32(2.0 / 127)


@pytest.mark.parametrize("method", ["entropy", "mse", "l2", "percentile"])
def test_histogram_methods_clip_heavy_tails_in_store_conversions(tmp_path, method):
    rng = np.random.default_rng(9)
    x = (rng.standard_t(3, (64, 1000)) * 0.02).astype(np.float32)
    cal = qs.calibrate(x, qs.QuantSpec(method=method))
    amax = float(np.abs(x).max())
    assert 0 < float(cal.scale) * 127 <= amax * 1.0001
    report = qs.quantize_store(x, tmp_path / "q.zarr", qs.QuantSpec(method=method, axis=0))
    assert report.passes == 3 and report.error["sqnr_db"] > 5


def _percentile_oracle(hist, lo, hi, percentile, symmetric):
    """The per-channel NumPy form of the percentile search (as ORT / NVIDIA write it)."""
    counts = hist["counts"]
    nb = counts.shape[1]
    out_lo, out_hi = np.array(lo, np.float64), np.array(hi, np.float64)
    for c in range(counts.shape[0]):
        total = counts[c].sum()
        if total == 0:
            continue
        edges = np.linspace(hist["lo"][c], hist["hi"][c], nb + 1)
        cdf = np.cumsum(counts[c] / total)
        if symmetric:
            t = edges[np.searchsorted(cdf, percentile / 100.0)]
            out_lo[c], out_hi[c] = max(lo[c], -t), min(hi[c], t)
        else:
            cut = (100.0 - percentile) / 200.0
            out_lo[c] = max(lo[c], edges[np.searchsorted(cdf, cut)])
            out_hi[c] = min(hi[c], edges[np.searchsorted(cdf, 1.0 - cut)])
    return out_lo, out_hi


def test_parallel_percentile_kernel_matches_the_numpy_search_bit_for_bit():
    from qstream.calibration.histogram import percentile_range

    rng = np.random.default_rng(0)
    for _ in range(200):
        c = int(rng.integers(1, 40))
        nb = int(rng.choice([8, 64, 256, 2048]))
        counts = rng.integers(0, 5, (c, nb)) * (rng.random((c, nb)) < rng.random())
        counts[rng.random(c) < 0.1] = 0  # empty channels keep their observed range
        lo = -np.abs(rng.standard_normal(c)) * rng.choice([0, 1e-3, 1, 1e3])
        hi = np.abs(rng.standard_normal(c)) * rng.choice([0, 1e-3, 1, 1e3])
        sym = bool(rng.integers(0, 2))
        p = float(rng.choice([99.99, 99.9, 90.0, 100.0, 50.0, 0.1]))
        hist = {
            "counts": counts,
            "lo": np.zeros(c) if sym else lo,
            "hi": np.maximum(-lo, hi) if sym else hi,
            "abs": sym,
        }
        want = _percentile_oracle(hist, lo, hi, p, sym)
        got = percentile_range(hist, lo, hi, p, symmetric=sym)
        for w, g in zip(want, got, strict=True):
            assert w.tobytes() == g.tobytes()  # signed zeros included


def _search_oracle(hist, lo, hi, method, bits, symmetric):
    """The channel-by-channel form of the threshold searches (one kernel call per channel),
    with the direct O(nbins) per candidate searches the fast ones replace."""
    from qstream.kernels.search import entropy_search_reference as entropy_search
    from qstream.kernels.search import l2_search
    from qstream.kernels.search import mse_search_reference as mse_search

    counts = hist["counts"]
    nb = counts.shape[1]
    out_lo, out_hi = np.array(lo, np.float64), np.array(hi, np.float64)
    start = min(128, nb)
    for c in range(counts.shape[0]):
        top = float(hist["hi"][c])
        if counts[c].sum() == 0 or (method == "mse" and top == 0):
            continue
        if method == "l2":
            s, e = l2_search(counts[c], float(hist["lo"][c]), top, 2**bits)
            lo32, hi32 = np.float32(hist["lo"][c]), np.float32(top)
            width = (hi32 - lo32) / np.float32(nb)
            out_lo[c] = float(lo32 + width * np.float32(s))
            out_hi[c] = float(lo32 + width * np.float32(e + 1))
            continue
        if method == "entropy":
            t = entropy_search(counts[c], 2 ** (bits - 1), start, 1) * (top / nb)
        else:
            i = mse_search(counts[c], top, float(2 ** (bits - 1) - 1), start, 1)
            t = (i + 0.5) * (top / nb)
        if symmetric:
            out_lo[c], out_hi[c] = -t, t
        else:
            out_lo[c], out_hi[c] = max(lo[c], -t), min(hi[c], t)
    return out_lo, out_hi


@pytest.mark.parametrize("method", ["entropy", "mse", "l2"])
def test_parallel_channel_searches_match_the_channel_by_channel_search(method):
    from qstream.calibration.histogram import search_range

    rng = np.random.default_rng(5)
    for _ in range(12):
        c = int(rng.integers(1, 24))
        nb = int(rng.choice([256, 512, 2048]))
        counts = (rng.exponential(50, (c, nb)) * (rng.random((c, nb)) < 0.7)).astype(np.int64)
        counts[rng.random(c) < 0.15] = 0
        lo = -np.abs(rng.standard_normal(c)) * rng.choice([1e-3, 1, 1e3])
        hi = np.abs(rng.standard_normal(c)) * rng.choice([1e-3, 1, 1e3])
        sym = bool(rng.integers(0, 2))
        signed = method == "l2"
        hist = {
            "counts": counts,
            "lo": lo if signed else np.zeros(c),
            "hi": hi if signed else np.maximum(-lo, hi),
            "abs": not signed,
        }
        bits = int(rng.choice([4, 8]))
        want = _search_oracle(hist, lo, hi, method, bits, sym)
        got = search_range(hist, lo, hi, method, bits, symmetric=sym)
        for w, g in zip(want, got, strict=True):
            assert w.tobytes() == g.tobytes()
