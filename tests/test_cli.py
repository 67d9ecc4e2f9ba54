"""The command line: every command and option group, bad input, and the README's first command."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr
from qstream.cli.main import app
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "samples"
runner = CliRunner()


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture
def src(tmp_path):
    x = (np.random.default_rng(0).standard_normal((64, 300)) * 0.02).astype(np.float32)
    a = zarr.create_array(
        str(tmp_path / "src.zarr"), shape=x.shape, chunks=(16, 300), dtype="float32"
    )
    a[...] = x
    return tmp_path / "src.zarr"


def _last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "opts",
    [
        [],
        ["--axis", "0", "--asymmetric", "--dtype", "uint8"],
        ["--axis", "1", "--block-size", "32", "--method", "dynamic"],
        ["--method", "percentile", "--percentile", "99.9", "--round-mode", "half_away_from_zero"],
        ["--scale", "0.001", "--zero-point", "3", "--nan-policy", "min"],
        ["--method", "entropy", "--max-memory", "2MiB"],
    ],
)
def test_quantize_option_groups_and_json_report(src, tmp_path, opts):
    r = run("quantize", src, tmp_path / "q.zarr", *opts, "--json")
    assert r.exit_code == 0, r.output
    report = _last_json(r.stdout)
    assert report["error"]["sqnr_db"] != "nan" and report["passes"] >= 1
    r = run("inspect", tmp_path / "q.zarr")
    assert r.exit_code == 0 and "sqnr_db" in r.stdout


def test_dequantize_calibrate_inspect_and_resume_overwrite(src, tmp_path):
    assert run("quantize", src, tmp_path / "q.zarr", "--axis", "0", "--quiet").exit_code == 0
    r = run("quantize", src, tmp_path / "q.zarr", "--axis", "0", "--quiet")  # resume: no-op
    assert r.exit_code == 0
    r = run("quantize", src, tmp_path / "q.zarr", "--axis", "1", "--quiet")
    assert r.exit_code == 1 and "overwrite" in r.output
    assert (
        run("quantize", src, tmp_path / "q.zarr", "--axis", "1", "--overwrite", "--quiet").exit_code
        == 0
    )
    for dt in ("float32", "float16", "bfloat16"):
        r = run(
            "dequantize", tmp_path / "q.zarr", tmp_path / f"d-{dt}.zarr", "--dtype", dt, "--json"
        )
        assert r.exit_code == 0, r.output
        assert _last_json(r.stdout)["dtype"] == dt
    r = run("calibrate", src, "--method", "mse", "--axis", "0", "--json")
    assert r.exit_code == 0
    assert len(_last_json(r.stdout)["params"]["scale"]) == 64
    r = run("calibrate", src)
    assert r.exit_code == 0 and "scale" in r.stdout
    r = run("inspect", tmp_path / "q.zarr", "--json")
    assert _last_json(r.stdout)["granularity"] == "per_axis"


def test_bad_input_gives_one_line_and_exit_code(src, tmp_path):
    cases = [
        (["quantize", tmp_path / "missing.zarr", tmp_path / "o.zarr"], 1, "no such Zarr store"),
        (["quantize", src, tmp_path / "o.zarr", "--dtype", "int9"], 2, "unknown quantized type"),
        (["quantize", src, tmp_path / "o.zarr", "--axis", "7"], 2, "axis 7 is out of range"),
        (["quantize", src, tmp_path / "o.zarr", "--method", "kl"], 2, "unknown method"),
        (["quantize", src, tmp_path / "o.zarr", "--scale", "0"], 2, "scale must be finite"),
        (["quantize", src, tmp_path / "o.zarr", "--max-memory", "lots"], 2, "not a size"),
        (["dequantize", src, tmp_path / "o2.zarr"], 1, "not a qstream quantized array"),
        (["inspect", src], 1, "not a qstream quantized array"),
        (["inspect", tmp_path / "nothing.zarr"], 1, "no such Zarr store"),
        (["convert", tmp_path / "none.safetensors", tmp_path / "c.zarr"], 1, "none.safetensors"),
    ]
    for args, code, text in cases:
        r = run(*args)
        assert r.exit_code == code, (args, r.output)
        assert text in r.output, (args, r.output)
        assert "Traceback" not in r.output
        assert len([ln for ln in r.output.splitlines() if ln.startswith("error:")]) == 1


def test_nan_with_policy_error_fails_and_leaves_nothing_complete(tmp_path):
    x = np.ones((32, 32), np.float32)
    x[5, 6] = np.nan
    a = zarr.create_array(str(tmp_path / "nan.zarr"), shape=x.shape, dtype="float32")
    a[...] = x
    r = run("quantize", tmp_path / "nan.zarr", tmp_path / "q.zarr")
    assert r.exit_code == 1 and "first at index (5, 6)" in r.output
    r = run("quantize", tmp_path / "nan.zarr", tmp_path / "q2.zarr", "--scale", "0.1")
    assert r.exit_code == 1
    r = run("inspect", tmp_path / "q2.zarr", "--json")  # an unfinished output can be inspected
    assert r.exit_code == 0 and _last_json(r.stdout)["complete"] is False
    r = run("dequantize", tmp_path / "q2.zarr", tmp_path / "d.zarr")
    assert r.exit_code == 1 and "incomplete" in r.output


def test_unwritable_destination(src, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    r = run("quantize", src, blocker / "q.zarr")
    assert r.exit_code == 1, r.output
    assert r.output.startswith("error:") and "Traceback" not in r.output
    assert "file" in r.output and blocker.read_text() == "not a directory"


def test_convert_sample_with_recipe_resume_and_corrupt_header(tmp_path):
    ckpt = SAMPLES / "tiny-transformer.safetensors"
    dst = tmp_path / "tiny.zarr"
    r = run("convert", ckpt, dst, "--recipe", SAMPLES / "recipe-int8.toml", "--json")
    assert r.exit_code == 0, r.output
    report = _last_json(r.stdout)
    kept = [n for n, t in report["tensors"].items() if t["kept"]]
    assert "norm.weight" in kept and all("proj.weight" not in n for n in kept)
    assert report["bytes_after"] < report["bytes_before"] * 0.6
    r = run("convert", ckpt, dst, "--recipe", SAMPLES / "recipe-int8.toml")  # resumes: done
    assert r.exit_code == 0 and "[34/34]" in r.output
    bad = tmp_path / "bad.safetensors"
    raw = ckpt.read_bytes()
    bad.write_bytes(raw[:8] + b"{garbage" + raw[16:4096])
    r = run("convert", bad, tmp_path / "bad.zarr")
    assert r.exit_code == 1 and "bad.safetensors" in r.output and "Traceback" not in r.output
    bad_recipe = tmp_path / "r.toml"
    bad_recipe.write_text("[defaults]\ndtype = 'int9'\n")
    r = run("convert", ckpt, tmp_path / "x.zarr", "--recipe", bad_recipe)
    assert r.exit_code == 2 and "int9" in r.output


def test_help_is_fast_and_does_not_import_numba():
    code = (
        "import sys, time; t = time.perf_counter(); from qstream.cli.main import app;"
        "print(time.perf_counter() - t, 'numba' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    seconds, numba_loaded = out.stdout.split()
    assert numba_loaded == "False"
    assert float(seconds) < 5  # generous: the point is no compile, not a timing


def test_readme_first_command_runs_on_the_sample(tmp_path):
    readme = (ROOT / "README.md").read_text()
    block = readme.split("```bash", 1)[1].split("```", 1)[0]
    first = block.strip().splitlines()[0].split("#")[0].strip()
    assert first.startswith("pip install -e . && ")
    command = first.removeprefix("pip install -e . && ")
    if shutil.which("qstream") is None:
        pytest.skip("qstream console script not on PATH")
    env = {**os.environ, "PWD": str(tmp_path)}
    work = tmp_path / "repo"
    shutil.copytree(SAMPLES, work / "samples")
    out = subprocess.run(command, shell=True, cwd=work, capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr + out.stdout


def test_bundled_samples_are_in_the_repository_and_the_notebook_runs(tmp_path):
    for name in (
        "tiny-transformer.safetensors",
        "activations.zarr/zarr.json",
        "recipe-int8.toml",
        "notebook.py",
        "nightly-convert.sh",
        "make_samples.py",
    ):
        assert (SAMPLES / name).is_file(), f"samples/{name} is missing"
    tracked = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "samples/activations.zarr"],
        capture_output=True,
        text=True,
    )
    if tracked.returncode == 0:  # a git checkout: the README's samples are committed
        assert "samples/activations.zarr/zarr.json" in tracked.stdout
    out = subprocess.run(
        [sys.executable, str(SAMPLES / "notebook.py")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "entropy calibration" in out.stdout
