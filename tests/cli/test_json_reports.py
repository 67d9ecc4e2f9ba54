"""``--json`` for operations: every report opens with the qstream version and a summary, in one
JSON style; a failure prints a JSON error object on stdout as well as its ``error:`` line; the
sample recipe is quiet on a Llama checkpoint; the nightly sample logs its start and end."""

import json
import math
import os
import re
import shutil
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
import zarr
from safetensors.numpy import load_file, save_file
from typer.testing import CliRunner

import qstream as qs
from cli.main import app

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "samples"
SAMPLE = SAMPLES / "tiny-transformer.safetensors"
runner = CliRunner()


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def report_of(r) -> dict:
    """The one JSON document on stdout, checked to be in the one style (``json.dumps``'s
    separators, whatever the report's size)."""
    assert r.exit_code == 0, r.output
    text = r.stdout.strip()
    doc = json.loads(text)
    assert json.dumps(doc) == text  # the same separators throughout (no '":{' nor '","')
    assert list(doc)[:2] == ["qstream_version", "summary"]
    assert doc["qstream_version"] == qs.__version__
    return doc


def sqnr(error: dict | None) -> float:
    v = (error or {}).get("sqnr_db")
    return math.inf if v is None else float(v)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    out = tmp_path_factory.mktemp("json") / "tiny.zarr"
    r = run("convert", SAMPLE, out, "--json")
    return out, report_of(r)


def test_convert_report_summary_counts_tensors_and_names_the_worst_sqnr(converted):
    _, report = converted
    tensors = report["tensors"]
    kept = [n for n, t in tensors.items() if t["kept"]]
    worst = min((n for n in tensors if n not in kept), key=lambda n: sqnr(tensors[n]["error"]))
    s = report["summary"]
    assert (s["tensors"], s["quantized"], s["kept"]) == (
        len(tensors),
        len(tensors) - len(kept),
        len(kept),
    )
    assert kept and s["quantized"] > 0
    assert s["worst_tensor"] == worst
    assert s["worst_sqnr_db"] == tensors[worst]["error"]["sqnr_db"]
    assert (s["bytes_before"], s["bytes_after"]) == (report["bytes_before"], report["bytes_after"])


def test_inspect_dry_run_and_dequantize_reports_carry_the_same_counts(converted, tmp_path):
    out, conv = converted
    counts = {k: conv["summary"][k] for k in ("tensors", "quantized", "kept")}
    inspected = report_of(run("inspect", out, "--json"))
    assert {k: inspected["summary"][k] for k in counts} == counts
    assert inspected["summary"]["worst_sqnr_db"] == conv["summary"]["worst_sqnr_db"]
    plan = report_of(run("convert", SAMPLE, tmp_path / "p.zarr", "--dry-run", "--json"))
    assert {k: plan["summary"][k] for k in counts} == counts
    assert "worst_sqnr_db" not in plan["summary"]  # (nothing measured yet)
    back = report_of(run("dequantize", out, tmp_path / "d.zarr", "--json"))
    assert {k: back["summary"][k] for k in counts} == counts
    assert back["summary"]["bytes_written"] == back["bytes_written"]


def test_one_array_reports_give_its_sqnr_as_the_worst(converted, tmp_path):
    out, conv = converted
    name = conv["summary"]["worst_tensor"]
    one = report_of(run("inspect", f"{out}/{name}", "--json"))
    assert one["summary"]["worst_sqnr_db"] == one["error"]["sqnr_db"]
    x = np.random.default_rng(0).standard_normal((64, 300)).astype(np.float32)
    zarr.create_array(str(tmp_path / "x.zarr"), shape=x.shape, dtype="float32")[...] = x
    q = report_of(run("quantize", tmp_path / "x.zarr", tmp_path / "q.zarr", "--json"))
    assert q["summary"]["worst_sqnr_db"] == q["error"]["sqnr_db"]
    assert q["summary"]["already_complete"] is False
    again = report_of(run("quantize", tmp_path / "x.zarr", tmp_path / "q.zarr", "--json"))
    assert again["summary"]["already_complete"] is True
    cal = report_of(run("calibrate", tmp_path / "x.zarr", "--axis", "0", "--compare", "--json"))
    assert cal["summary"]["channels"] == 64
    minmax = [p for p in cal["view"]["predictions"] if p["method"] == "minmax"]
    assert cal["summary"]["predicted_sqnr_db"] == minmax[0]["predicted_sqnr_db"]


def error_of(r, code: int) -> dict:
    """The JSON error object of a failed ``--json`` run, checked against its stderr line."""
    assert r.exit_code == code, r.output
    doc = json.loads(r.stdout)
    assert set(doc) == {"error", "qstream_version"} and doc["qstream_version"] == qs.__version__
    e = doc["error"]
    assert set(e) == {"kind", "type", "message", "exit_code", "time"} and e["exit_code"] == code
    assert r.stderr.strip() == f"error: {e['message']}"  # stderr unchanged: no timestamp
    when = datetime.fromisoformat(e["time"].replace("Z", "+00:00"))
    assert abs(datetime.now(UTC) - when) < timedelta(minutes=5)
    return e


def test_failures_with_json_print_an_error_object_on_stdout(converted, tmp_path):
    missing = error_of(run("convert", tmp_path / "none.safetensors", tmp_path / "o", "--json"), 2)
    assert missing["kind"] == "usage" and "does not exist" in missing["message"]
    usage = error_of(run("convert", "--json"), 2)  # (Click's own usage error)
    assert usage["kind"] == "usage" and "CHECKPOINT" in usage["message"]
    bad = tmp_path / "r.toml"
    bad.write_text("[defaults]\ndtype = 'int9'\n")
    refused = error_of(run("convert", SAMPLE, tmp_path / "o", "--recipe", bad, "--json"), 2)
    assert refused["kind"] in ("invalid", "refused") and "int9" in refused["message"]
    out, _ = converted
    busy = tmp_path / "half.zarr"
    shutil.copytree(out, busy)
    (busy / "zarr.json").write_text("{not json")
    failed = error_of(run("inspect", busy, "--json"), 1)
    assert failed["kind"] in ("failed", "io") and failed["type"] != failed["kind"]


def test_failures_without_json_keep_stdout_empty(tmp_path):
    r = run("convert", tmp_path / "none.safetensors", tmp_path / "o")
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr.startswith("error: CHECKPOINT") and not re.search(r"\d{4}-\d\d-\d\d", r.stderr)


def test_the_sample_recipe_is_quiet_on_a_checkpoint_without_biases(tmp_path):
    tensors = load_file(str(SAMPLE))
    llama = {n: t for n, t in tensors.items() if not n.endswith(".bias")}
    assert len(llama) < len(tensors)  # (the sample has biases; a Llama checkpoint has none)
    save_file(llama, str(tmp_path / "llama.safetensors"))
    recipe = SAMPLES / "recipe-int8.toml"
    r = run("convert", tmp_path / "llama.safetensors", tmp_path / "l.zarr", "--recipe", recipe)
    assert r.exit_code == 0, r.output
    assert "warning" not in r.stderr, r.stderr
    r = run("convert", SAMPLE, tmp_path / "s.zarr", "--recipe", recipe, "--json")
    report = report_of(r)
    biases = [n for n in report["tensors"] if n.endswith(".bias")]
    assert biases and all(report["tensors"][n]["kept"] for n in biases)  # kept all the same


def test_nightly_sample_logs_start_and_end_with_timestamps(tmp_path):
    if shutil.which("qstream") is None:
        pytest.skip("qstream console script not on PATH")

    def nightly(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", str(SAMPLES / "nightly-convert.sh"), *args],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env={**os.environ, "TMPDIR": str(tmp_path)},
            timeout=300,
        )

    out = tmp_path / "nightly" / "o.zarr"  # (its folder not made yet)
    r = nightly(str(SAMPLE), str(out))
    assert r.returncode == 0, r.stderr
    lines = r.stderr.strip().splitlines()
    stamp = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ nightly-convert: "
    assert re.match(stamp + r"start: ", lines[0]), lines
    assert re.match(stamp + r"end: exit 0 after \d+ s$", lines[-1]), lines
    assert all(re.match(stamp, ln) for ln in lines), lines
    # a failure: qstream's own error line stamped too, between the script's start and end
    failed = nightly(str(SAMPLE), str(tmp_path / "other" / "o.zarr"), str(tmp_path / "no.toml"))
    assert failed.returncode == 2
    said = failed.stderr.strip().splitlines()
    assert all(re.match(stamp, ln) for ln in said), said
    assert re.match(stamp + r"qstream: error: recipe file not found: ", said[1]), said
    assert re.match(stamp + r"end: exit 2 after \d+ s$", said[-1]), said
    assert not (tmp_path / "other").exists()  # (a refused run makes no folder)
    assert not list(tmp_path.glob("nightly-convert.*"))  # (nor leaves a temporary report)
    report = json.loads((tmp_path / "nightly" / "o.zarr.report.json").read_text())
    assert report["summary"]["tensors"] == len(report["tensors"])
