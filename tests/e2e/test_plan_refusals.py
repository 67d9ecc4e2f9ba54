"""Plan, then work (issue 44): every refusal of ``qstream convert`` happens in one plan, before
a tensor byte is read or anything written, and ``--dry-run`` refuses the same way (the same
one line, exit 2). The checkpoints' values are all NaN: a run that read a tensor before
refusing would fail on them instead (the recipe's NaN policy is ``error``)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil

import ml_dtypes
import numpy as np
import pytest
from typer.testing import CliRunner

import qstream as qs
from cli.main import app
from qstream.io.outputs.destination import file_system

from ..support.llama_folder import write_llama

runner = CliRunner()


def snapshot(root: str) -> dict[str, str]:
    """Every entry under ``root`` with a hash of its content (links and folders by kind)."""
    out = {}
    for here, dirs, files in os.walk(root):
        for d in dirs:
            out[os.path.join(here, d)] = "dir"
        for f in files:
            p = os.path.join(here, f)
            if os.path.islink(p) or not os.path.isfile(p):
                out[p] = "other"
            else:
                with open(p, "rb") as fh:
                    out[p] = hashlib.sha256(fh.read()).hexdigest()
    return out


@pytest.fixture(scope="module")
def nan_llama(tmp_path_factory):
    """A Llama-shaped bf16 folder whose every value is NaN."""
    folder = write_llama(str(tmp_path_factory.mktemp("m") / "llama"))
    from safetensors.numpy import load_file, save_file

    path = os.path.join(folder, "model.safetensors")
    tensors = load_file(path)
    save_file({k: np.full(v.shape, np.nan, ml_dtypes.bfloat16) for k, v in tensors.items()}, path)
    return folder


def _quantized_config(folder, method):
    with open(os.path.join(folder, "config.json")) as f:
        cfg = json.load(f)
    cfg["quantization_config"] = {"quant_method": method, "format": "float-quantized"}
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f)


def _edit_config(folder, **fields):
    with open(os.path.join(folder, "config.json")) as f:
        cfg = json.load(f)
    cfg.update(fields)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f)


def _setup_foreign_file(work, name):
    os.makedirs(os.path.dirname(os.path.join(work, name)) or work, exist_ok=True)
    with open(os.path.join(work, name), "w") as f:
        f.write("not qstream's")


INT4 = ["--dtype", "int4", "--block-size", "128"]
NO_EMBED = ["--exclude", "model.embed_tokens*"]

# case -> (how to prepare the sandbox, the command's arguments after CHECKPOINT, the message)
CATALOGUE = {
    "foreign-safetensors-overwrite": (
        lambda w, m: _setup_foreign_file(w, "out/model.safetensors"),
        ["{w}/out/model.safetensors", "--overwrite"],
        "is not a qstream export",
    ),
    "foreign-safetensors": (
        lambda w, m: _setup_foreign_file(w, "out/model.safetensors"),
        ["{w}/out/model.safetensors"],
        "is not a qstream export",
    ),
    "foreign-index": (
        lambda w, m: _setup_foreign_file(w, "out/model.safetensors.index.json"),
        ["{w}/out/model.safetensors"],
        "is not a qstream export",
    ),
    "foreign-config-beside-export": (
        lambda w, m: _setup_foreign_file(w, "out/config.json"),
        ["{w}/out/model.safetensors"],
        "is not a qstream export",
    ),
    "work-folder-holds-something-else": (
        lambda w, m: _setup_foreign_file(w, "out/model.safetensors.qstream-work/x.txt"),
        ["{w}/out/model.safetensors"],
        "holds something else",
    ),
    "safetensors-on-a-store": (
        None,
        ["s3://bucket/out/model.safetensors"],
        "written to a local path",
    ),
    "gguf-on-a-store": (None, ["s3://bucket/out/model.gguf"], "written to a local path"),
    "4-bit-embedding": (None, ["{w}/out/model.safetensors", *INT4], "4-bit embedding"),
    "groups-that-do-not-divide": (
        None,
        ["{w}/out/model.safetensors", *INT4, *NO_EMBED],
        "do not divide 704 columns",
    ),
    "gguf-blocks-of-128": (None, ["{w}/x.gguf", "--block-size", "128"], "has no GGUF type"),
    "gguf-asymmetric-8-bit": (
        None,
        ["{w}/x.gguf", "--dtype", "uint8", "--asymmetric"],
        "has no GGUF type",
    ),
    "gguf-foreign-file": (
        lambda w, m: _setup_foreign_file(w, "x.gguf"),
        ["{w}/x.gguf", "--overwrite"],
        "is not a qstream export",
    ),
    "quantized-source-zarr": (
        lambda w, m: _quantized_config(m, "bitsandbytes"),
        ["{w}/out.zarr"],
        "quantized already",
    ),
    "quantized-source-gguf": (
        lambda w, m: _quantized_config(m, "gptq"),
        ["{w}/x.gguf"],
        "quantized already",
    ),
    "quantized-source-safetensors": (
        lambda w, m: _quantized_config(m, "awq"),
        ["{w}/out/model.safetensors"],
        "quantized already",
    ),
    "foreign-node-at-zarr-dst": (
        lambda w, m: _setup_foreign_file(w, "out.zarr/notes.txt"),
        ["{w}/out.zarr"],
        "is not empty and is not a Zarr store",
    ),
    "dst-inside-the-source": (None, ["{m}/out.zarr"], "overlaps the source"),
    "zip-dst": (None, ["{w}/out.zip"], "not a .zip"),
    "compressed-safetensors": (
        None,
        ["{w}/out/model.safetensors", "--compression", "zstd"],
        "never compressed",
    ),
    "unknown-format": (
        None,
        ["{w}/out/model.safetensors", "--format", "onnx"],
        "unknown export format",
    ),
    "parent-is-a-file": (
        lambda w, m: _setup_foreign_file(w, "afile"),
        ["{w}/afile/out.zarr"],
        "is a file, not a directory",
    ),
    "config-not-json": (
        lambda w, m: _setup_foreign_file(w, "c.json"),
        ["{w}/out/model.safetensors", "--config", "{w}/c.json"],
        "not a readable JSON object",
    ),
    "config-quantized-already": (
        lambda w, m: _quantized_config(m, "gptq"),
        ["{w}/out/model.safetensors", "--config", "{m}/config.json"],
        "already has a quantization_config",
    ),
    "blocks-the-bound-cannot-hold": (
        None,
        ["{w}/out.zarr", "--block-size", "100000", "--axis", "0", "--max-memory", "1MiB"],
        "must be at least twice that",
    ),
    "missing-recipe": (
        None,
        ["{w}/out.zarr", "--recipe", "{w}/nope.toml"],
        "recipe file not found",
    ),
    "axis-a-tensor-lacks": (None, ["{w}/out.zarr", "--axis", "3"], "axis"),
}
if file_system("/proc") == "proc":  # (Linux: no file can be made in its proc file system)
    CATALOGUE["dst-in-proc"] = (None, ["/proc/qstream-out.zarr"], "proc file system")
    # (a link and "..": the path as the OS resolves it, /proc/out.zarr, not as it reads)
    CATALOGUE["dst-in-proc-through-a-link"] = (
        lambda w, m: os.symlink("/proc/sys", os.path.join(w, "lnk")),
        ["{w}/lnk/../out.zarr"],
        "/proc is on the kernel's proc file system",
    )


@pytest.mark.parametrize("case", sorted(CATALOGUE))
def test_every_refusal_is_made_by_the_plan_and_the_dry_run_alike(case, nan_llama, tmp_path):
    setup, args, message = CATALOGUE[case]
    work = tmp_path / "w"
    model = tmp_path / "m"
    work.mkdir()
    shutil.copytree(nan_llama, model)
    if setup is not None:
        setup(str(work), str(model))
    argv = [a.format(w=work, m=model) for a in args]
    before = snapshot(str(tmp_path))

    dry = runner.invoke(app, ["convert", str(model), *argv, "--dry-run"])
    run = runner.invoke(app, ["convert", str(model), *argv, "-q"])

    assert dry.exit_code == 2, dry.output
    assert run.exit_code == 2, run.output
    assert message in run.output
    assert dry.output.strip() == run.output.strip()  # the same one line
    assert len(run.output.strip().splitlines()) == 1
    assert "internal error" not in run.output
    assert "NaN" not in run.output  # (no tensor was read)
    assert snapshot(str(tmp_path)) == before  # nothing written, nothing left
    assert_names_only_its_own_flags("convert", run.output)


def help_flags(command: str) -> set[str]:
    """The options ``qstream COMMAND --help`` lists."""
    out = runner.invoke(app, [command, "--help"], env={"COLUMNS": "200"}).output
    return set(re.findall(r"--[a-z][a-z0-9-]*", out))


def assert_names_only_its_own_flags(command: str, output: str) -> None:
    """An error of ``qstream COMMAND`` names flags that command has, and no library
    argument (``format=``, ``overwrite=True``)."""
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", output))
    assert named <= help_flags(command), (named - help_flags(command), output)
    assert not re.search(r"\b(format|type|config|overwrite|scale_dtype|block_size)=", output)


# errors of the other commands that write a destination (their messages name flags)
OTHER_ERRORS = {
    "export-gguf-of-blocks-of-128": (
        ["convert", "{m}", "{w}/g.zarr", "--dtype", "int8", "--block-size", "128"],
        ["export", "{w}/g.zarr", "{w}/g.gguf"],
    ),
    "export-foreign": (
        ["convert", "{m}", "{w}/g.zarr", "--exclude", "*"],
        ["export", "{w}/g.zarr", "{w}/afile"],
    ),
    "export-4-bit-embedding": (
        ["convert", "{m}", "{w}/g.zarr", "--dtype", "int4", "--block-size", "32"],
        ["export", "{w}/g.zarr", "{w}/e/model.safetensors"],
    ),
    "quantize-over-a-file": (None, ["quantize", "{a}", "{w}/afile"]),
    "quantize-bad-axis": (None, ["quantize", "{a}", "{w}/q.zarr", "--axis", "5"]),
    "quantize-zero-point": (
        None, ["quantize", "{a}", "{w}/q.zarr", "--scale", "0.1", "--zero-point", "300"],
    ),
    "dequantize-not-quantized": (None, ["dequantize", "{a}", "{w}/d.zarr"]),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(OTHER_ERRORS))
def test_every_command_names_only_its_own_flags(case, tmp_path):
    samples = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "samples")
    model = write_llama(str(tmp_path / "m"))
    work = tmp_path / "w"
    work.mkdir()
    _setup_foreign_file(str(work), "afile")
    fill = {"m": model, "w": work, "a": os.path.join(samples, "activations.zarr")}
    first, args = OTHER_ERRORS[case]
    if first is not None:
        done = runner.invoke(app, [a.format(**fill) for a in first] + ["-q"])
        assert done.exit_code == 0, done.output
    r = runner.invoke(app, [a.format(**fill) for a in args] + ["-q"])
    assert r.exit_code != 0, r.output
    assert r.output.startswith("error: ") and "internal error" not in r.output, r.output
    assert_names_only_its_own_flags(args[0], r.output)


def test_the_plan_names_what_the_run_does_with_dst(nan_llama, tmp_path):
    plan = qs.plan_convert(nan_llama, tmp_path / "a" / "b" / "out.zarr")
    assert plan.kind == "zarr" and plan.action == "create"
    assert plan.creates == [str(tmp_path / "a"), str(tmp_path / "a" / "b")]
    assert not (tmp_path / "a").exists()
    assert qs.ConversionPlan.from_dict(plan.to_dict()).to_dict() == plan.to_dict()
    gguf = qs.plan_convert(nan_llama, tmp_path / "x.gguf", format="Q4_0")
    # (llama-quantize's Q4_0 mix: output.weight in Q6_K)
    assert {r["target"] for r in gguf.tensors if not r["kept"]} == {"Q4_0", "Q6_K"}


def test_a_decoded_source_quantization_is_replaced_in_the_export_config(tmp_path):
    """DeepSeek's FP8 (quant_method "fp8", block scales) is decoded as it is read: the
    export's config carries qstream's quantization_config instead, no refusal."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    model = tmp_path / "fp8"
    model.mkdir()
    w = (rng.standard_normal((256, 256)) * 0.1).astype(ml_dtypes.float8_e4m3fn)
    s = rng.uniform(0.5, 2, (2, 2)).astype(np.float32)
    save_file(
        {"model.w.weight": w, "model.w.weight_scale_inv": s}, str(model / "model.safetensors")
    )
    cfg = {
        "model_type": "llama",
        "hidden_size": 256,
        "quantization_config": {
            "quant_method": "fp8",
            "fmt": "e4m3",
            "weight_block_size": [128, 128],
            "activation_scheme": "dynamic",
        },
    }
    (model / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "out" / "model.safetensors"
    dry = runner.invoke(app, ["convert", str(model), str(out), "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert "quantization_config is replaced" in dry.output
    run = runner.invoke(app, ["convert", str(model), str(out), "-q"])
    assert run.exit_code == 0, run.output
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["quantization_config"]["quant_method"] == "compressed-tensors"
    assert written["hidden_size"] == 256
    assert not (tmp_path / "out" / "model.safetensors.qstream-work").exists()


def test_every_command_that_writes_a_destination_makes_its_missing_folders(tmp_path):
    """One rule (the README's): missing parent folders of DST are made, by every command."""
    samples = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "samples")
    model = write_llama(str(tmp_path / "m"))
    acts = os.path.join(samples, "activations.zarr")
    n = iter(range(100))

    def new() -> str:
        return str(tmp_path / f"p{next(n)}" / "deeper")

    commands = [
        ["quantize", acts, new() + "/q.zarr"],
        ["quantize", acts, new() + "/q.zip"],
        ["convert", model, new() + "/c.zarr"],
        ["convert", model, new() + "/model.safetensors"],
        ["convert", model, new() + "/model.gguf"],
    ]
    done = [runner.invoke(app, [*args, "-q"]) for args in commands]
    assert [r.exit_code for r in done] == [0] * len(commands), [r.output for r in done]
    q, c = commands[0][2], commands[2][2]
    recipe = tmp_path / "gguf.toml"  # (codes GGUF holds as they are: Q8_0)
    recipe.write_text(
        '[defaults]\ndtype = "int8"\naxis = -1\nblock_size = 32\nmethod = "dynamic"\n'
        'scale_dtype = "float16"\n'
    )
    g = new() + "/g.zarr"
    r = runner.invoke(app, ["convert", model, g, "--recipe", str(recipe), "-q"])
    assert r.exit_code == 0, r.output
    later = [
        ["dequantize", q, new() + "/d.zarr"],
        ["export", c, new() + "/e/model.safetensors"],
        ["export", g, new() + "/g.gguf"],
    ]
    done = [runner.invoke(app, [*args, "-q"]) for args in later]
    assert [r.exit_code for r in done] == [0] * len(later), [r.output for r in done]
    for args in commands + later:
        assert os.path.exists(args[2]), args


CRAFTED_CONFIGS = {
    "not-json": b"{not json",
    "a-list": b"[1, 2, 3]",
    "a-string": b'"llama"',
    "nested-deep": b"[" * 100000 + b"]" * 100000,
    "not-utf8": b'{"model_type": "\xff\xfe"}',
    "quantized-already": json.dumps({"quantization_config": {"quant_method": "awq"}}).encode(),
    "surrogate-key": b'{"model_type": "llama", "\\ud800": 1}',
    "nul-value": b'{"model_type": "lla\\u0000ma"}',
    "huge-number": b'{"model_type": "llama", "hidden_size": 1e999}',
    "empty": b"",
}


@pytest.mark.parametrize("case", sorted(CRAFTED_CONFIGS))
def test_crafted_configs_of_a_compressed_tensors_export_get_a_message_never_an_internal_error(
    case, tmp_path
):
    """A crafted --config for the compressed-tensors layout (``convert`` to .safetensors, and
    ``export``): refused with one line naming the file (exit 2), or carried as the JSON it is;
    never an internal error, and a refused convert writes nothing."""
    model = write_llama(str(tmp_path / "m"))
    config = tmp_path / "crafted.json"
    config.write_bytes(CRAFTED_CONFIGS[case])
    work = tmp_path / "w"
    work.mkdir()
    conv = runner.invoke(app, ["convert", model, str(work / "model.safetensors"),
                               "--config", str(config), "-q"])  # fmt: skip
    assert "internal error" not in conv.output and "Traceback" not in conv.output, conv.output
    if conv.exit_code != 0:
        assert conv.exit_code == 2 and "crafted.json" in conv.output, conv.output
        assert os.listdir(work) == []
    runner.invoke(app, ["convert", model, str(tmp_path / "q.zarr"), "-q"])
    out = str(tmp_path / "e" / "m.safetensors")
    exp = runner.invoke(
        app, ["export", str(tmp_path / "q.zarr"), out, "--config", str(config), "-q"]
    )
    assert "internal error" not in exp.output and "Traceback" not in exp.output, exp.output
    assert exp.exit_code in (0, 2), exp.output
    if exp.exit_code == 0:
        json.loads((tmp_path / "e" / "config.json").read_text())  # (valid JSON written)
