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
from typer.testing import CliRunner

from cli.main import COMMANDS, app

ROOT = Path(__file__).resolve().parents[2]
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
    assert r.exit_code == 2 and "overwrite" in r.output  # (refused before any work)
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


def test_dequantize_of_a_checkpoint_names_each_tensor(tmp_path):
    from safetensors.numpy import save_file

    import qstream as qs

    rng = np.random.default_rng(0)
    tensors = {
        "lm_head.weight": rng.standard_normal((64, 32)).astype(np.float32),
        "model.layers.0.mlp.up_proj.weight": rng.standard_normal((1024, 256)).astype(np.float32),
        "model.norm.weight": rng.standard_normal(64).astype(np.float32),
    }
    save_file(tensors, str(tmp_path / "m.safetensors"))
    # (a small --max-memory: the large tensor is stored in chunks, restored by a job with progress)
    r = run(
        "convert", tmp_path / "m.safetensors", tmp_path / "q.zarr", "--max-memory", "1MiB", "-q"
    )
    assert r.exit_code == 0, r.output
    r = run("dequantize", tmp_path / "q.zarr", tmp_path / "d.zarr")
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[:3] == [  # a line per tensor, as convert prints
        "[1/3] lm_head.weight [64, 32] int8 -> float32: 8.0 KiB",
        "[2/3] model.layers.0.mlp.up_proj.weight [1024, 256] int8 -> float32: 1.0 MiB",
        "[3/3] model.norm.weight [64] float32 -> kept: 256 B",
    ]
    blocks = [ln for ln in r.stderr.splitlines() if " blocks (" in ln]
    assert blocks, r.stderr  # the progress lines name the tensor they are about
    assert all(
        ln.startswith("dequantize [2/3] model.layers.0.mlp.up_proj.weight: ") for ln in blocks
    )
    r = run("dequantize", tmp_path / "q.zarr", tmp_path / "d-quiet.zarr", "--quiet")
    assert r.exit_code == 0 and r.output == "", r.output
    r = run("dequantize", tmp_path / "q.zarr", tmp_path / "d-json.zarr", "--json")
    assert r.exit_code == 0 and list(json.loads(r.stdout)["tensors"]) == list(tensors)
    events = []  # the library's callback: before and after each tensor
    qs.dequantize_store(tmp_path / "q.zarr", tmp_path / "d-api.zarr", on_tensor=events.append)
    assert [(e.index, e.total, e.name, e.result is None) for e in events] == [
        (i // 2, 3, name, i % 2 == 0) for i, name in enumerate(n for n in tensors for _ in "ab")
    ]
    assert [e.target for e in events[1::2]] == ["float32", "float32", "keep"]
    assert events[3].result == {"kept": False, "bytes_written": 1024 * 256 * 4}


def test_bad_input_gives_one_line_and_exit_code(src, tmp_path):
    cases = [
        (["quantize", tmp_path / "missing.zarr", tmp_path / "o.zarr"], 2, "does not exist"),
        (["quantize", src, tmp_path / "o.zarr", "--dtype", "int9"], 2, "unknown --dtype 'int9'"),
        (["quantize", src, tmp_path / "o.zarr", "--axis", "7"], 2, "--axis 7 is out of range"),
        (["quantize", src, tmp_path / "o.zarr", "--method", "kl"], 2, "unknown --method 'kl'"),
        (["quantize", src, tmp_path / "o.zarr", "--scale", "0"], 2, "scale must be finite"),
        (["quantize", src, tmp_path / "o.zarr", "--max-memory", "lots"], 2, "not a size"),
        (["dequantize", src, tmp_path / "o2.zarr"], 2, "not a qstream quantized array"),
        (["inspect", src], 1, "not a qstream quantized array"),
        (["inspect", tmp_path / "nothing.zarr"], 2, "does not exist"),
        (["convert", tmp_path / "none.safetensors", tmp_path / "c.zarr"], 2, "none.safetensors"),
        (["dequantize", tmp_path / "none.zarr", tmp_path / "d.zarr"], 2, "does not exist"),
        (["export", tmp_path / "none.zarr", tmp_path / "e.safetensors"], 2, "does not exist"),
        (["calibrate", tmp_path / "none.zarr"], 2, "does not exist"),
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
    r = run("dequantize", tmp_path / "q2.zarr", tmp_path / "d.zarr")  # refused in its plan
    assert r.exit_code == 2 and "incomplete" in r.output


def test_unwritable_destination(src, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    r = run("quantize", src, blocker / "q.zarr")
    assert r.exit_code == 2, r.output  # (refused by its plan, before any work)
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
    r = run("convert", ckpt, dst, "--recipe", SAMPLES / "recipe-int8.toml")  # finished: no-op
    assert r.exit_code == 0
    assert r.output.strip() == f"{dst}: already complete (same job); nothing to do"
    bad = tmp_path / "bad.safetensors"
    raw = ckpt.read_bytes()
    bad.write_bytes(raw[:8] + b"{garbage" + raw[16:4096])
    r = run("convert", bad, tmp_path / "bad.zarr")
    assert r.exit_code == 2 and "bad.safetensors" in r.output and "Traceback" not in r.output
    bad_recipe = tmp_path / "r.toml"
    bad_recipe.write_text("[defaults]\ndtype = 'int9'\n")
    r = run("convert", ckpt, tmp_path / "x.zarr", "--recipe", bad_recipe)
    assert r.exit_code == 2 and "int9" in r.output


def test_help_is_fast_and_does_not_import_numba():
    code = (
        "import sys, time; t = time.perf_counter(); from cli.main import app;"
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


# --------------------------------------------------------------------------- CLI polish


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["quantize", "a.zarr", "b.zarr", "--axis", "foo"],
            "error: invalid value for '--axis': not an integer (see 'qstream quantize --help')",
        ),
        (
            ["quantize", "a.zarr"],
            "error: missing argument 'DST' (see 'qstream quantize --help')",
        ),
        (
            ["quantize", "a.zarr", "b.zarr", "--bogus"],
            "error: no such option: --bogus (see 'qstream quantize --help')",
        ),
        (["frobnicate"], "error: no such command 'frobnicate' (see 'qstream --help')"),
        (
            ["calibrate", "a.zarr", "--percentile", "x"],
            "error: invalid value for '--percentile': not a number"
            " (see 'qstream calibrate --help')",
        ),
    ],
)
def test_usage_errors_are_one_line_with_a_hint_and_exit_2(args, message):
    r = run(*args)
    assert r.exit_code == 2
    assert r.stderr.splitlines() == [message]
    assert r.stdout == ""


@pytest.mark.parametrize(
    "args",
    [
        *[[name, "--help"] for name in ("quantize", "dequantize", "calibrate", "inspect")],
        *[[name, "--help"] for name in ("convert", "export", "warm-up", "info", "version")],
        ["--debug", "convert", "--help"],
        ["convert", "a.safetensors"],
        ["convert", "a.safetensors", "b.zarr", "--bogus"],
        ["quantize", "a.zarr", "b.zarr", "--axis", "x"],
        ["calibrate", "a.zarr", "--percentile", "x"],
        ["export", "--dtype", "convert"],
        ["frobnicate", "convert"],
        ["--", "convert"],
        ["--help"],
        [],
    ],
)
def test_the_app_for_a_command_line_says_what_the_whole_app_says(args):
    from cli.main import app_for, command_name

    lean = app_for(args)
    word = next((a for a in args if not a.startswith("-")), None)
    named = word in {command_name(c) for c in COMMANDS} and "--" not in args
    assert (lean is app) != named  # (a command alone only when the line names one)
    whole, alone = runner.invoke(app, args), runner.invoke(lean, args)
    assert (alone.exit_code, alone.stdout, alone.stderr) == (
        whole.exit_code,
        whole.stdout,
        whole.stderr,
    )


def test_version_flag_and_debug_anywhere_on_the_line(src, tmp_path):
    r = run("--version")
    assert r.exit_code == 0 and r.stdout.strip() == "qstream 0.1.0"
    r = run("quantize", src, tmp_path / "o.zarr", "--axis", "9", "--debug")
    assert r.exit_code == 2
    assert "Traceback" in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("error: --axis 9 is out of range")
    r = run("--debug", "quantize", src, tmp_path / "o.zarr", "--axis", "9")
    assert r.exit_code == 2 and "Traceback" in r.stderr


def test_library_errors_name_the_flags_and_plain_values(src, tmp_path):
    assert run("quantize", src, tmp_path / "q.zarr", "-q").exit_code == 0
    cases = [
        (
            ["quantize", src, tmp_path / "q.zarr", "--axis", "0", "--resume"],
            2,
            "pass --overwrite to replace it",
        ),
        (
            ["quantize", src, tmp_path / "o.zarr", "--block-size", "4"],
            2,
            "error: --block-size needs an axis",
        ),
        (
            ["quantize", src, tmp_path / "o.zarr", "--method", "dynamic"],
            2,
            "error: --method dynamic needs --block-size (one range per block)",
        ),
        (
            ["quantize", src, tmp_path / "o.zarr", "--scale", "0"],
            2,
            "error: --scale must be finite and > 0, got zero value 0.0 (1 bad of 1)",
        ),
        (
            ["quantize", src, tmp_path / "o.zarr", "--zero-point", "3"],
            2,
            "error: --zero-point needs --scale",
        ),
    ]
    for args, code, text in cases:
        r = run(*args)
        assert r.exit_code == code, (args, r.output)
        assert len(r.stderr.splitlines()) == 1 and text in r.stderr, (args, r.stderr)
        assert "np.float64" not in r.stderr and "overwrite=True" not in r.stderr
    x = np.ones((8, 8), np.float32)
    x[1, 2] = np.inf
    zarr.create_array(str(tmp_path / "inf.zarr"), shape=x.shape, dtype="float32")[...] = x
    r = run("quantize", tmp_path / "inf.zarr", tmp_path / "i.zarr")
    assert r.exit_code == 1
    assert "Use --nan-policy zero_point or --nan-policy min" in r.stderr


def test_checkpoints_and_folders_given_to_quantize_say_what_they_are(tmp_path):
    np.save(tmp_path / "w.npy", np.ones((4, 4), np.float32))
    cases = [
        (tmp_path / "w.npy", "is a NumPy .npy file, not a Zarr array"),
        (SAMPLES / "tiny-transformer.safetensors", "is a safetensors checkpoint, not a Zarr array"),
        (SAMPLES, "is a folder of safetensors files, not a Zarr array"),
    ]
    for path, what in cases:
        r = run("quantize", path, tmp_path / "o.zarr")
        assert r.exit_code == 2  # (refused by its plan, before any work)
        assert r.stderr.strip() == (
            f"error: {path} {what}; checkpoints are read by `qstream convert`"
        )
        assert "StorePath" not in r.stderr and not (tmp_path / "o.zarr").exists()


def test_help_reads_like_a_cli_with_examples_defaults_and_choices():
    r = run("quantize", "--help")
    assert r.exit_code == 0
    text = r.stdout
    assert "Usage: qstream quantize [OPTIONS] SRC DST" in text
    assert "<bool>" not in text and "<str>" not in text and "{src}" not in text
    assert "Examples:" in text and "qstream quantize weights.zarr q.zarr --axis 0" in text
    assert "[default: int8]" in text and "float8_e4m3fn" in text
    assert "entropy" in text and "half_away_from_zero" in text
    for cmd in ("dequantize", "calibrate", "inspect", "convert", "export"):
        r = run(cmd, "--help")
        assert r.exit_code == 0 and "Examples:" in r.stdout and f"qstream {cmd} " in r.stdout


def test_rerun_of_finished_job_says_already_complete_in_text_and_json(src, tmp_path):
    dst = tmp_path / "q.zarr"
    assert run("quantize", src, dst, "--axis", "0", "-q").exit_code == 0
    r = run("quantize", src, dst, "--axis", "0")
    assert r.exit_code == 0
    assert r.stdout.strip() == f"{dst}: already complete (same job); nothing to do"
    r = run("quantize", src, dst, "--axis", "0", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["already_complete"] is True


def test_progress_names_each_pass_with_known_totals(src, tmp_path):
    r = run(
        "quantize", src, tmp_path / "q.zarr", "--axis", "0", "--method", "percentile",
        "--max-memory", "1MiB",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    lines = r.stderr.splitlines()
    n = int(lines[0].split("/")[1].split()[0])
    assert n > 1 and lines[0] == f"quantize: ranges: 0/{n} blocks (0%)"
    assert f"quantize: ranges: {n}/{n} blocks (100%)" in lines
    assert any(ln.startswith("quantize: histograms") and f"{n}/{n} blocks" in ln for ln in lines)
    assert f"quantize: {n}/{n} blocks (100%)" in lines
    assert not any("None" in ln for ln in lines)


def test_non_tty_summary_is_one_line_per_tensor(tmp_path):
    r = run("convert", SAMPLES / "tiny-transformer.safetensors", tmp_path / "t.zarr")
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    table = lines[lines.index("quantized tensors, worst SQNR first") + 2 :]
    rows = [ln for ln in table if ln.split() and ln.split()[0].endswith(".weight")]
    assert len(rows) == 25
    for ln in rows:
        _name, shape0, _shape1, target, sqnr, *_ = ln.split()
        assert shape0.startswith("[") and target.startswith("int8/") and float(sqnr) > 20


def test_json_is_strict_with_null_for_non_finite_numbers(tmp_path):
    x = (np.arange(64, dtype=np.float32).reshape(8, 8) - 32) * 0.5  # exactly representable
    zarr.create_array(str(tmp_path / "x.zarr"), shape=x.shape, dtype="float32")[...] = x
    r = run("quantize", tmp_path / "x.zarr", tmp_path / "q.zarr", "--scale", "0.5", "--json")
    assert r.exit_code == 0, r.output

    def refuse(token):
        raise AssertionError(f"non-standard JSON constant {token}")

    report = json.loads(r.stdout, parse_constant=refuse)
    assert report["error"]["sqnr_db"] is None and report["error"]["mse"] == 0.0

    def values(v):
        if isinstance(v, dict):
            for x in v.values():
                yield from values(x)
        elif isinstance(v, list):
            for x in v:
                yield from values(x)
        else:
            yield v

    assert not {"inf", "-inf", "nan"} & {v for v in values(report) if isinstance(v, str)}
    r = run("inspect", tmp_path / "q.zarr", "--json")
    assert json.loads(r.stdout, parse_constant=refuse)["error"]["sqnr_db"] is None


def test_convert_to_zip_is_refused_up_front_and_writes_nothing(tmp_path):
    np.savez(tmp_path / "ck.npz", w=np.ones((8, 8), np.float32))
    r = run("convert", tmp_path / "ck.npz", tmp_path / "ck.zip")
    assert r.exit_code == 2
    assert r.stderr.startswith("error: cannot convert into") and "not a .zip" in r.stderr
    assert not (tmp_path / "ck.zip").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck.npz"]


def _nightly(tmp_path, *args, path=None):
    env = {**os.environ}
    if path is not None:
        env["PATH"] = path
    return subprocess.run(
        ["bash", str(SAMPLES / "nightly-convert.sh"), *map(str, args)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )


def test_nightly_script_keeps_the_last_good_report_and_says_when_to_resume(tmp_path):
    if shutil.which("qstream") is None:
        pytest.skip("qstream console script not on PATH")
    ckpt = SAMPLES / "tiny-transformer.safetensors"
    r = _nightly(tmp_path)
    assert r.returncode == 2 and r.stderr.startswith("usage:")
    out = tmp_path / "out.zarr"
    r = _nightly(tmp_path, ckpt, out)
    assert r.returncode == 0, r.stderr
    report = tmp_path / "out.zarr.report.json"
    good = report.read_bytes()
    assert json.loads(good)["tensors"]
    r = _nightly(tmp_path, ckpt, out, tmp_path / "missing.toml")  # a failing run
    assert r.returncode == 2 and report.read_bytes() == good
    r = _nightly(tmp_path, tmp_path / "nothing.safetensors", out)
    assert r.returncode == 2 and "checkpoint not found" in r.stderr
    assert "resume" not in r.stderr and report.read_bytes() == good
    r = _nightly(tmp_path, ckpt, out, path="/usr/bin:/bin")
    assert r.returncode == 1 and "not on PATH" in r.stderr and "resume" not in r.stderr
    assert not list(tmp_path.glob("*.partial*"))


def test_first_run_says_it_is_compiling_kernels_and_later_runs_do_not(src, tmp_path):
    # (QSTREAM_NUMPY_JOB=0: Numba's kernels, which a small array's job would not load)
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache"), "QSTREAM_NUMPY_JOB": "0"}
    command = [sys.executable, "-m", "cli.main", "quantize", str(src)]
    first = subprocess.run(
        [*command, str(tmp_path / "a.zarr")], capture_output=True, text=True, env=env
    )
    assert first.returncode == 0, first.stderr
    assert "compiling kernels (first run only" in first.stderr
    again = subprocess.run(
        [*command, str(tmp_path / "b.zarr")], capture_output=True, text=True, env=env
    )
    assert again.returncode == 0 and "compiling" not in again.stderr


def test_inspect_and_json_show_nan_and_infinity_counts_apart(tmp_path):
    x = np.random.default_rng(3).standard_normal((16, 64)).astype(np.float32)
    x[1, 2] = np.nan
    x[3, 4] = np.inf
    x[5, 6] = x[7, 8] = -np.inf
    zarr.create_array(str(tmp_path / "x.zarr"), shape=x.shape, dtype="float32")[...] = x
    r = run(
        "quantize", tmp_path / "x.zarr", tmp_path / "q.zarr", "--axis", "0",
        "--nan-policy", "zero_point", "--json",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    e = json.loads(r.stdout)["error"]
    assert (e["nonfinite"], e["nan"], e["posinf"], e["neginf"]) == (4, 1, 1, 2)
    r = run("inspect", tmp_path / "q.zarr")
    rows = dict(ln.split(None, 1) for ln in r.stdout.splitlines() if len(ln.split()) == 2)
    assert (rows["nan"], rows["posinf"], rows["neginf"]) == ("1", "1", "2")


def test_float16_scales_from_the_command_line_are_stored_and_exported_as_float16(src, tmp_path):
    from safetensors.numpy import load_file

    q = tmp_path / "q.zarr"
    r = run(
        "quantize", src, q, "--dtype", "int4", "--axis", "1", "--block-size", "32",
        "--method", "dynamic", "--scale-dtype", "float16", "--json",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["spec"]["scale_dtype"] == "float16"
    assert zarr.open_group(str(q))["scale"].dtype == np.float16
    assert run("export", q, tmp_path / "w.safetensors", "--format", "qstream", "-q").exit_code == 0
    tensors = load_file(str(tmp_path / "w.safetensors"))
    assert tensors["weight_scale"].dtype == np.float16
    np.testing.assert_array_equal(
        tensors["weight_scale"].astype(np.float32), qstream_scale(q).reshape(64, -1)
    )
    r = run("quantize", src, tmp_path / "b.zarr", "--scale-dtype", "bf16")
    assert r.exit_code == 2
    assert r.stderr.strip() == (
        "error: unknown --scale-dtype 'bf16' (did you mean 'bfloat16'?); expected one of:"
        " float32, float16, bfloat16, source"
    )


def qstream_scale(path):
    import qstream

    return qstream.open_quantized(path).scale


def test_rerun_of_a_finished_safetensors_conversion_says_already_complete(tmp_path):
    ckpt = SAMPLES / "tiny-transformer.safetensors"
    out = tmp_path / "t.safetensors"
    first = run("convert", ckpt, out, "-q", "--json")
    assert first.exit_code == 0
    before = out.read_bytes()
    r = run("convert", ckpt, out)
    assert r.exit_code == 0
    assert r.stdout.strip() == f"{out}: already complete (same job); nothing to do"
    r = run("convert", ckpt, out, "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["already_complete"] is True
    # the same tensors, sizes and worst tensor as the run that made it (SQNR as the export
    # recorded it, to 0.01 dB)
    made, found = json.loads(first.stdout), json.loads(r.stdout)
    assert set(found["tensors"]) == set(made["tensors"])
    for name, row in made["tensors"].items():
        got = found["tensors"][name]
        assert (got["kept"], got["bytes_before"], got["bytes_after"]) == (
            row["kept"], row["bytes_before"], row["bytes_after"]
        )  # fmt: skip
        if not row["kept"]:
            assert got["error"]["sqnr_db"] == round(row["error"]["sqnr_db"], 2)
    want = {k: v for k, v in made["summary"].items() if k not in ("seconds", "resumed")}
    want |= {"already_complete": True, "worst_sqnr_db": round(want["worst_sqnr_db"], 2)}
    assert {k: v for k, v in found["summary"].items() if k != "seconds"} == want
    r = run("convert", ckpt, out, "--recipe", SAMPLES / "recipe-int8.toml")  # another job
    assert r.exit_code == 2  # (refused by the plan, before any work)
    assert r.stderr.strip() == (
        f"error: {out} holds another export (of another source, spec or format);"
        " pass --overwrite to replace it"
    )
    assert out.read_bytes() == before


def test_a_destination_held_by_another_process_exits_75_and_the_nightly_script_says_retry(
    tmp_path,
):
    """Another qstream process holding DST is not a failure (exit 75, EX_TEMPFAIL): nothing
    is done, and a scheduler retries. The holder is a real second process holding DST's
    lock."""
    ckpt = ROOT / "samples" / "tiny-transformer.safetensors"
    out = tmp_path / "out.zarr"
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time\nfrom qstream.io.outputs.destination import locked\n"
         f"with locked({str(out)!r}):\n    print('held', flush=True)\n    time.sleep(120)\n"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        before = sorted(p.name for p in out.iterdir())
        r = subprocess.run(
            [sys.executable, "-m", "cli.main", "convert", str(ckpt), str(out), "-q"],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert r.returncode == 75, r.stderr
        assert "being written by another qstream process" in r.stderr
        assert sorted(p.name for p in out.iterdir()) == before  # nothing done
        if shutil.which("qstream") is not None:
            r = _nightly(tmp_path, ckpt, out)
            assert r.returncode == 75, r.stderr
            assert "another qstream process" in r.stderr and "retry later" in r.stderr
    finally:
        holder.kill()
        holder.wait()
    r = runner.invoke(app, ["convert", str(ckpt), str(out), "-q"])  # then it runs
    assert r.exit_code == 0, r.output
