"""A recipe export (``qstream convert MODEL OUT.safetensors``, compressed-tensors) of a bfloat16
or float16 model stores its scales in the model's dtype (``scale_dtype="source"``, the default
of such an export), rounded to that dtype before quantizing: transformers loading the folder
in the model's own dtype, in a fresh process, gets qstream's dequantized values bit for bit,
as in float32 (the Python API's default too); ``--scale-dtype float32`` keeps float32 scales."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from typer.testing import CliRunner

import qstream as qs
from cli.main import app
from tests.support.fresh import run_json

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("compressed_tensors")

INT4_G128 = {"dtype": "int4", "axis": -1, "block_size": 128, "method": "dynamic"}
KEEP_EMBED = [{"pattern": "*embed*", "action": "keep"}]  # (4-bit embeddings do not load)


fresh = run_json  # (a support script in a fresh process: tests/support/fresh.py)


@pytest.fixture(scope="module", params=["bfloat16", "float16"])
def source(request, tmp_path_factory):
    """A tiny Llama folder in that dtype (hidden 256: groups of 128 divide every weight)."""
    folder = tmp_path_factory.mktemp(request.param) / "src"
    fresh("hf_deploy.py", "build", folder, 256, "untied", request.param)
    return folder, request.param


def convert_cli(src, out, *args: str) -> None:
    r = CliRunner().invoke(app, ["convert", str(src), str(out), "-q", *args])
    assert r.exit_code == 0, r.output


def reference(src, where, recipe: dict) -> str:
    """qstream's dequantized values (float32) of every quantized tensor: a Zarr conversion of
    the same source under ``recipe`` with ``scale_dtype="source"`` given explicitly (a Zarr
    output keeps float32 scales by default), as an .npz."""
    rec = qs.Recipe.from_dict(
        {"defaults": {**recipe.get("defaults", {}), "scale_dtype": "source"},
         "rules": recipe.get("rules", [])}
    )  # fmt: skip
    qs.convert_checkpoint(src, where / "ref.zarr", rec)
    root = qs.open_quantized(where / "ref.zarr")
    arrays = {n: root[n][...] for n in root if isinstance(root[n], qs.QuantizedArray)}
    np.savez(where / "ref.npz", **arrays)
    return str(where / "ref.npz")


def header(out) -> dict:
    with open(out, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(n))


def write_toml(path, recipe: dict) -> str:
    lines = ["[defaults]"] + [f"{k} = {json.dumps(v)}" for k, v in recipe["defaults"].items()]
    for r in recipe.get("rules", []):
        lines += ["[[rules]]"] + [f"{k} = {json.dumps(v)}" for k, v in r.items()]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_a_bf16_or_f16_model_exported_by_recipe_loads_in_its_own_dtype_bit_exact(source, tmp_path):
    src, dtype = source
    tag = {"bfloat16": "BF16", "float16": "F16"}[dtype]
    int4 = {"defaults": INT4_G128, "rules": KEEP_EMBED}
    out8 = tmp_path / "int8" / "model.safetensors"  # the default recipe: int8 per channel
    out4 = tmp_path / "int4" / "model.safetensors"
    r = CliRunner().invoke(app, ["convert", str(src), str(out8), "--dry-run"])
    assert r.exit_code == 0 and f"int8/axis0/minmax/{dtype}-scales" in r.output, r.output
    convert_cli(src, out8)
    convert_cli(src, out4, "--recipe", write_toml(tmp_path / "int4.toml", int4))
    for out in (out8, out4):
        scales = {n: e["dtype"] for n, e in header(out).items() if n.endswith("weight_scale")}
        assert scales and set(scales.values()) == {tag}, scales
    (tmp_path / "r8").mkdir()
    (tmp_path / "r4").mkdir()
    ref8 = reference(src, tmp_path / "r8", {})
    ref4 = reference(src, tmp_path / "r4", int4)
    jobs = [
        {"folder": str(out.parent), "npz": ref, "dtype": d}
        for out, ref in ((out8, ref8), (out4, ref4))
        for d in (dtype, "float32")
    ]
    got = fresh("scale_dtype_load.py", src, json.dumps(jobs))
    assert isinstance(got, list) and len(got) == 4
    for job, row in zip(jobs, got, strict=True):
        assert row["quantized"] >= 14 and row["bit_exact"] == row["quantized"], (job, row)
        assert row["logits_equal"], (job, row)


def test_bf16_scales_are_the_float32_scale_rounded_to_nearest_even_as_torch_does(source, tmp_path):
    """The stored per-channel scales of the int8 export are torch's bfloat16 (or float16)
    rounding of the float32 scale ``absmax / 127`` of each row of the source weight, and the
    codes are the weight divided by that rounded scale, rounded half to even."""
    from safetensors.torch import load_file

    src, dtype = source
    out = tmp_path / "o" / "model.safetensors"
    convert_cli(src, out)
    weights = load_file(os.path.join(src, "model.safetensors"))
    written = load_file(str(out))
    name = "model.layers.0.mlp.down_proj.weight"
    w = weights[name].to(torch.float64)
    s32 = (w.abs().amax(dim=1, keepdim=True) / 127).to(torch.float32)
    want = s32.to(getattr(torch, dtype))
    got = written[name + "_scale"]
    assert got.dtype == getattr(torch, dtype) and torch.equal(got, want)
    codes = torch.clamp(torch.round(w.to(torch.float32) / want.to(torch.float32)), -128, 127)
    assert torch.equal(written[name].to(torch.float32), codes)


def test_scale_dtype_float32_keeps_float32_scales_and_the_api_defaults_as_the_cli(source, tmp_path):
    """``--scale-dtype float32`` writes the export ``convert_checkpoint(...,
    scale_dtype="float32")`` writes, with F32 scales; without it the Python API and the
    command line write the same export, scales in the model's dtype."""
    src, dtype = source
    out = {k: tmp_path / k / "model.safetensors" for k in ("cli32", "api32", "cli", "api")}
    convert_cli(src, out["cli32"], "--scale-dtype", "float32")
    qs.convert_checkpoint(src, out["api32"], scale_dtype="float32")
    convert_cli(src, out["cli"])
    qs.convert_checkpoint(src, out["api"])
    assert out["cli32"].read_bytes() == out["api32"].read_bytes()
    assert out["cli"].read_bytes() == out["api"].read_bytes()
    for key, tag in (("cli32", "F32"), ("cli", {"bfloat16": "BF16", "float16": "F16"}[dtype])):
        scales = {e["dtype"] for n, e in header(out[key]).items() if n.endswith("weight_scale")}
        assert scales == {tag}, (key, scales)
