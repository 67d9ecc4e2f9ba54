"""The fast threshold searches choose the same bins as the direct ones they replace.

``entropy_search_reference``, ``mse_search_reference`` and ``l2_search_reference`` are the
searches as they used to be (every bin for every candidate). Every case here asserts that the
chosen index is the same (entropy: both evaluation paths, and with the near-tie bounds
widened so that the direct loop decides many candidates; mse: the same widened), then the
per-channel parallel path against the channel-by-channel references, and the progress
callback.
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from qstream.calibration import histogram as H
from qstream.kernels import search as S

KINDS = [
    "normal",
    "laplace",
    "t2",
    "cauchy",
    "sparse",
    "zeros_and_one_value",
    "single_bin",
    "all_in_last_bin",
    "only_bin_0",
    "empty",
    "random_counts",
    "uniform",
    "periodic",
    "two_spikes",
    "large_counts",
    "few_samples",
]


def make_hist(kind: str, nb: int, seed: int) -> np.ndarray:
    """An |x| histogram over [0, max|x|] (or hand-made counts) of ``nb`` bins."""
    rng = np.random.default_rng(seed)
    size = int(rng.choice([50, 1000, 4096, 100_000]))

    def of(x):
        x = np.abs(np.asarray(x, np.float64))
        top = float(x.max()) if x.size and x.max() > 0 else 1.0
        return np.histogram(x, bins=nb, range=(0.0, top))[0].astype(np.int64)

    h = np.zeros(nb, np.int64)
    if kind == "normal":
        return of(rng.standard_normal(size))
    if kind == "laplace":
        return of(rng.laplace(size=size))
    if kind == "t2":
        return of(rng.standard_t(2, size))
    if kind == "cauchy":
        return of(rng.standard_cauchy(size))
    if kind == "sparse":  # mostly exact zeros: a spike in bin 0
        return of(rng.standard_normal(size) * (rng.random(size) < rng.choice([0.01, 0.2])))
    if kind == "zeros_and_one_value":
        return of(np.where(rng.random(size) < 0.5, 0.0, 3.0))
    if kind == "single_bin":
        h[rng.integers(0, nb)] = rng.integers(1, 10**6)
        return h
    if kind == "all_in_last_bin":
        h[-1] = rng.integers(1, 10**6)
        return h
    if kind == "only_bin_0":
        h[0] = rng.integers(1, 1000)
        return h
    if kind == "empty":
        return h
    if kind == "random_counts":
        return rng.integers(0, 6, nb) * (rng.random(nb) < rng.random())
    if kind == "uniform":
        h[:] = rng.integers(1, 4)
        return h
    if kind == "periodic":
        period = int(rng.integers(2, 9))
        h[::period] = rng.integers(1, 50)
        return h
    if kind == "two_spikes":
        h[rng.integers(0, nb, 2)] = rng.integers(1, 1000, 2)
        return h
    if kind == "large_counts":  # beyond the log table and float32's integers
        return (of(rng.standard_t(4, 100_000)) * 10_007 + rng.integers(0, 2, nb)) * 977
    return of(rng.standard_normal(int(rng.integers(1, 12))))  # few_samples


def _entropy_all_paths(h, nlevels, start, stride):
    n = h.shape[0]
    logt = S.log_table(S.LOG_TABLE_SIZE)
    idx, off = S.entropy_groups(nlevels, n)
    out = set()
    for windows in (True, False):
        for slack in (1.0, 1e6):
            scratch = S.entropy_scratch(n, start, stride)
            out.add(
                S.entropy_search_fast(
                    h, nlevels, start, stride, logt, idx, off, windows, scratch, slack
                )
            )
    return out


@given(
    kind=st.sampled_from(KINDS),
    nb=st.sampled_from([1, 2, 100, 128, 256, 300, 2048, 2049]),
    nlevels=st.sampled_from([128, 8, 1, 2, 64, 256]),
    seed=st.integers(0, 2**32 - 1),
    start=st.one_of(st.just(128), st.integers(1, 2100)),
    stride=st.sampled_from([1, 1, 1, 2, 7]),
)
def test_entropy_search_matches_the_direct_search(kind, nb, nlevels, seed, start, stride):
    h = make_hist(kind, nb, seed)
    start = min(start, nb + 1)
    want = S.entropy_search_reference(h, nlevels, start, stride)
    assert _entropy_all_paths(h, nlevels, start, stride) == {want}
    assert S.entropy_search(h, nlevels, start, stride) == want


@pytest.mark.parametrize("nb", [4096])
@pytest.mark.parametrize("kind", ["normal", "t2", "sparse", "random_counts"])
def test_entropy_search_matches_the_direct_search_4096_bins(kind, nb):
    for nlevels in (128, 8):
        h = make_hist(kind, nb, 11)
        want = S.entropy_search_reference(h, nlevels, 128, 1)
        assert _entropy_all_paths(h, nlevels, 128, 1) == {want}


def test_entropy_exact_ties_are_decided_as_the_direct_search_does():
    # one non-empty bin: every candidate past it has divergence 0 (the last one wins)
    h = np.zeros(256, np.int64)
    h[5] = 7
    assert S.entropy_search(h, 128, 128, 1) == S.entropy_search_reference(h, 128, 128, 1) == 256
    h = np.ones(512, np.int64)  # flat: many candidates within rounding of each other
    assert S.entropy_search(h, 128, 128, 1) == S.entropy_search_reference(h, 128, 128, 1)


def test_entropy_search_of_non_count_histograms_takes_the_direct_search():
    rng = np.random.default_rng(1)
    h = rng.random(300) * 10  # weights, not counts
    assert S.entropy_search(h, 128, 128, 1) == S.entropy_search_reference(h, 128, 128, 1)
    hf = make_hist("normal", 300, 2).astype(np.float64)  # integer-valued floats: fast path
    assert S.entropy_search(hf, 8, 128, 1) == S.entropy_search_reference(hf, 8, 128, 1)


@given(
    kind=st.sampled_from(KINDS),
    nb=st.sampled_from([1, 2, 100, 128, 256, 300, 2048, 2049]),
    seed=st.integers(0, 2**32 - 1),
    hi=st.one_of(
        st.sampled_from([1.0, 0.02, 3.7, 1e-25, 1e-19, 1e17, 1e20, 0.0]),
        st.floats(1e-6, 1e6),
    ),
    max_bound=st.sampled_from([127.0, 7.0, 1.0, 32767.0, 0.5, 0.0]),
    start=st.one_of(st.just(128), st.integers(0, 2100)),
    stride=st.sampled_from([1, 1, 1, 3]),
)
def test_mse_search_matches_the_direct_search(kind, nb, seed, hi, max_bound, start, stride):
    h = make_hist(kind, nb, seed)
    start = min(start, nb + 1)
    want = _outcome(S.mse_search_reference, h, hi, max_bound, start, stride)
    assert _outcome(S.mse_search, h, hi, max_bound, start, stride) == want
    scratch = S.mse_scratch(nb)
    assert _outcome(S.mse_search_fast, h, hi, max_bound, start, stride, scratch, 1e9) == want


def _outcome(f, *args):
    """The result, or the exception type (the direct search divides by zero when hi == 0)."""
    try:
        return f(*args)
    except ZeroDivisionError as e:
        return type(e)


@pytest.mark.parametrize("kind", ["normal", "t2", "sparse", "random_counts"])
def test_mse_search_matches_the_direct_search_4096_bins(kind):
    h = make_hist(kind, 4096, 12)
    for mb in (127.0, 7.0):
        want = S.mse_search_reference(h, 2.5, mb, 128, 1)
        assert S.mse_search(h, 2.5, mb, 128, 1) == want
        assert S.mse_search_fast(h, 2.5, mb, 128, 1, S.mse_scratch(4096), 1e9) == want


@given(
    kind=st.sampled_from(KINDS),
    nb=st.sampled_from([1, 2, 100, 256, 2048, 2049]),
    seed=st.integers(0, 2**32 - 1),
    lo=st.sampled_from([-1.0, -0.02, 0.0, -3e30, 5.0, -1e200]),
    width=st.sampled_from([2.0, 0.04, 1e-9, 7e30, 0.0, 1e200]),
    dst=st.sampled_from([256, 16, 4, 2]),
)
def test_l2_search_matches_the_direct_search(kind, nb, seed, lo, width, dst):
    h = make_hist(kind, nb, seed)
    if kind == "normal":  # signed data: a histogram over [min, max] with the mass inside
        h = h[::-1].copy() + h
    want = S.l2_search_reference(h, lo, lo + width, dst)
    assert S.l2_search(h, lo, lo + width, dst) == want
    assert S.l2_search(h.astype(np.float64), lo, lo + width, dst) == want


def _channels(c: int, width: int, seed: int) -> np.ndarray:
    """Rows of weight-like data of several kinds, with empty-ish and degenerate rows."""
    rng = np.random.default_rng(seed)
    x = np.empty((c, width), np.float32)
    for r in range(c):
        kind = r % 8
        if kind == 0:
            v = rng.standard_normal(width) * 0.02
        elif kind == 1:
            v = rng.laplace(size=width)
        elif kind == 2:
            v = rng.standard_t(3, width)
        elif kind == 3:
            v = rng.standard_normal(width) * (rng.random(width) < 0.05)
        elif kind == 4:
            v = np.full(width, 0.5)  # constant
        elif kind == 5:
            v = np.zeros(width)
        elif kind == 6:
            v = rng.standard_cauchy(width)
        else:
            v = rng.integers(-3, 4, width).astype(np.float64)
        x[r] = v
    return x


def _hists(x: np.ndarray, nb: int, signed: bool) -> dict:
    from qstream.kernels.stats import channel_histograms

    c = x.shape[0]
    lo = x.min(1).astype(np.float64)
    hi = x.max(1).astype(np.float64)
    if signed:
        elo, ehi = lo, hi
    else:
        elo, ehi = np.zeros(c), np.maximum(-lo, hi)
    counts = np.zeros((c, nb), np.int64)
    channel_histograms(x[None], elo, ehi, not signed, counts)
    counts[c // 3] = 0  # an empty channel keeps its observed range
    return {"counts": counts, "lo": elo, "hi": ehi, "abs": not signed}, lo, hi


def _reference_ranges(hist, lo, hi, method, bits, symmetric):
    """The channel-by-channel form with the direct searches (the results before this work)."""
    counts = hist["counts"]
    nb = counts.shape[1]
    out_lo, out_hi = np.array(lo, np.float64), np.array(hi, np.float64)
    start = min(128, nb)
    for c in range(counts.shape[0]):
        top = float(hist["hi"][c])
        if counts[c].sum() == 0 or (method == "mse" and top == 0):
            continue  # (mse_search divides by zero on an all-zero channel)
        if method == "l2":
            s, e = S.l2_search_reference(counts[c], float(hist["lo"][c]), top, 2**bits)
            lo32, hi32 = np.float32(hist["lo"][c]), np.float32(top)
            width = (hi32 - lo32) / np.float32(nb)
            out_lo[c] = float(lo32 + width * np.float32(s))
            out_hi[c] = float(lo32 + width * np.float32(e + 1))
            continue
        if method == "entropy":
            t = S.entropy_search_reference(counts[c], 2 ** (bits - 1), start, 1) * (top / nb)
        else:
            i = S.mse_search_reference(counts[c], top, float(2 ** (bits - 1) - 1), start, 1)
            t = (i + 0.5) * (top / nb)
        if symmetric:
            out_lo[c], out_hi[c] = -t, t
        else:
            out_lo[c], out_hi[c] = max(lo[c], -t), min(hi[c], t)
    return out_lo, out_hi


@pytest.mark.parametrize("method", ["entropy", "mse", "l2"])
@pytest.mark.parametrize("nb", [256, 2048])
def test_per_channel_searches_match_the_channel_by_channel_references(method, nb, monkeypatch):
    x = _channels(40, 3000, seed=nb)
    hist, lo, hi = _hists(x, nb, signed=method == "l2")
    monkeypatch.setattr(H, "PROGRESS_SECONDS", 1e-4)  # many groups
    monkeypatch.setattr(H, "_FIRST_GROUP", 2)
    for bits in (8, 4):
        for sym in (True, False):
            want = _reference_ranges(hist, lo, hi, method, bits, sym)
            calls = []
            got = H.search_range(
                hist,
                lo,
                hi,
                method,
                bits,
                symmetric=sym,
                progress=lambda d, t, calls=calls: calls.append(d),
            )
            plain = H.search_range(hist, lo, hi, method, bits, symmetric=sym)
            for w, g, p in zip(want, got, plain, strict=True):
                assert w.tobytes() == g.tobytes() == p.tobytes()
            assert calls[-1] == 40 and calls == sorted(calls) and len(calls) > 1


@pytest.mark.parametrize("method", ["entropy", "mse", "l2", "percentile"])
def test_progress_reports_channel_groups(method, monkeypatch):
    from qstream.spec import QuantSpec

    x = _channels(300, 500, seed=3)
    hist, lo, hi = _hists(x, 512, signed=method == "l2")
    spec = QuantSpec(method=method)
    want = H.method_range(hist, lo, hi, spec, 8)
    for seconds in (1e-5, 10.0):
        monkeypatch.setattr(H, "PROGRESS_SECONDS", seconds)
        calls = []
        got = H.method_range(
            hist, lo, hi, spec, 8, progress=lambda d, t, calls=calls: calls.append((d, t))
        )
        for w, g in zip(want, got, strict=True):
            assert w.tobytes() == g.tobytes()
        done = [d for d, _ in calls]
        assert {t for _, t in calls} == {300} and done[-1] == 300 and done == sorted(done)
        assert len(set(done)) == len(done)
        if seconds < 1:
            assert len(calls) > 2


def test_mse_on_an_all_zero_channel_keeps_its_observed_range():
    import qstream as qs

    x = np.random.default_rng(0).standard_normal((4, 100)).astype(np.float32)
    x[1] = 0  # its |x| histogram has hi == 0: mse_search would divide by zero
    mse = qs.calibrate(x, qs.QuantSpec(method="mse", axis=0))
    ent = qs.calibrate(x, qs.QuantSpec(method="entropy", axis=0))
    assert mse.scale[1] == ent.scale[1] == 1.0
