"""A newcomer's first week: each friction found, with the exact command, exit code and
message (issue "The first week with qstream")."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file
from typer.testing import CliRunner

import qstream as qs
from cli.main import app

from ..support.memory_peak import HWM

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def cli(*args, cwd, **kw) -> subprocess.Popen | subprocess.CompletedProcess:
    """``qstream ARGS`` in a fresh process, as a shell runs it (signals, pipes, warnings)."""
    cmd = [sys.executable, "-c", "from cli.main import main; main()", *map(str, args)]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300, **kw)


@pytest.fixture
def ck(tmp_path) -> Path:
    """A small checkpoint with Hugging Face names."""
    rng = np.random.default_rng(0)
    tensors = {
        "model.embed_tokens.weight": rng.standard_normal((64, 32)).astype(np.float32),
        "model.layers.0.self_attn.q_proj.weight": rng.standard_normal((32, 64)).astype(np.float32),
        "model.layers.0.mlp.up_proj.weight": rng.standard_normal((64, 64)).astype(np.float32),
        "model.layers.0.input_layernorm.weight": rng.standard_normal(32).astype(np.float32),
        "lm_head.weight": rng.standard_normal((64, 32)).astype(np.float32),
    }
    save_file(tensors, str(tmp_path / "model.safetensors"))
    return tmp_path / "model.safetensors"


def test_every_install_hint_names_this_project():
    name = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["name"]
    assert name != "qstream"  # on the public index that is an unrelated project
    hint = re.compile(r"pip install\s+(?:-e\s+)?'?([A-Za-z0-9_.\-]+)(\[[a-z0-9,]+\])?'?")
    seen = 0
    files = [ROOT / "README.md", *ROOT.glob("samples/*"), *ROOT.glob("qstream/**/*.py")]
    for f in files:
        if f.suffix not in (".py", ".md", ".sh", ".toml") or not f.is_file():
            continue
        for m in hint.finditer(f.read_text()):
            what = m.group(1)
            if not what.lower().startswith("qstream"):  # another project's package (zarr, gguf)
                continue
            seen += 1
            assert what == name, f"{f.name}: {m.group(0)!r} names {what!r}, not {name!r}"
    assert seen >= 5  # the hints were found


def test_dequantize_writes_safetensors_files_and_reruns_as_complete(ck, tmp_path):
    assert run("convert", ck, tmp_path / "q.zarr", "-q").exit_code == 0
    out = tmp_path / "restored.safetensors"
    r = run("dequantize", tmp_path / "q.zarr", out)
    assert r.exit_code == 0, r.output
    assert out.is_file()  # a file, not a directory of that name
    values = load_file(str(out))
    root = qs.open_quantized(tmp_path / "q.zarr")
    for name in root:
        np.testing.assert_array_equal(values[name], root[name][...])
    again = run("dequantize", tmp_path / "q.zarr", out)
    assert again.exit_code == 0 and "already complete" in again.output
    half = qs.dequantize_store(tmp_path / "q.zarr", tmp_path / "h.safetensors", dtype="float16")
    assert load_file(half["files"][0])["lm_head.weight"].dtype == np.float16


@pytest.mark.parametrize(
    "args,named",
    [
        (("convert", "{ck}", "{tmp}/out.bin"), "a conversion cannot write"),
        (("quantize", "{tmp}/q.zarr/lm_head.weight/data", "{tmp}/x.safetensors"), "a quantization"),
        (("dequantize", "{tmp}/q.zarr", "{tmp}/x.npz"), "a dequantization cannot write"),
    ],
)
def test_unknown_destination_suffixes_are_refused_before_anything_is_written(
    ck, tmp_path, args, named
):
    assert run("convert", ck, tmp_path / "q.zarr", "-q").exit_code == 0
    before = sorted(os.listdir(tmp_path))
    r = run(*(a.format(ck=ck, tmp=tmp_path) for a in args))
    assert r.exit_code == 2 and named in r.output, r.output
    assert sorted(os.listdir(tmp_path)) == before


def test_convert_summary_reports_the_files_entries_and_their_sizes_and_export_reruns_are_no_ops(
    ck, tmp_path
):
    (tmp_path / "o").mkdir()
    r = run("convert", ck, tmp_path / "o" / "model.safetensors", "--json")
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    on_disk = sum(os.path.getsize(f) for f in report["files"])
    assert report["file_bytes"] == on_disk  # (the files: entries, headers, config.json)
    shown = json.loads(run("inspect", tmp_path / "o" / "model.safetensors", "--json").stdout)
    assert report["bytes_after"] == shown["bytes"] < on_disk  # ("after": the entries)
    assert run("convert", ck, tmp_path / "q.zarr", "-q").exit_code == 0
    (tmp_path / "e").mkdir()
    first = run("export", tmp_path / "q.zarr", tmp_path / "e" / "model.safetensors")
    again = run("export", tmp_path / "q.zarr", tmp_path / "e" / "model.safetensors")
    assert first.exit_code == 0 and again.exit_code == 0, again.output
    assert "already complete" in again.output


def test_the_sample_recipe_matches_hugging_face_names(ck):
    recipe = qs.Recipe.load(ROOT / "samples" / "recipe-int8.toml")
    tensors = qs.plan_conversion  # (imported for the API check below)
    assert callable(tensors)
    from qstream.io.checkpoints.open import open_checkpoint

    opened = open_checkpoint(ck)
    warnings = recipe.check(opened)
    assert not [w for w in warnings if "embed" in w], warnings
    spec = recipe.spec_for("model.embed_tokens.weight", (64, 32), np.float32)
    assert spec is not None and spec.method == "percentile"


def test_an_include_that_matches_nothing_is_refused_before_anything_is_written(ck, tmp_path):
    r = cli("convert", ck, "out.zarr", "--include", "nomatch*", "-q", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert "include pattern 'nomatch*' matches no tensor" in r.stderr
    assert "nothing would be quantized" in r.stderr
    assert not (tmp_path / "out.zarr").exists()


def test_a_rule_that_matches_nothing_is_warned_about(ck, tmp_path):
    (tmp_path / "r.toml").write_text('[[rules]]\npattern = "embed_tokens.*"\naction = "keep"\n')
    r = cli("convert", ck, "out.zarr", "--recipe", "r.toml", "-q", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stderr.strip() == (
        "warning: recipe rule 1 ('embed_tokens.*') matches no tensor of the checkpoint (names"
        " look like 'model.embed_tokens.weight')"
    )


def test_a_recipe_error_names_rule_and_tensor_and_leaves_nothing_behind(ck, tmp_path):
    (tmp_path / "r.toml").write_text(
        '[[rules]]\npattern = "*q_proj*"\nspec = { axis = 2, block_size = 32 }\n'
    )
    r = run("convert", ck, tmp_path / "out", "--recipe", tmp_path / "r.toml")
    assert r.exit_code == 2
    assert r.output.strip() == (
        "error: recipe rule 1 ('*q_proj*') on tensor model.layers.0.self_attn.q_proj.weight"
        " (shape [32, 64]): axis 2 is out of range for an array of rank 2 (valid: -2..1);"
        " give that tensor its own rule (a spec with another axis, or keep)"
    )
    assert not (tmp_path / "out").exists()
    (tmp_path / "r.toml").write_text(
        '[[rules]]\npattern = "*q_proj*"\nspec = { axis = 1, block_size = 32 }\n'
    )
    fixed = run("convert", ck, tmp_path / "out", "--recipe", tmp_path / "r.toml", "-q")
    assert fixed.exit_code == 0, fixed.output  # the corrected re-run is not blocked
    r = run("convert", ck, tmp_path / "o2", "--recipe", tmp_path / "r.toml", "--dtype", "int4")
    assert r.exit_code == 2 and "--recipe and the spec flags (--dtype) do not mix" in r.output


def test_convert_flags_give_what_the_same_recipe_gives(ck, tmp_path):
    r = run(
        "convert", ck, tmp_path / "a", "--dtype", "int4", "--block-size", "32",
        "--exclude", "lm_head*", "--include", "*proj*", "-q",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    recipe = qs.Recipe.from_dict({
        "defaults": {"dtype": "int4", "axis": -1, "block_size": 32, "method": "dynamic"},
        "rules": [{"pattern": "lm_head*", "action": "keep"}],
        "include": ["*proj*"],
    })  # fmt: skip
    qs.convert_checkpoint(ck, tmp_path / "b", recipe)
    a, b = qs.open_quantized(tmp_path / "a"), qs.open_quantized(tmp_path / "b")
    assert list(a) == list(b)
    kinds = {n: isinstance(a[n], qs.QuantizedArray) for n in a}
    assert kinds == {
        "model.embed_tokens.weight": False,
        "model.layers.0.self_attn.q_proj.weight": True,
        "model.layers.0.mlp.up_proj.weight": True,
        "model.layers.0.input_layernorm.weight": False,
        "lm_head.weight": False,
    }
    for n in a:
        np.testing.assert_array_equal(a[n][...], b[n][...])


def test_dry_run_prints_the_plan_and_writes_nothing(ck, tmp_path):
    r = run("convert", ck, tmp_path / "out", "--dtype", "int4", "--block-size", "32", "--dry-run")
    assert r.exit_code == 0, r.output
    assert "model.layers.0.mlp.up_proj.weight" in r.output and "int4/axis-1:b32/dynamic" in r.output
    assert "4 quantized, 1 kept" in r.output
    assert not (tmp_path / "out").exists()
    r = run("convert", ck, tmp_path / "out", "--dry-run", "--json")
    plan = json.loads(r.stdout)["plan"]
    up = next(p for p in plan if p["name"] == "model.layers.0.mlp.up_proj.weight")
    assert up["bytes_before"] == 64 * 64 * 4 and up["bytes_after"] == 64 * 64 + 64 * 4
    assert not (tmp_path / "out").exists()


def test_sigterm_stops_like_ctrl_c_with_exit_143_and_the_rerun_resumes(tmp_path):
    rng = np.random.default_rng(1)
    tensors = {f"t{i:03d}.weight": rng.standard_normal((512, 1024)).astype(np.float32)
               for i in range(48)}  # fmt: skip
    save_file(tensors, str(tmp_path / "big.safetensors"))
    cmd = [sys.executable, "-c", "from cli.main import main; main()", "convert",
           "big.safetensors", "out.zarr", "--recipe", "r.toml", "-q"]  # fmt: skip
    (tmp_path / "r.toml").write_text('[defaults]\ndtype = "int8"\naxis = 0\nmethod = "mse"\n')
    p = subprocess.Popen(
        cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.time() + 120
    while time.time() < deadline and not (tmp_path / "out.zarr" / "t000.weight").exists():
        time.sleep(0.05)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=120)
    if p.returncode == 0:
        pytest.skip("the conversion finished before SIGTERM arrived")
    assert p.returncode == 143, err
    assert err.strip() == "error: terminated (SIGTERM); run the same command again to resume"
    again = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    qs.convert_checkpoint(tmp_path / "big.safetensors", tmp_path / "ref.zarr",
                          qs.Recipe.load(tmp_path / "r.toml"))  # fmt: skip
    a, b = qs.open_quantized(tmp_path / "out.zarr"), qs.open_quantized(tmp_path / "ref.zarr")
    for n in ("t000.weight", "t047.weight"):
        np.testing.assert_array_equal(a[n].quantized(...), b[n].quantized(...))


def test_a_closed_pipe_ends_quietly(tmp_path):
    rng = np.random.default_rng(2)
    save_file({f"layer.{i}.weight": rng.standard_normal((2, 16)).astype(np.float32)
               for i in range(1500)}, str(tmp_path / "m.safetensors"))  # fmt: skip
    assert cli("convert", "m.safetensors", "q.zarr", "-q", cwd=tmp_path).returncode == 0
    p = subprocess.Popen(
        [sys.executable, "-c", "from cli.main import main; main()", "inspect", "q.zarr"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    p.stdout.readline()
    p.stdout.close()  # `| head -1`
    err = p.stderr.read().decode()
    p.wait(timeout=120)
    assert err == "" and p.returncode in (0, 141), (p.returncode, err)


@pytest.mark.parametrize(
    "args,message",
    [
        (("--scale", "0.1", "--method", "entropy"), "an explicit scale skips calibration"),
        (("--percentile", "99.9", "--method", "entropy"), "--percentile 99.9 applies to"),
        (("--dtype", "float8_e4m3fn", "--asymmetric"), "float8_e4m3fn has no zero point"),
    ],
)
def test_conflicting_options_are_refused_in_one_line(tmp_path, args, message):
    import zarr

    z = zarr.create_array(str(tmp_path / "s.zarr"), shape=(8, 8), dtype="f4")
    z[...] = 1
    r = run("quantize", tmp_path / "s.zarr", tmp_path / "q.zarr", *args)
    assert r.exit_code == 2 and message in r.output and len(r.output.strip().splitlines()) == 1
    assert not (tmp_path / "q.zarr").exists()


@pytest.mark.parametrize(
    "dst,args,message",
    [
        ("y.safetensors", ("--gguf-type", "Q4_0"), "--gguf-type applies to a .gguf DST only"),
        ("y.gguf", ("--format", "qstream"), "--format applies to a .safetensors DST"),
        ("y.zarr", ("--format", "qstream"), "--format and --config apply to a .safetensors"),
    ],
)
def test_convert_options_for_another_kind_of_destination_are_refused(ck, tmp_path, dst, args,
                                                                    message):  # fmt: skip
    r = run("convert", ck, tmp_path / dst, *args)
    assert r.exit_code == 2 and message in r.output, r.output
    assert not (tmp_path / dst).exists()


def test_max_memory_above_the_machine_is_capped_with_a_warning(ck, tmp_path):
    r = cli("convert", ck, "out.zarr", "--max-memory", "1000TB", "-q", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stderr.startswith("warning: --max-memory 1000TB is more than this machine's memory")


def _nightly(tmp_path, *args, env=None, wait=True):
    cmd = ["bash", str(ROOT / "samples" / "nightly-convert.sh"), *map(str, args)]
    kw = {"cwd": tmp_path, "env": {**os.environ, **(env or {})}, "text": True}
    if not wait:
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)
    return subprocess.run(cmd, capture_output=True, timeout=300, **kw)


@pytest.fixture
def slow_ck(tmp_path) -> Path:
    """A checkpoint whose conversion (mse search) runs for a few seconds."""
    rng = np.random.default_rng(1)
    save_file({f"t{i:03d}.weight": rng.standard_normal((512, 1024)).astype(np.float32)
               for i in range(96)}, str(tmp_path / "big.safetensors"))  # fmt: skip
    (tmp_path / "r.toml").write_text('[defaults]\ndtype = "int8"\naxis = 0\nmethod = "mse"\n')
    return tmp_path / "big.safetensors"


def test_nightly_script_tells_converted_from_already_complete_and_keeps_the_report(tmp_path):
    import shutil

    if shutil.which("qstream") is None:
        pytest.skip("qstream console script not on PATH")
    ckpt = ROOT / "samples" / "tiny-transformer.safetensors"
    r = _nightly(tmp_path, ckpt, tmp_path / "out.zarr")
    assert r.returncode == 0 and "nightly-convert: converted" in r.stderr, r.stderr
    report = (tmp_path / "out.zarr.report.json").read_bytes()
    r = _nightly(tmp_path, ckpt, tmp_path / "out.zarr")
    assert r.returncode == 0 and "already complete; nothing converted" in r.stderr, r.stderr
    assert (tmp_path / "out.zarr.report.json").read_bytes() == report  # the real one kept


def test_nightly_script_logs_sigterm_and_timeouts_and_resumes(tmp_path, slow_ck):
    import shutil

    if shutil.which("qstream") is None:
        pytest.skip("qstream console script not on PATH")
    out = tmp_path / "out.zarr"
    r = _nightly(tmp_path, slow_ck, out, tmp_path / "r.toml", env={"QSTREAM_TIMEOUT": "2"})
    if r.returncode == 0:
        pytest.skip("the conversion finished within the timeout")
    assert r.returncode == 124 and "timed out after 2 (exit 124); re-run to resume" in r.stderr
    p = _nightly(tmp_path, slow_ck, out, tmp_path / "r.toml", wait=False)
    time.sleep(3)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=120)
    assert p.returncode in (0, 143), err
    if p.returncode == 143:
        assert "SIGTERM received: stopping the conversion (re-run to resume)" in err
    r = _nightly(tmp_path, slow_ck, out, tmp_path / "r.toml")
    assert r.returncode == 0 and json.loads((tmp_path / "out.zarr.report.json").read_text())
    assert not list(tmp_path.glob("*.partial*"))


def test_calibrate_looks_at_one_tensor_of_a_checkpoint(ck, tmp_path):
    name = "model.layers.0.mlp.up_proj.weight"
    r = run("calibrate", ck, "--tensor", name, "--axis", "0", "--json")
    assert r.exit_code == 0, r.output
    cal = json.loads(r.stdout)
    x = load_file(str(ck))[name]
    want = qs.calibrate(x, qs.QuantSpec(axis=0))
    np.testing.assert_array_equal(np.asarray(cal["params"]["scale"], np.float32), want.scale)
    r = run("calibrate", ck, "--tensor", "model.layers.0.mlp.up_proj.weigh")
    assert r.exit_code == 2
    assert "did you mean model.layers.0.mlp.up_proj.weight" in r.output


def test_kept_bfloat16_tensors_stay_bfloat16_and_plain_zarr_reads_them(tmp_path):
    ck = ROOT / "samples" / "tiny-transformer.safetensors"
    recipe = qs.Recipe.from_dict({"rules": [{"pattern": "*", "action": "keep"}]})
    qs.convert_checkpoint(ck, tmp_path / "k", recipe)
    name = "layers.0.mlp.up_proj.weight"
    meta = json.loads((tmp_path / "k" / name / "zarr.json").read_text())
    assert meta["data_type"] == "bfloat16"  # 2 bytes a value, not widened to float32
    code = (
        "import json, sys, zarr, qstream; qstream.register_zarr_types();"
        f" a = zarr.open_array({str(tmp_path / 'k' / name)!r});"
        " print(a.dtype, a[...].view('uint16').sum())"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    import ml_dtypes  # noqa: F401  (safetensors' numpy reader cannot load bf16: torch)

    torch = pytest.importorskip("torch")  # (not in the 3.12 leg's test extras)
    from safetensors.torch import load_file as load_torch

    want = load_torch(str(ck))[name].view(torch.int16).numpy().view(np.uint16)
    assert r.stdout.split() == ["bfloat16", str(int(want.astype(np.uint64).sum()))], r.stderr


def test_dequantize_to_bfloat16_stores_bfloat16_not_its_bits(ck, tmp_path):
    import ml_dtypes
    import zarr

    qs.convert_checkpoint(ck, tmp_path / "q.zarr")
    g = tmp_path / "q.zarr" / "lm_head.weight"
    r = run("dequantize", g, tmp_path / "b.zarr", "--dtype", "bfloat16")
    assert r.exit_code == 0, r.output
    meta = json.loads((tmp_path / "b.zarr" / "zarr.json").read_text())
    assert meta["data_type"] == "bfloat16"
    got = zarr.open_array(str(tmp_path / "b.zarr"))[...]
    assert got.dtype == np.dtype(ml_dtypes.bfloat16)
    want = qs.open_quantized(g)[...].astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


def test_a_keep_all_conversion_does_not_hold_the_checkpoint_in_memory(tmp_path):
    rng = np.random.default_rng(3)
    tensors = {f"w{i}": rng.standard_normal((1024, 4096)).astype(np.float32) for i in range(24)}
    save_file(tensors, str(tmp_path / "big.safetensors"))  # 384 MiB
    del tensors
    # (the child's own peak, VmHWM: ru_maxrss is kept across exec, see tests/support/memory_peak.py)
    code = HWM + (
        "import qstream as qs;"
        " r = qs.Recipe.from_dict({'rules': [{'pattern': '*', 'action': 'keep'}]});"
        " base = vm_hwm();"
        f" qs.convert_checkpoint({str(tmp_path / 'big.safetensors')!r}, {str(tmp_path / 'k')!r},"
        " r, compression='none');"
        " print(base, vm_hwm())"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    base, peak = (int(v) for v in r.stdout.split())
    # file-backed pages of a mapping would count: the whole 384 MiB checkpoint
    assert (peak - base) >> 20 < 200, (base, peak)


def test_the_notebook_sample_runs_without_a_file_as_in_jupyter():
    code = (
        "src = open('samples/notebook.py').read();"
        " exec(compile(src, 'notebook', 'exec'), {'__name__': '__main__'})"
    )  # Jupyter runs cells with no __file__, in the folder it was started in
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "entropy calibration" in r.stdout


def test_inspect_plot_draws_group_wise_outputs_and_whole_checkpoints(ck, tmp_path):
    pytest.importorskip("matplotlib")
    import zarr

    x = np.random.default_rng(4).standard_normal((32, 128)).astype(np.float32)
    zarr.create_array(str(tmp_path / "x.zarr"), shape=x.shape, dtype="f4")[...] = x
    r = run("quantize", tmp_path / "x.zarr", tmp_path / "g.zarr", "--dtype", "int4", "--axis",
            "1", "--block-size", "32", "--method", "dynamic", "-q")  # fmt: skip
    assert r.exit_code == 0, r.output
    r = run("inspect", tmp_path / "g.zarr", "--plot", tmp_path / "g.svg")
    assert r.exit_code == 0, r.output
    svg = (tmp_path / "g.svg").read_text()
    assert "128 groups: their scales" in svg and "worst groups" in svg
    assert run("convert", ck, tmp_path / "q.zarr", "-q").exit_code == 0
    r = run("inspect", tmp_path / "q.zarr", "--plot", tmp_path / "c.svg")
    assert r.exit_code == 0, r.output
    svg = (tmp_path / "c.svg").read_text()
    assert "SQNR per tensor" in svg and "tensors by size (5; 1 kept)" in svg


def test_per_channel_on_a_1d_array_is_warned_about(tmp_path):
    import zarr

    zarr.create_array(str(tmp_path / "v.zarr"), shape=(64,), dtype="f4")[...] = 1.5
    with pytest.warns(qs.QStreamWarning, match="gives every element its own scale"):
        qs.quantize_store(str(tmp_path / "v.zarr"), str(tmp_path / "q.zarr"), qs.QuantSpec(axis=0))
    r = cli("quantize", "v.zarr", "q2.zarr", "--axis", "0", "-q", cwd=tmp_path)
    assert r.returncode == 0 and r.stderr.startswith("warning: per-channel quantization of a 1-D")


def test_a_checkpoint_written_again_in_the_same_process_is_read_anew(tmp_path):
    path = tmp_path / "m.safetensors"
    for value in (1.0, 2.0):  # a notebook writes the file, converts, writes it again
        save_file({"w.weight": np.full((8, 64), value, np.float32)}, str(path))
        qs.convert_checkpoint(path, tmp_path / f"q{value}.zarr")
        got = qs.open_quantized(tmp_path / f"q{value}.zarr")["w.weight"][...]
        assert float(got.max()) == value
