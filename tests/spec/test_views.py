"""The calibration views' data (bounded histograms, per-channel summaries, the methods compared
on one histogram, what outputs keep), their SVG/HTML, and the matplotlib figures."""

import json
import struct
import sys
import xml.etree.ElementTree as ET

import numpy as np
import pytest
import zarr
from hypothesis import given
from hypothesis import strategies as st

import qstream as qs
from qstream.spec.views import (
    VIEW_BINS,
    CalibrationView,
    ChannelSummary,
    Histogram,
    ReportView,
    predict_error,
)

SVG = "{http://www.w3.org/2000/svg}"
METHODS = ("minmax", "percentile", "entropy", "mse", "l2")


@pytest.fixture(scope="module")
def acts():
    """Heavy-tailed activations (Student t, 4 degrees of freedom)."""
    return (np.random.default_rng(7).standard_t(4, (256, 256)) * 0.5).astype(np.float32)


@pytest.fixture(scope="module")
def weights():
    """Rows of different scales; row 3 has one outlier 40x its spread."""
    rng = np.random.default_rng(8)
    w = rng.standard_normal((48, 512)) * np.exp(rng.normal(0, 0.4, (48, 1)))
    w[3, 100] = 40 * w[3].std()
    return (w * 0.02).astype(np.float32)


class Stages:
    """A progress reporter that records the passes."""

    def __init__(self):
        self.names = []

    def stage(self, name, total, done=0):
        self.names.append(name)

    def __call__(self, done, total):
        pass


# --------------------------------------------------------------------------- data


def test_downsampled_histogram_keeps_exact_counts_and_equal_bins():
    rng = np.random.default_rng(0)
    counts = rng.integers(0, 1000, 2048)
    h = Histogram.from_counts(counts, 0.0, 8.0, abs=True)
    assert h.nbins == VIEW_BINS and h.abs and h.hi == 8.0
    np.testing.assert_array_equal(h.counts, counts.reshape(128, 16).sum(axis=1))
    # 2000 bins: groups of 16, the last one short: the top edge grows by the 8 empty bins
    h = Histogram.from_counts(counts[:2000], -1.0, 1.0)
    assert h.nbins == 125 and h.total == counts[:2000].sum()
    assert h.hi == pytest.approx(-1.0 + 2.0 * (125 * 16) / 2000)
    assert h.counts[-1] == counts[1984:2000].sum()
    np.testing.assert_allclose(np.diff(h.edges), (h.hi - h.lo) / 125)
    rows = h.regroup(26)
    assert rows.nbins <= 26 and rows.total == h.total
    assert Histogram.from_dict(json.loads(json.dumps(h.to_dict()))) == h


def test_prediction_is_exact_for_a_single_value_and_for_clipping():
    # every value at 0.3 with step 0.25: error 0.05^2 each, no clipping
    sx2, se2, clipped = predict_error(np.array([[0, 10, 0]]), 0.25, 0.35, 0.25, 0, -128, 127)
    # the bin [0.2833, 0.3167] spreads the values: mean squared error over the bin, exactly
    a, b = 0.25 + 0.1 / 3, 0.25 + 0.2 / 3
    expect = 10 * ((b - 0.25) ** 3 - (a - 0.25) ** 3) / 3 / (b - a)
    assert se2[0] == pytest.approx(expect) and clipped[0] == 0
    assert sx2[0] == pytest.approx(10 * (a * a + a * b + b * b) / 3)
    # a range clipped at 127 * 0.01 = 1.27: values in [2, 3] cost (x - 1.27)^2, all clipped
    sx2, se2, clipped = predict_error(np.array([[0, 4]]), 1.0, 3.0, 0.01, 0, -128, 127)
    assert se2[0] == pytest.approx(4 * ((3 - 1.27) ** 3 - (2 - 1.27) ** 3) / 3)
    assert clipped[0] == pytest.approx(4)


@pytest.mark.parametrize("dtype, symmetric", [("int8", True), ("uint8", False), ("int4", True)])
def test_compared_methods_match_calibrate_and_predict_the_measured_sqnr(acts, dtype, symmetric):
    spec = qs.QuantSpec(dtype=dtype, symmetric=symmetric, method="entropy")
    stages = Stages()
    cal = qs.compare_methods(acts, spec, progress=stages)
    assert stages.names == ["ranges", "histograms"]  # one histogram pass for all five
    view = cal.view
    assert tuple(p.method for p in view.predictions) == METHODS
    assert view.histogram.nbins == VIEW_BINS and view.histogram.total == acts.size
    assert view.histogram.abs is symmetric
    np.testing.assert_array_equal(cal.scale, qs.calibrate(acts, spec).scale)
    measured = {}
    for p in view.predictions:
        s = qs.QuantSpec(dtype=dtype, symmetric=symmetric, method=p.method)
        c = qs.calibrate(acts, s)
        assert (p.lo, p.hi) == (float(c.thresholds["min"][0]), float(c.thresholds["max"][0]))
        assert p.scale == float(c.scale) and p.zero_point == float(c.zero_point)
        r = qs.quantize_store(acts, f"memory://views-{dtype}-{p.method}", s, overwrite=True)
        measured[p.method] = r.error["sqnr_db"]
        assert p.sqnr_db == pytest.approx(r.error["sqnr_db"], abs=0.1), p.method
        assert p.clip_fraction == pytest.approx(r.error["clip_fraction"], abs=2e-5), p.method
    assert view.best == max(measured, key=measured.get)


def test_per_channel_comparison_finds_the_worst_channel(weights):
    spec = qs.QuantSpec(axis=0, method="percentile", percentile=99.0)
    cal = qs.compare_methods(weights, spec, ["minmax", "mse"], max_memory=1 << 20)
    np.testing.assert_array_equal(cal.scale, qs.calibrate(weights, spec).scale)
    view = cal.view
    assert view.histogram is None and view.channels == 48
    assert view.clip_ratio["lowest"][0]["channel"] == 3  # the outlier row keeps the least
    for p in view.predictions:
        s = qs.QuantSpec(axis=0, method=p.method, percentile=99.0)
        r = qs.quantize_store(weights, f"memory://views-ch-{p.method}", s, overwrite=True)
        ch = ChannelSummary.from_dict(r.error["channels"])
        assert p.channels.channels == ch.channels == 48
        assert p.sqnr_db == pytest.approx(r.error["sqnr_db"], abs=0.1)
        assert p.channels.quantiles["median"] == pytest.approx(ch.quantiles["median"], abs=0.1)
        assert p.channels.worst[0]["channel"] == ch.worst[0]["channel"]
    assert view.prediction("minmax").channels.worst[0]["channel"] == 3  # its range is 40x wider


def test_compare_refuses_what_it_cannot_predict(acts):
    for spec in (
        qs.QuantSpec(axis=1, block_size=32, method="dynamic"),
        qs.QuantSpec(dtype="float8_e4m3fn"),
        qs.QuantSpec(scale=0.1),
    ):
        with pytest.raises(qs.InvalidParameterError, match="compared"):
            qs.compare_methods(acts, spec)
    with pytest.raises(qs.InvalidParameterError, match="unknown method 'kl'"):
        qs.compare_methods(acts, qs.QuantSpec(), ["kl"])


# --------------------------------------------------------------------------- metadata


def _meta(path):
    return zarr.open_group(str(path), mode="r").attrs["qstream"]


def test_outputs_keep_the_histogram_per_tensor_and_only_summaries_per_channel(tmp_path, acts):
    spec = qs.QuantSpec(method="percentile")
    report = qs.quantize_store(acts, tmp_path / "t.zarr", spec)
    meta = _meta(tmp_path / "t.zarr")
    view = CalibrationView.from_dict(meta["calibration"]["view"])
    assert view.histogram.nbins == VIEW_BINS and view.histogram.total == acts.size
    assert view.clip == (
        float(meta["calibration"]["thresholds"]["min"][0]),
        float(meta["calibration"]["thresholds"]["max"][0]),
    )
    assert float(np.abs(acts).max()) == pytest.approx(view.histogram.hi)
    assert ReportView.from_report(report).calibration == view  # the report carries it too
    assert qs.open_quantized(tmp_path / "t.zarr").view.calibration == view
    # per channel: 4096 channels, summaries of bounded size
    wide = np.random.default_rng(1).standard_normal((4096, 16)).astype(np.float32)
    qs.quantize_store(wide, tmp_path / "c.zarr", qs.QuantSpec(axis=0, method="percentile"))
    meta = _meta(tmp_path / "c.zarr")
    assert meta["calibration"]["view"]["histogram"] is None
    text = json.dumps({"calibration": meta["calibration"], "error": meta["error"]})
    assert len(text) < 12_000  # no per-channel arrays (4096 channels)
    ch = ChannelSummary.from_dict(meta["error"]["channels"])
    assert ch.channels == 4096 and ch.histogram.total == 4096
    # the worst channel, measured independently from the stored values
    y = qs.open_quantized(tmp_path / "c.zarr")[...]
    sqnr = 10 * np.log10((wide.astype(np.float64) ** 2).sum(1) / ((wide - y) ** 2).sum(1))
    assert ch.worst[0]["channel"] == int(np.argmin(sqnr))
    assert ch.quantiles["median"] == pytest.approx(np.median(sqnr), abs=1e-6)


def test_a_minmax_histogram_is_one_opt_in_pass(tmp_path, acts):
    plain = qs.quantize_store(acts, tmp_path / "a.zarr")
    assert plain.passes == 2 and plain.calibration["view"]["histogram"] is None
    kept = qs.quantize_store(acts, tmp_path / "b.zarr", histogram=True)
    assert kept.passes == 3
    h = Histogram.from_dict(kept.calibration["view"]["histogram"])
    assert h.abs and h.total == acts.size and h.hi == float(np.abs(acts).max())
    ref, _ = np.histogram(np.abs(acts), bins=2048, range=(0, h.hi))
    np.testing.assert_array_equal(h.counts, ref.reshape(128, 16).sum(axis=1))
    np.testing.assert_array_equal(
        qs.open_quantized(tmp_path / "a.zarr").quantized(...),
        qs.open_quantized(tmp_path / "b.zarr").quantized(...),
    )


def test_views_round_trip_through_json(acts):
    cal = qs.compare_methods(acts, qs.QuantSpec(method="mse"))
    again = qs.Calibration.from_dict(json.loads(json.dumps(cal.to_dict())))
    assert again.view == cal.view
    report = qs.quantize_store(acts, "memory://views-rt", qs.QuantSpec(axis=1), overwrite=True)
    back = qs.QuantReport.from_dict(json.loads(json.dumps(report.to_dict())))
    assert ReportView.from_report(back).channels == ReportView.from_report(report).channels


# --------------------------------------------------------------------------- SVG / HTML


def _html_tree(html: str):
    return ET.fromstring(f"<root>{html}</root>")


def test_notebook_html_parses_with_every_bin_and_threshold(tmp_path, acts):
    report = qs.quantize_store(acts, tmp_path / "e.zarr", qs.QuantSpec(method="entropy"))
    for html in (report._repr_html_(), qs.open_quantized(tmp_path / "e.zarr")._repr_html_()):
        svgs = list(_html_tree(html).iter(SVG + "svg"))
        assert len(svgs) == 1
        bars = [r for r in svgs[0].iter(SVG + "rect") if "bar" in r.get("class", "").split()]
        assert len(bars) == VIEW_BINS
        lines = [ln for ln in svgs[0].iter(SVG + "line") if ln.get("class") == "threshold"]
        assert [ln.get("data-method") for ln in lines] == ["entropy"]
        hi = report.calibration["thresholds"]["max"]
        hi = hi[0] if isinstance(hi, list) else hi["max"]
        assert float(lines[0].get("data-x")) == pytest.approx(hi)
        clipped = [b for b in bars if "clipped" in b.get("class")]
        assert clipped and all(
            float(b.get("x")) > float(lines[0].get("x1")) - 0.01 for b in clipped
        )
    cal = qs.compare_methods(acts, qs.QuantSpec(method="entropy", symmetric=False))
    tree = _html_tree(cal._repr_html_())
    (svg,) = tree.iter(SVG + "svg")
    methods = [ln.get("data-method") for ln in svg.iter(SVG + "line") if ln.get("data-method")]
    assert sorted(set(methods)) == sorted(METHODS)
    assert len(methods) == 10  # a signed histogram: lo and hi of each
    text = "".join(tree.itertext())
    assert "predicted SQNR dB" in text and cal.view.best in text


def test_per_channel_html_shows_the_sqnr_distribution_and_worst_channels(weights):
    report = qs.quantize_store(weights, "memory://views-pc", qs.QuantSpec(axis=0), overwrite=True)
    tree = _html_tree(report._repr_html_())
    (svg,) = tree.iter(SVG + "svg")
    bars = [r for r in svg.iter(SVG + "rect") if r.get("class") == "bar"]
    assert len(bars) == 24
    rows = [[td.text for td in tr] for tr in tree.iter("tr")]
    worst = [r for r in rows if r and r[0] == "3"]
    assert worst, rows  # the outlier row is listed among the worst


# --------------------------------------------------------------------------- matplotlib


def _png_size(path):
    raw = path.read_bytes()
    assert raw[:8] == b"\x89PNG\r\n\x1a\n" and raw[12:16] == b"IHDR"
    return struct.unpack(">II", raw[16:24])


def test_plot_draws_the_thresholds_and_returns_the_figure(acts):
    pytest.importorskip("matplotlib")
    import matplotlib
    from matplotlib.figure import Figure

    matplotlib.use("Agg")
    cal = qs.compare_methods(acts, qs.QuantSpec(method="entropy"))
    fig = cal.plot()
    assert isinstance(fig, Figure)
    (ax,) = fig.axes
    xs = sorted(ln.get_xdata()[0] for ln in ax.get_lines())
    assert xs == pytest.approx(sorted(x for _, x in cal.view.markers()))
    assert len(ax.patches) == VIEW_BINS
    report = qs.quantize_store(acts, "memory://views-plot", qs.QuantSpec(axis=1), overwrite=True)
    fig = matplotlib.figure.Figure()
    ax = fig.add_subplot()
    assert report.plot(ax=ax) is fig  # (drawn on the axes given)
    assert ax.get_xlabel() == "SQNR dB" and len(ax.patches) == 24
    assert ax.get_yscale() == "log"  # (per-channel SQNR: log counts, the worst channels show)


def test_a_plot_saved_as_it_is_keeps_its_labels_inside_and_its_markers_off_the_border(acts):
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    report = qs.quantize_store(acts, "memory://views-inside", qs.QuantSpec(axis=1), overwrite=True)
    fig = report.plot()  # (a figure of its own, saved with a plain savefig)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    page = fig.bbox
    (ax,) = fig.axes
    for label in (ax.xaxis.label, ax.yaxis.label, ax.title):
        box = label.get_window_extent(renderer)
        assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1
    lo, hi = ax.get_xlim()
    xs = [ln.get_xdata()[0] for ln in ax.get_lines()]  # median and worst channel
    assert len(xs) == 2 and all(lo < x < hi for x in xs)
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_figure_files_are_valid_images_of_the_page_size(tmp_path, acts):
    pytest.importorskip("matplotlib")
    from qstream.viz.mpl import save_figure

    report = qs.quantize_store(acts, tmp_path / "f.zarr", qs.QuantSpec(method="mse"))
    view = ReportView.from_report(report)
    save_figure(view, tmp_path / "r.png")
    assert _png_size(tmp_path / "r.png") == (1000, 700)
    save_figure(view, tmp_path / "r.svg")
    root = ET.parse(tmp_path / "r.svg").getroot()
    assert root.tag == SVG + "svg"
    assert (root.get("width"), root.get("height")) == ("720pt", "504pt")
    with pytest.raises(ValueError, match=r"\.png or \.svg"):
        save_figure(view, tmp_path / "r.pdf")


def test_plotting_without_matplotlib_says_what_to_install(monkeypatch, acts):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    cal = qs.calibrate(acts, qs.QuantSpec(method="percentile"))
    with pytest.raises(ImportError, match=r"pip install 'qstream-zarr\[plot\]'"):
        cal.plot()
    assert "<svg" in cal._repr_html_()  # the notebook view needs nothing


@given(
    st.lists(
        st.one_of(
            st.floats(-1e6, 1e6),
            st.sampled_from([0.0, -0.0, 1.5, np.nan, np.inf, -np.inf, 1e300, -1e-300]),
        ),
        min_size=1,
        max_size=300,
    )
)
def test_quantiles_are_numpys_linear_percentiles_of_the_finite_values(values):
    from qstream.spec.views.histograms import QUANTILES, quantiles

    v = np.asarray(values, np.float64)
    finite = v[np.isfinite(v)]
    got = quantiles(v)
    if not finite.size:
        assert got is None
        return
    want = np.percentile(finite, [p for _, p in QUANTILES])
    have = np.array(list(got.values()))
    # the same bits, but a zero is always +0.0 (NumPy's sign of a zero follows its partition)
    assert (have == want).all() and not np.signbit(have[have == 0]).any()
    nonzero = want != 0
    assert have[nonzero].tobytes() == want[nonzero].tobytes()
