"""The command line's views: ``calibrate --show/--compare``, ``inspect --show/--plot``,
``quantize --histogram``, on the bundled samples."""

import io
import json
import re
import struct
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "samples"
ACTS = SAMPLES / "activations.zarr"
runner = CliRunner()
ROW = re.compile(r"^\s*(\S+(?: dB)?) \|([#x]*)\s+(\d+)$")


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def strict_json(text: str) -> dict:
    def refuse(token):
        raise AssertionError(f"non-standard JSON constant {token}")

    return json.loads(text, parse_constant=refuse)


def rows_and_markers(out: str):
    """The histogram rows ``(label, bar, count)`` and marker lines ``(index, name, x)``."""
    rows, markers = [], []
    for line in out.splitlines():
        m = ROW.match(line)
        if m:
            rows.append((m.group(1), m.group(2), int(m.group(3))))
            continue
        m = re.match(r"^\s*\+-+ (\w+) (\S+)", line)
        if m:
            markers.append((len(rows), m.group(1), float(m.group(2))))
    return rows, markers


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    dst = tmp_path_factory.mktemp("ck") / "tiny.zarr"
    r = run("convert", SAMPLES / "tiny-transformer.safetensors", dst, "-q")
    assert r.exit_code == 0, r.output
    return dst


def test_calibrate_show_draws_the_histogram_with_its_clip_threshold():
    r = run("calibrate", ACTS, "--method", "entropy", "--show")
    assert r.exit_code == 0, r.output
    data = strict_json(run("calibrate", ACTS, "--method", "entropy", "--json").stdout)
    hi = data["thresholds"]["max"][0]
    rows, markers = rows_and_markers(r.stdout)
    assert 20 <= len(rows) <= 30
    assert sum(c for _, _, c in rows) == 512 * 256  # every value, exact counts
    assert [(name, x) for _, name, x in markers] == [("entropy", pytest.approx(hi, rel=1e-3))]
    cut = markers[0][0]
    assert all("x" not in bar for _, bar, _ in rows[:cut])  # kept rows: '#'
    assert all("#" not in bar for _, bar, _ in rows[cut:])  # beyond the threshold: 'x'
    assert any(bar for _, bar, _ in rows[cut:])
    assert float(rows[cut - 1][0]) < hi <= float(rows[cut][0])
    peak = max(rows, key=lambda r: r[2])
    assert len(peak[1]) == 40 and rows[0] == peak  # log scale: the zero bin is the peak


def test_calibrate_compare_sets_every_method_side_by_side_in_text_and_json():
    r = run("calibrate", ACTS, "--compare", "--json")
    assert r.exit_code == 0, r.output
    d = strict_json(r.stdout)
    view = d["view"]
    hist = view["histogram"]
    assert len(hist["counts"]) == 128 and len(hist["edges"]) == 129
    assert sum(hist["counts"]) == 512 * 256 and hist["abs"] is True
    preds = {p["method"]: p for p in view["predictions"]}
    assert sorted(preds) == sorted(["minmax", "percentile", "entropy", "mse", "l2"])
    for method in ("percentile", "l2"):
        single = strict_json(run("calibrate", ACTS, "--method", method, "--json").stdout)
        assert preds[method]["lo"] == single["thresholds"]["min"][0]
        assert preds[method]["hi"] == single["thresholds"]["max"][0]
        assert preds[method]["scale"] == single["params"]["scale"]
    best = max(preds.values(), key=lambda p: p["predicted_sqnr_db"])["method"]
    r = run("calibrate", ACTS, "--compare")
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith("methods compared on"))
    table = [ln.split() for ln in lines[at + 2 : at + 7]]
    assert [t[0] for t in table] == list(preds)
    assert [t[0] for t in table if t[-1] == "*"] == [best]
    for t in table:
        assert float(t[6]) == pytest.approx(preds[t[0]]["predicted_sqnr_db"], abs=0.006)
    _, markers = rows_and_markers(r.stdout)
    assert sorted(name for _, name, _ in markers) == sorted(preds)


def test_calibrate_show_per_channel_shows_the_predicted_sqnr_and_worst_channels(converted):
    w = converted / "layers.1.mlp.up_proj.weight"
    restored = converted.parent / "up.zarr"
    assert run("dequantize", w, restored, "-q").exit_code == 0
    r = run("calibrate", restored, "--axis", "0", "--show", "--json")
    assert r.exit_code == 0, r.output
    pred = strict_json(r.stdout)["view"]["predictions"][0]
    assert pred["method"] == "minmax" and pred["channels"]["channels"] == 512
    assert sum(pred["channels"]["histogram"]["counts"]) == 512
    r = run("calibrate", restored, "--axis", "0", "--show")
    assert r.exit_code == 0, r.output
    out = r.stdout
    assert "per-channel SQNR predicted for minmax: 512 channels" in out
    worst = out.split("worst channels predicted for minmax")[1].splitlines()[2].split()
    assert int(worst[0]) == pred["channels"]["worst"][0]["channel"]


def test_inspect_show_draws_what_the_output_kept(tmp_path, converted):
    dst = tmp_path / "acts.zarr"
    assert run("quantize", ACTS, dst, "--method", "percentile", "-q").exit_code == 0
    r = run("inspect", dst, "--show")
    assert r.exit_code == 0, r.output
    rows, markers = rows_and_markers(r.stdout)
    assert sum(c for _, _, c in rows) == 512 * 256 and [m[1] for m in markers] == ["percentile"]
    meta = strict_json(run("inspect", dst, "--json").stdout)
    assert markers[0][2] == pytest.approx(meta["calibration"]["thresholds"]["max"][0], rel=1e-3)
    # a converted tensor, per channel: its SQNR distribution and worst channels
    tensor = converted / "layers.0.self_attn.q_proj.weight"
    r = run("inspect", tensor, "--show")
    assert r.exit_code == 0, r.output
    error = strict_json(run("inspect", tensor, "--json").stdout)["error"]
    assert f"per-channel SQNR: {error['channels']['channels']} channels" in r.stdout
    rows, markers = rows_and_markers(r.stdout)
    assert sum(c for _, _, c in rows) == 128 and [m[1] for m in markers] == ["median"]
    assert r.stdout.count("worst channels") == 1  # shown once, with the clip fraction
    table = r.stdout.split("worst channels\n")[1].splitlines()
    assert table[0].split() == ["channel", "SQNR", "dB", "clip", "%", "max", "err"]
    assert int(table[1].split()[0]) == error["worst_channels"][0]["channel"]
    # a checkpoint root: the SQNR over its tensors, the worst and largest, bytes per target
    r = run("inspect", converted, "--show")
    assert r.exit_code == 0, r.output
    tensors = strict_json(run("inspect", converted, "--json").stdout)["tensors"]
    quantized = [n for n, t in tensors.items() if not t.get("kept")]
    assert f"{len(tensors)} tensors ({len(quantized)} quantized" in r.stdout
    rows, markers = rows_and_markers(r.stdout)
    assert sum(c for _, _, c in rows) == len(quantized)
    assert [m[1] for m in markers] == ["worst", "median"]
    worst = min(quantized, key=lambda n: tensors[n]["error"]["sqnr_db"])
    assert r.stdout.split("worst tensors\n")[1].splitlines()[1].split()[0] == worst
    assert "largest tensors" in r.stdout and "bytes by target" in r.stdout


def test_inspect_show_of_a_group_wise_output_draws_every_groups_sqnr(tmp_path):
    dst = tmp_path / "g.zarr"
    r = run("quantize", ACTS, dst, "--dtype", "int4", "--axis", "1", "--block-size", "32", "-q")
    assert r.exit_code == 0, r.output
    r = run("inspect", dst, "--show")
    assert r.exit_code == 0, r.output
    error = strict_json(run("inspect", dst, "--json").stdout)["error"]
    groups = error["groups"]
    assert f"per-group SQNR: {groups['groups']} groups" in r.stdout
    rows, markers = rows_and_markers(r.stdout)
    assert sum(c for _, _, c in rows) == sum(groups["counts"])
    assert "median" in [m[1] for m in markers]
    table = r.stdout.split("worst groups\n")[1].splitlines()
    assert table[0].split() == ["group", "first", "element", "SQNR", "dB", "max", "err"]
    first = error["worst_groups"][0]
    assert table[1].split()[0] == ",".join(str(i) for i in first["group"])


def test_minmax_outputs_keep_a_histogram_only_when_asked(tmp_path):
    plain, kept = tmp_path / "plain.zarr", tmp_path / "kept.zarr"
    assert run("quantize", ACTS, plain, "-q").exit_code == 0
    r = run("inspect", plain, "--show")
    assert r.exit_code == 0 and "quantize with --histogram to keep one" in r.stdout
    assert rows_and_markers(r.stdout) == ([], [])
    r = run("quantize", ACTS, kept, "--histogram", "--json")
    assert r.exit_code == 0 and strict_json(r.stdout)["passes"] == 3
    rows, markers = rows_and_markers(run("inspect", kept, "--show").stdout)
    assert sum(c for _, _, c in rows) == 512 * 256 and [m[1] for m in markers] == ["minmax"]
    assert not any("x" in bar for _, bar, _ in rows)  # minmax clips nothing


def test_show_is_rich_on_a_terminal(monkeypatch):
    from rich.console import Console

    import cli.show as show

    buf = io.StringIO()
    monkeypatch.setattr(show, "console", lambda: Console(file=buf, force_terminal=True, width=90))
    r = run("calibrate", ACTS, "--method", "mse", "--show")
    assert r.exit_code == 0, r.output
    text = buf.getvalue()
    assert "█" in text and "\x1b[" in text and "mse" in text
    assert "#" not in text.split("mse")[0].split("\n", 2)[-1]


def _png_size(path: Path):
    raw = path.read_bytes()
    assert raw[:8] == b"\x89PNG\r\n\x1a\n" and raw[12:16] == b"IHDR"
    return struct.unpack(">II", raw[16:24])


def test_inspect_plot_writes_a_one_page_png_or_svg(tmp_path, converted):
    pytest.importorskip("matplotlib")
    dst = tmp_path / "acts.zarr"
    assert run("quantize", ACTS, dst, "--method", "entropy", "-q").exit_code == 0
    r = run("inspect", dst, "--plot", tmp_path / "acts.png")
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[-1] == f"figure written to {tmp_path / 'acts.png'}"
    assert _png_size(tmp_path / "acts.png") == (1000, 700)
    tensor = converted / "layers.2.mlp.down_proj.weight"
    r = run("inspect", tensor, "--plot", tmp_path / "down.svg", "--json")
    assert r.exit_code == 0, r.output
    strict_json(r.stdout)  # --json stays one JSON document
    root = ET.parse(tmp_path / "down.svg").getroot()
    assert (root.get("width"), root.get("height")) == ("720pt", "504pt")
    text = "".join(root.itertext())  # text stays text
    assert "per-channel SQNR (128 channels)" in text and "worst 5 channels" in text


def test_inspect_plot_of_a_checkpoint_says_where_the_figure_went_making_its_folder(
    tmp_path, converted
):
    pytest.importorskip("matplotlib")
    png = tmp_path / "figures" / "new" / "ck.png"  # (a folder not made yet)
    r = run("inspect", converted, "--plot", png)
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[-1] == f"figure written to {png}"
    assert _png_size(png) == (1000, 700)
    svg = tmp_path / "ck.svg"
    r = run("inspect", converted, "--plot", svg, "--json")
    assert r.exit_code == 0, r.output
    assert strict_json(r.stdout)["tensors"]  # (stdout: the JSON alone)
    assert r.stderr.strip() == f"figure written to {svg}" and svg.stat().st_size > 0


def test_inspect_plot_under_a_file_is_refused_before_any_work(tmp_path):
    (tmp_path / "taken").write_text("not a folder")
    r = run("inspect", tmp_path / "none.zarr", "--plot", tmp_path / "taken" / "x.png")
    assert r.exit_code == 2
    assert r.stderr.strip() == (
        f"error: --plot {tmp_path / 'taken' / 'x.png'}: {tmp_path / 'taken'} is a file, not a"
        " folder"
    )


def test_inspect_plot_refuses_other_formats_before_any_work(tmp_path):
    r = run("inspect", tmp_path / "none.zarr", "--plot", tmp_path / "x.pdf")
    assert r.exit_code == 2
    assert (
        r.stderr.strip()
        == f"error: --plot {tmp_path / 'x.pdf'}: the figure is written as .png or .svg"
    )


def test_inspect_plot_without_matplotlib_names_the_extra(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    r = run("inspect", tmp_path / "none.zarr", "--plot", tmp_path / "x.png")
    assert r.exit_code == 2
    assert r.stderr.strip() == "error: --plot needs matplotlib: pip install 'qstream-zarr[plot]'"


def test_calibrate_show_refuses_blocked_specs_in_flag_terms():
    r = run("calibrate", ACTS, "--axis", "1", "--block-size", "32", "--method", "dynamic", "--show")
    assert r.exit_code == 2
    assert "--block-size" in r.stderr and len(r.stderr.splitlines()) == 1


def test_readme_capture_is_what_the_command_prints_and_the_figure_is_committed(monkeypatch):
    readme = (ROOT / "README.md").read_text()
    block = readme.split("<!-- capture: calibrate --compare -->")[1].split("<!-- end capture -->")[
        0
    ]
    lines = block.strip().removeprefix("```text").removesuffix("```").strip().splitlines()
    command = lines[0].removeprefix("$ qstream ").split()
    monkeypatch.chdir(ROOT)
    r = run(*command)
    assert r.exit_code == 0, r.output
    assert r.stdout.rstrip().splitlines() == lines[1:]
    png = ROOT / "docs" / "inspect-activations.png"
    assert "](docs/inspect-activations.png)" in readme
    assert _png_size(png) == (1000, 700) and png.stat().st_size < 150_000
    assert (SAMPLES / "make_figures.py").is_file()
