"""Pictures of group-wise outputs and whole checkpoints: the per-group SQNR distribution a
blocked job keeps (exact counts, the same for any cut of the blocks, resumed runs included),
its views (SVG/HTML, matplotlib), and the bounded view of a converted checkpoint."""

import json
import time
import xml.etree.ElementTree as ET

import numpy as np
import pytest
import zarr

import qstream as qs
from qstream.spec import ErrorStats, GroupSQNR, QuantSpec, WorstGroups
from qstream.spec.views import CheckpointView, GroupSummary, ReportView

SVG = "{http://www.w3.org/2000/svg}"


def _tree(html: str):
    return ET.fromstring(f"<root>{html}</root>")


def _svgs(html: str) -> list:
    return list(_tree(html).iter(SVG + "svg"))


def _bars(svg) -> list:
    return [r for r in svg.iter(SVG + "rect") if "bar" in r.get("class", "").split()]


def _source(tmp_path, shape=(96, 512), chunks=(32, 512)):
    rng = np.random.default_rng(21)
    x = (rng.standard_normal(shape) * np.exp(rng.normal(0, 1, (shape[0], 1)))).astype(np.float32)
    x[3, 17] = np.nan
    x[60, 64:96] = 0.0  # a group of zeros: no signal
    x[61, 96:128] = np.nan  # a group with no finite value: no signal
    x[62, 0:32] = np.arange(-7, 25) % 15 - 7  # integers -7..7 with absmax 7: scale 1, exact
    x[63, 32:64] = 0.5  # half a step each (scale 1 in int4): all round to 0, a low SQNR
    x[63, 40] = 7.0
    path = tmp_path / "src.zarr"
    zarr.create_array(str(path), shape=shape, chunks=chunks, dtype="float32")[...] = x
    return path, x


def _oracle(x, restored, axis, bs):
    """Per group: signal and error sums over its finite values (NumPy, float64)."""
    finite = np.isfinite(x)
    xf = np.where(finite, x, 0).astype(np.float64)
    e = xf - np.where(finite, restored, 0).astype(np.float64)
    n = x.shape[axis]
    pad = -(-n // bs) * bs - n
    sums = []
    for a in (xf * xf, e * e):
        m = np.moveaxis(a, axis, -1)
        m = np.pad(m, [(0, 0)] * (x.ndim - 1) + [(0, pad)]).reshape(*m.shape[:-1], -1, bs)
        sums.append(m.sum(-1).reshape(-1))
    return sums


# --------------------------------------------------------------------------- the counts


def test_group_counts_place_each_group_by_its_own_sqnr():
    x2 = np.array([100.0, 0, 0, 5, 1e20, 1, 1e-5, 10.0**0.5, 2.0])
    e2 = np.array([1.0, 1, 0, 0, 1, 1e-30, 1, 1.0, 2.0])
    g = GroupSQNR.of_sums(x2, e2)
    s = g.summary()
    assert s["groups"] == 9 == g.groups
    assert (s["zero_signal"], s["exact"], s["below"], s["above"]) == (2, 1, 1, 2)
    # 20 dB, 5 dB and 0 dB: each in the bin its edge starts
    edges = np.asarray(s["edges_db"])
    at = {float(edges[i]): c for i, c in enumerate(s["counts"]) if c}
    assert at == {0.0: 1, 5.0: 1, 20.0: 1}
    assert len(edges) == len(s["counts"]) + 1 and np.allclose(np.diff(edges), 0.25)
    assert GroupSQNR.from_summary(json.loads(json.dumps(s))) == g
    empty = GroupSQNR.empty().summary()
    assert empty["groups"] == 0 and empty["edges_db"] == [] and empty["counts"] == []


def test_group_counts_merge_exactly_over_any_partition():
    rng = np.random.default_rng(3)
    x2 = rng.lognormal(3, 2, 5000)
    e2 = rng.lognormal(0, 2, 5000)
    e2[rng.integers(0, 5000, 50)] = 0
    x2[rng.integers(0, 5000, 50)] = 0
    whole = GroupSQNR.of_sums(x2, e2)
    for _ in range(5):
        cuts = np.sort(rng.integers(0, 5000, 7))
        pieces = zip(np.split(x2, cuts), np.split(e2, cuts), strict=True)
        parts = [GroupSQNR.of_sums(a, b) for a, b in pieces]
        rng.shuffle(parts)
        total = GroupSQNR.empty()
        for p in parts:
            total = total.merged(p)
        assert total == whole
    # the worst groups carry them: merged together, None never merges into a partial count
    w = WorstGroups.of([1.0], [3], [0.5], whole).merged(WorstGroups.empty())
    assert w.groups == whole
    assert WorstGroups.of([1.0], [3], [0.5], whole).merged(WorstGroups.empty(False)).groups is None


@pytest.mark.parametrize(
    "dtype, axis, bs, method, chunks",
    [
        ("int4", 1, 32, "dynamic", (32, 512)),
        ("uint4", 1, 128, "dynamic", (96, 200)),  # chunks cut through groups
        ("int8", 0, 16, "dynamic", (24, 512)),
        ("int4", 1, 64, "minmax", (20, 512)),
        ("uint8", 0, 16, "minmax", (32, 100)),
    ],
)
def test_group_distribution_is_the_oracle_s_and_the_same_for_any_block_cut(
    tmp_path, dtype, axis, bs, method, chunks
):
    src, x = _source(tmp_path, chunks=chunks)
    spec = QuantSpec(
        dtype=dtype, axis=axis, block_size=bs, method=method, nan_policy="zero_point",
        symmetric=dtype.startswith("int"),
    )  # fmt: skip
    reports = [
        qs.quantize_store(str(src), tmp_path / f"q{m}.zarr", spec, max_memory=m)
        for m in (1 << 20, 3 << 20, 64 << 20)
    ]
    reports.append(  # in memory, a whole array at once (other pieces again)
        qs.quantize_store(x, "memory://group-views-cut", spec, overwrite=True)
    )
    got = [r.error["groups"] for r in reports]
    assert all(g == got[0] for g in got), "the distribution depends on the block cut"
    assert all(r.error["worst_groups"] == reports[0].error["worst_groups"] for r in reports)
    n_groups = x.size // x.shape[axis] * -(-x.shape[axis] // bs)
    g = got[0]
    assert g["groups"] == n_groups
    assert sum(g["counts"]) + g["below"] + g["above"] + g["exact"] + g["zero_signal"] == n_groups
    restored = np.asarray(qs.open_quantized(tmp_path / "q1048576.zarr")[...])
    x2, e2 = _oracle(x, restored, axis, bs)
    assert g["zero_signal"] == np.count_nonzero(x2 == 0)
    assert g["exact"] == np.count_nonzero((e2 == 0) & (x2 > 0))
    want = GroupSQNR.of_sums(x2, e2).summary()  # the oracle's sums, binned the same way
    lossy = (x2 > 0) & (e2 > 0)
    sq = 10 * np.log10(x2[lossy] / e2[lossy])
    at = (sq - GroupSQNR.LO_DB) / GroupSQNR.STEP_DB  # (bins of the oracle's sums, summed in
    if not (np.abs(at - np.round(at)) < 1e-6).any():  # another order: none near an edge)
        assert g == want
    assert min(e for e, c in zip(g["edges_db"], g["counts"], strict=False) if c) <= sq.min()
    stored = qs.open_quantized(tmp_path / "q1048576.zarr").summary()["error"]["groups"]
    assert stored == g


def test_a_resumed_run_keeps_the_same_distribution(tmp_path, monkeypatch):
    from qstream.engine.blocks import work
    from qstream.io.outputs import progress_log as progress

    src, _ = _source(tmp_path, chunks=(8, 512))
    spec = QuantSpec(dtype="int4", axis=1, block_size=32, method="dynamic", nan_policy="min")
    kw = {"chunks": (8, 512), "max_memory": 1 << 20}  # 12 blocks
    full = qs.quantize_store(str(src), tmp_path / "a.zarr", spec, **kw)
    calls = [0]
    real = work.QuantizeWork.__call__

    def flaky(self, b):
        calls[0] += 1
        if calls[0] == 5:
            raise OSError("disk full")
        return real(self, b)

    monkeypatch.setattr(work.QuantizeWork, "__call__", flaky)
    monkeypatch.setattr(progress, "SAVE_EVERY", 0.0)
    with pytest.raises(qs.StoreError):
        qs.quantize_store(str(src), tmp_path / "b.zarr", spec, **kw)
    log = progress.ProgressLog.open(zarr.open_group(str(tmp_path / "b.zarr"), mode="r"))
    done, _, worst = log.load()
    assert done > 0 and log.bins == GroupSQNR.SLOTS
    assert 0 < worst.groups.groups < full.error["groups"]["groups"]  # the landed blocks'
    monkeypatch.setattr(work.QuantizeWork, "__call__", real)
    again = qs.quantize_store(str(src), tmp_path / "b.zarr", spec, **kw)
    assert again.resumed_blocks > 0
    assert again.error == full.error


def test_a_resume_snapshot_of_an_older_run_gives_no_partial_distribution(tmp_path):
    """A _progress array without the counts (written before they were kept) resumes, and the
    report then has no distribution rather than one of only the resumed blocks."""
    from qstream.io.outputs.progress_log import ProgressLog

    group = zarr.open_group(str(tmp_path / "g.zarr"), mode="w")
    log = ProgressLog(group.create_array(ProgressLog.NAME, **ProgressLog.array_spec(2, 5)))
    assert log.load()[2].groups is None  # no snapshot yet: fresh, but without counts
    log.save(3, ErrorStats.empty(2), WorstGroups.of([2.0], [7], [0.1], GroupSQNR.empty()))
    done, _, worst = ProgressLog.open(group).load()
    assert done == 3 and worst.index.tolist() == [7] and worst.groups is None
    assert worst.merged(WorstGroups.empty()).groups is None
    # a new snapshot keeps them
    spec = ProgressLog.array_spec(2, 5, GroupSQNR.SLOTS)
    assert spec["attributes"] == {"channels": 2, "worst_groups": 5, "group_bins": GroupSQNR.SLOTS}
    new = ProgressLog(group.create_array("p2", **spec))
    counts = GroupSQNR.of_sums(np.array([1.0, 2, 0]), np.array([0.01, 0, 0]))
    new.save(1, ErrorStats.empty(2), WorstGroups.of([20.0], [0], [0.1], counts))
    assert ProgressLog(group["p2"]).load()[2].groups == counts


def test_checkpoint_tensors_converted_whole_keep_the_distribution(tmp_path):
    """Tensors converted in one block (engine/small.py) report what a store job reports."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(5)
    tensors = {
        "a.weight": rng.standard_normal((48, 256)).astype(np.float32),
        "b.weight": rng.standard_normal((40, 96)).astype(np.float32),
    }
    save_file(tensors, str(tmp_path / "m.safetensors"))
    spec = {"dtype": "int4", "axis": 1, "block_size": 32, "method": "dynamic"}
    recipe = qs.Recipe.from_dict({"defaults": spec})
    qs.convert_checkpoint(str(tmp_path / "m.safetensors"), str(tmp_path / "m.zarr"), recipe)
    ck = qs.open_quantized(tmp_path / "m.zarr")
    for name, x in tensors.items():
        want = qs.quantize_store(x, "memory://group-views-ck", QuantSpec(**spec), overwrite=True)
        got = ck[name].meta["error"]
        assert got["groups"] == want.error["groups"] and got["groups"]["groups"] == x.size // 32
        assert got["worst_groups"] == want.error["worst_groups"]


def test_the_extra_cost_is_per_group_and_small():
    """Binning a million groups takes a few milliseconds (a few vectorised passes)."""
    rng = np.random.default_rng(0)
    x2, e2 = rng.lognormal(3, 1, 1 << 20), rng.lognormal(0, 1, 1 << 20)
    GroupSQNR.of_sums(x2, e2)
    best = min(_timed(lambda: GroupSQNR.of_sums(x2, e2)) for _ in range(5))
    assert best < 0.25, best  # ~8 ms here: ~8 ns a group, 0.25 ns an int4 element (of 32)


def _timed(f) -> float:
    t = time.perf_counter()
    f()
    return time.perf_counter() - t


# --------------------------------------------------------------------------- group views


@pytest.fixture(scope="module")
def grouped(tmp_path_factory):
    """An int4 group-wise output (groups of 32) with a zero group and a low-SQNR group."""
    tmp = tmp_path_factory.mktemp("grouped")
    rng = np.random.default_rng(8)
    x = rng.standard_normal((256, 512)).astype(np.float32)
    x[5, :32] = 0.0
    x[9, 64:96] = 0.5  # half a step each (scale 1): all round to 0, SQNR 8.6 dB
    x[9, 70] = 7.0
    spec = QuantSpec(dtype="int4", axis=1, block_size=32, method="dynamic")
    report = qs.quantize_store(x, tmp / "g.zarr", spec)
    return report, qs.open_quantized(tmp / "g.zarr")


def test_group_summary_reads_the_distribution_and_the_worst_groups(grouped):
    report, arr = grouped
    g = arr.view.groups
    assert g == ReportView.from_report(report).groups
    assert g.groups == 256 * 16 and g.zero_signal == 1 and g.exact == 0
    assert g.histogram.total == g.groups - 1 and g.finite == g.groups - 1
    assert g.worst[0]["group"] == [9, 2] and g.worst[0]["sqnr_db"] < 10
    q = g.quantiles
    assert q["min"] == g.worst[0]["sqnr_db"] < q["p05"] < q["median"] < q["p95"]
    assert 18 < q["median"] < 23  # int4 groups of 32 of a normal: ~20 dB
    assert [m[0] for m in g.markers()] == ["worst", "median"]
    assert g.shown().nbins <= 48 and g.shown().total == g.histogram.total
    assert g.notes() == "1 without signal"
    # not a group-wise output: no group summary
    per = qs.quantize_store(np.ones((4, 8), np.float32), "memory://gv-per", QuantSpec(axis=0),
                            overwrite=True)  # fmt: skip
    assert ReportView.from_report(per).groups is None and GroupSummary.from_error(None) is None


def test_group_html_draws_the_distribution_with_its_markers_and_the_worst_groups(grouped):
    report, arr = grouped
    for html in (arr._repr_html_(), report._repr_html_()):
        (svg,) = _svgs(html)
        bars = _bars(svg)
        assert len(bars) == arr.view.groups.shown().nbins
        total = sum(int(b.find(SVG + "title").text.rsplit(": ", 1)[1]) for b in bars)
        assert total == arr.view.groups.histogram.total
        lines = [ln for ln in svg.iter(SVG + "line") if ln.get("class") == "threshold"]
        assert sorted(ln.get("data-method") for ln in lines) == ["median", "worst"]
        worst = next(ln for ln in lines if ln.get("data-method") == "worst")
        assert float(worst.get("data-x")) == pytest.approx(arr.view.groups.worst[0]["sqnr_db"])
        text = "".join(_tree(html).itertext())
        assert "per-group SQNR (4096 groups of 32" in text and "1 without signal" in text
        rows = [[td.text for td in tr] for tr in _tree(html).iter("tr")]
        assert rows[[r[0] for r in rows].index("9,2")][:2] == ["9,2", "9,64"]


def test_outputs_without_the_distribution_draw_no_distribution(grouped, tmp_path):
    """An output written before the distribution was kept: its worst groups, nothing else."""
    _, arr = grouped
    meta = json.loads(json.dumps(arr.meta))
    del meta["error"]["groups"]
    view = ReportView.from_meta(meta, "old")
    assert view.groups.histogram is None and view.groups.quantiles is None
    assert len(view.groups.worst) == 5
    from qstream.viz.html import view_html

    html = view_html(view)
    assert _svgs(html) == []
    assert "9,2" in "".join(_tree(html).itertext())
    del meta["error"]["worst_groups"]
    assert ReportView.from_meta(meta, "older").groups is None
    assert _svgs(view_html(ReportView.from_meta(meta, "older"))) == []
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    from qstream.viz.mpl import group_figure, plot_view, save_figure

    ax = plot_view(view, ax=Figure().add_subplot())
    assert ax.get_title() == "old: worst groups" and len(ax.patches) == 5

    save_figure(view, tmp_path / "old.svg", group_figure(view, arr.scale))
    text = "".join(ET.parse(tmp_path / "old.svg").getroot().itertext())
    assert "no per-group SQNR distribution kept" not in text  # the scales take the top
    assert "4096 groups: their scales" in text and "worst groups" in text


def test_group_plots_draw_the_distribution(grouped, tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    from qstream.viz.mpl import figure, group_figure, save_figure

    _, arr = grouped
    g = arr.view.groups
    (ax,) = arr.plot().axes
    assert ax.get_xlabel() == "SQNR dB of a group" and ax.get_yscale() == "log"
    assert len(ax.patches) == g.shown().nbins
    assert sum(p.get_height() for p in ax.patches) == g.histogram.total
    assert sorted(ln.get_xdata()[0] for ln in ax.get_lines()) == pytest.approx(
        sorted(x for _, x in g.markers())
    )
    save_figure(arr.view, tmp_path / "g.svg", group_figure(arr.view, arr.scale))
    root = ET.parse(tmp_path / "g.svg").getroot()
    assert (root.get("width"), root.get("height")) == ("720pt", "504pt")
    text = "".join(root.itertext())
    for want in ("per-group SQNR (4096 groups)", "4096 groups: their scales", "worst groups",
                 "group SQNR dB: p05"):  # fmt: skip
        assert want in text, want
    save_figure(arr.view, tmp_path / "page.svg", figure(arr.view))  # the generic page too
    assert "per-group SQNR" in "".join(ET.parse(tmp_path / "page.svg").getroot().itertext())


# --------------------------------------------------------------------------- checkpoints


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from pathlib import Path

    src = Path(__file__).resolve().parents[2] / "samples" / "tiny-transformer.safetensors"
    dst = tmp_path_factory.mktemp("ck") / "tiny.zarr"
    qs.convert_checkpoint(str(src), str(dst))
    return qs.open_quantized(dst)


def test_checkpoint_view_sums_and_ranks_the_tensors(checkpoint):
    rows = list(checkpoint.tensors.values())
    v = checkpoint.view
    quant = [r for r in rows if not r["kept"]]
    assert (v.tensors, v.quantized, v.kept) == (len(rows), len(quant), len(rows) - len(quant))
    assert v.bytes_before == sum(r["bytes_before"] for r in rows)
    assert v.bytes_after == sum(r["bytes_after"] for r in rows)
    sq = sorted((float(r["error"]["sqnr_db"]), r["name"]) for r in quant)
    assert [w["name"] for w in v.worst] == [n for _, n in sq[:10]]
    assert v.sqnr.channels == len(quant) and v.sqnr.quantiles["min"] == sq[0][0]
    assert v.sqnr.histogram.total == len(quant)
    big = max(rows, key=lambda r: r["bytes_before"])
    assert v.largest[0]["name"] == big["name"]
    assert sum(t["tensors"] for t in v.targets) == len(rows)
    assert sum(t["bytes_after"] for t in v.targets) == v.bytes_after
    assert v.sizes_before.total == v.sizes_after.total == len(rows)
    assert CheckpointView.from_dict(json.loads(json.dumps(v.to_dict()))) == v


def test_checkpoint_html_shows_totals_sqnr_worst_tensors_and_sizes(checkpoint):
    v = checkpoint.view
    html = checkpoint._repr_html_()
    sq_svg, size_svg = _svgs(html)
    counts = [int(b.find(SVG + "title").text.rsplit(": ", 1)[1]) for b in _bars(sq_svg)]
    assert sum(counts) == v.quantized
    assert {ln.get("data-method") for ln in sq_svg.iter(SVG + "line") if ln.get("data-method")} == {
        "worst",
        "median",
    }
    series = {b.get("data-series") for b in _bars(size_svg)}
    assert series == {"before", "after"}
    assert len(_bars(size_svg)) == 2 * v.sizes_before.nbins
    text = "".join(_tree(html).itertext())
    assert f"{v.tensors} tensors: {v.quantized} quantized, {v.kept} kept" in text
    assert "SQNR per tensor (25 quantized tensors)" in text
    rows = [[td.text for td in tr] for tr in _tree(html).iter("tr")]
    worst = [r for r in rows if r and r[0] == v.worst[0]["name"]]
    assert worst and worst[0][2] == f"{v.worst[0]['sqnr_db']:.2f}"


def test_checkpoint_plot_and_figure(checkpoint, tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    from qstream.viz.mpl import checkpoint_figure, save_figure

    v = checkpoint.view
    (ax,) = checkpoint.plot().axes
    assert ax.get_xlabel() == "SQNR dB of a tensor"
    # (counts of at most 20 a bin read better linear; more: log, so that the worst show)
    most = max(p.get_height() for p in ax.patches)
    assert ax.get_yscale() == ("log" if most > 20 else "linear")
    assert sum(p.get_height() for p in ax.patches) == v.quantized
    save_figure(None, tmp_path / "ck.svg", checkpoint_figure(list(checkpoint.tensors.values())))
    text = "".join(ET.parse(tmp_path / "ck.svg").getroot().itertext())
    for want in ("SQNR per tensor", "worst 10 tensors", "tensors by size (34; 9 kept)"):
        assert want in text, want
    save_figure(None, tmp_path / "ck2.svg", checkpoint_figure(v, "named"))  # a view, retitled
    assert "named" in "".join(ET.parse(tmp_path / "ck2.svg").getroot().itertext())


def test_a_conversions_result_draws_and_shows_its_output(tmp_path):
    """``convert_checkpoint`` returns its report (a dict, as ``--json`` writes it) with the
    views of its output: ``plot()`` returns the output's figure, and a notebook shows its
    table, for a Zarr output and for a safetensors export alike."""
    pytest.importorskip("matplotlib")
    import json
    from pathlib import Path

    import matplotlib
    from matplotlib.figure import Figure

    matplotlib.use("Agg")
    src = Path(__file__).resolve().parents[2] / "samples" / "tiny-transformer.safetensors"
    for name in ("tiny.zarr", "tiny.safetensors"):
        result = qs.convert_checkpoint(str(src), str(tmp_path / name))
        assert isinstance(result, dict) and json.loads(json.dumps(result)) == dict(result)
        opened = result.output()
        assert isinstance(opened, qs.QuantizedCheckpoint)
        assert set(result["tensors"]) <= set(opened.tensors)  # (an export: lm_head untied)
        fig = result.plot()
        assert isinstance(fig, Figure)
        assert fig.axes[0].get_xlabel() == "SQNR dB of a tensor"
        assert result._repr_html_() == opened._repr_html_()
    # an output qstream does not read back (compressed-tensors' own layout): the dict's text
    scheme = qs.convert_checkpoint(str(src), str(tmp_path / "fp8" / "m.safetensors"),
                                   scheme="FP8_DYNAMIC")  # fmt: skip
    assert scheme._repr_html_() is None and "destination" in repr(scheme)


def _rows(n: int) -> list[dict]:
    """Index rows of a checkpoint of ``n`` tensors (as QuantizedCheckpoint.tensors holds)."""
    rng = np.random.default_rng(1)
    sq = rng.normal(20, 2, n)
    size = rng.integers(1, 1 << 24, n)
    rows = []
    for i in range(n):
        kept = i % 7 == 0
        rows.append(
            {
                "name": f"model.layers.{i // 16}.block.{i % 16}.weight",
                "shape": [int(size[i] // 64), 64],
                "dtype": "bfloat16",
                "target": "keep" if kept else f"int4/axis1/block{32 << (i % 3)}",
                "kept": kept,
                "bytes_before": int(size[i]),
                "bytes_after": int(size[i]) if kept else int(size[i]) // 4,
                "error": None if kept else {"sqnr_db": "inf" if i == 5 else float(sq[i])},
            }
        )
    return rows


def test_the_checkpoint_view_stays_bounded_for_90000_tensors(tmp_path):
    rows = _rows(90_000)
    t0 = time.perf_counter()
    v = CheckpointView.from_rows(rows, "big")
    built = time.perf_counter() - t0
    assert built < 5, built
    assert v.tensors == 90_000 and v.kept == len(range(0, 90_000, 7))
    assert v.sqnr.channels == v.quantized and v.sqnr.exact == 1
    assert len(v.worst) == 10 and len(v.largest) == 10 and len(v.targets) == 4
    assert v.worst[0]["sqnr_db"] == min(r["error"]["sqnr_db"] for r in rows if not r["kept"]
                                        and r["error"]["sqnr_db"] != "inf")  # fmt: skip
    from qstream.viz.html import checkpoint_html

    html = checkpoint_html(v)
    assert len(html) < 40_000  # the same size for 90 or 90,000 tensors
    assert len(json.dumps(v.to_dict())) < 20_000
    pytest.importorskip("matplotlib")
    from qstream.viz.mpl import checkpoint_figure, save_figure

    t0 = time.perf_counter()
    save_figure(None, tmp_path / "big.png", checkpoint_figure(rows, "big"))
    assert time.perf_counter() - t0 < 20
    assert (tmp_path / "big.png").stat().st_size < 300_000
