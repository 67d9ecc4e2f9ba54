"""``convert --scheme NAME``: a compressed-tensors folder whose codes and scales equal what
compressed-tensors' own quantization functions and compressor give for the same source
weights (float32 and bfloat16), loaded by transformers in a fresh process with every quantized
module's effective weight equal to the decoded values in the model's own dtype."""

from __future__ import annotations

import os
import sys

import ml_dtypes
import numpy as np
import pytest
from typer.testing import CliRunner

import qstream as qs
from cli.main import app
from tests.support.fresh import run_json

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("compressed_tensors")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "core"))
from test_float_formats import _oracle  # noqa: E402

DEPLOY = os.path.join(os.path.dirname(HERE), "support", "hf_deploy.py")
CT_EXPORT = os.path.join(os.path.dirname(HERE), "support", "ct_reference.py")
BF16 = np.dtype(ml_dtypes.bfloat16)
SCHEMES = ["FP8_DYNAMIC", "FP8_BLOCK", "W4A16", "W8A16", "NVFP4A16", "MXFP4A16"]


def fresh(*args: object, script: str = DEPLOY) -> dict:
    return run_json(script, *args, timeout=600)


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def source(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param) / "src"
    fresh("build", folder, 128, "untied", request.param)
    return folder


@pytest.fixture(scope="module")
def small_source(tmp_path_factory):
    """A hidden-64 float32 model, built once for the plan-only tests."""
    folder = tmp_path_factory.mktemp("small") / "src"
    fresh("build", folder, 64, "untied", "float32")
    return folder


def _source_weights(folder) -> dict[str, np.ndarray]:
    from safetensors.torch import load_file as load_torch

    out = {}
    for n, t in load_torch(os.path.join(folder, "model.safetensors")).items():
        if t.dtype == torch.bfloat16:
            out[n] = t.view(torch.int16).numpy().view(BF16)
        else:
            out[n] = t.numpy()
    return out


def _written(out_folder) -> dict[str, np.ndarray]:
    from safetensors.torch import load_file as load_torch

    return load_torch(os.path.join(out_folder, "model.safetensors"))


def _raw(t: torch.Tensor) -> torch.Tensor:
    """A tensor's bytes as integers (float8 compared bit for bit)."""
    return t.view(torch.uint8) if t.element_size() == 1 else t


def _decoded(scheme: str, oracle_unpacked: torch.Tensor) -> np.ndarray:
    return oracle_unpacked.to(torch.float32).numpy()


@pytest.mark.parametrize("scheme", SCHEMES)
def test_scheme_export_equals_compressed_tensors_and_loads_bit_exact(source, scheme, tmp_path):
    out = tmp_path / "out" / "model.safetensors"
    report = qs.convert_checkpoint(source, out, scheme=scheme)
    assert not report["already_complete"]
    written = _written(out.parent)
    weights = _source_weights(source)
    quantized = [n for n in weights if n.endswith("proj.weight")]
    assert quantized
    expected = {}
    for name in quantized:
        module = name[: -len("weight")]
        packed, unpacked, _ = _oracle(weights[name], scheme)
        for key, ref in packed.items():
            got = written[module + key]
            assert got.dtype == ref.dtype and tuple(got.shape) == tuple(ref.shape), (name, key)
            assert torch.equal(_raw(got), _raw(ref)), (name, key)
        expected[name] = _decoded(scheme, unpacked["weight"])
    np.savez(tmp_path / "ref.npz", **expected)
    dtype = "bfloat16" if next(iter(weights.values())).dtype == BF16 else "float32"
    if scheme in ("NVFP4A16", "MXFP4A16") and dtype == "float32":
        return  # (the FP4 decompressors give bfloat16: checked on the bfloat16 source)
    got = fresh("load", out.parent, tmp_path / "ref.npz", dtype)
    assert got["quantized"] == len(quantized)
    assert got["bit_exact"] == got["quantized"], got["differ"]
    assert got["generated"] > 0


@pytest.mark.parametrize("scheme", ["FP8_DYNAMIC", "FP8_BLOCK"])
def test_fp8_export_logits_equal_compressed_tensors_own_export(source, scheme, tmp_path):
    # activations are quantized at run time: compared export with export, both loaded by
    # transformers in fresh processes in the model's own dtype
    out = tmp_path / "qs" / "model.safetensors"
    qs.convert_checkpoint(source, out, scheme=scheme)
    fresh("export", source, tmp_path / "ct", scheme, script=CT_EXPORT)
    theirs = _written(tmp_path / "ct")
    ours = _written(out.parent)
    assert sorted(ours) == sorted(theirs)
    assert all(torch.equal(_raw(ours[k]), _raw(theirs[k])) for k in ours)
    dtype = "bfloat16" if any(v.dtype == torch.bfloat16 for v in ours.values()) else "float32"
    a = fresh("run", out.parent, tmp_path / "qs.pt", dtype)
    b = fresh("run", tmp_path / "ct", tmp_path / "ct.pt", dtype)
    assert a["loads"] and b["loads"] and a["dtype"] == f"torch.{dtype}", (a, b)
    got, want = torch.load(tmp_path / "qs.pt"), torch.load(tmp_path / "ct.pt")
    assert sorted(got["state"]) == sorted(want["state"])
    assert all(torch.equal(_raw(got["state"][k]), _raw(want["state"][k])) for k in got["state"])
    assert torch.equal(got["logits"], want["logits"]) and bool(got["logits"].isfinite().all())
    assert a["generated"] > 0


def test_scheme_scales_are_in_the_source_dtype(source, tmp_path):
    out = tmp_path / "o" / "model.safetensors"
    qs.convert_checkpoint(source, out, scheme="W4A16")
    w = _source_weights(source)
    written = _written(out.parent)
    want = (
        torch.bfloat16
        if w["model.layers.0.self_attn.q_proj.weight"].dtype == BF16
        else torch.float32
    )
    assert written["model.layers.0.self_attn.q_proj.weight_scale"].dtype == want


@pytest.mark.parametrize("scheme", ["FP8", "NVFP4", "INT8", "W8A8", "W4A16_ASYM"])
def test_static_activation_presets_are_refused_before_anything_is_written(
    scheme, small_source, tmp_path
):
    src = small_source
    out = tmp_path / "out" / "model.safetensors"
    r = CliRunner().invoke(app, ["convert", str(src), str(out), "--scheme", scheme, "--dry-run"])
    r2 = CliRunner().invoke(app, ["convert", str(src), str(out), "--scheme", scheme])
    if scheme in ("FP8", "NVFP4"):
        assert r.exit_code == 2 and r2.exit_code == 2, r.output
        assert "activation" in r2.output
        assert not os.path.exists(tmp_path / "out")
    else:  # dynamic int8 activations: W8A8 is int-quantized, not written by qstream (yet)
        assert r2.exit_code == 2
        assert not os.path.exists(out)


def test_dry_run_shows_the_scheme_plan_and_writes_nothing(small_source, tmp_path):
    src = small_source
    out = tmp_path / "out" / "model.safetensors"
    r = CliRunner().invoke(
        app, ["convert", str(src), str(out), "--scheme", "FP8_DYNAMIC", "--dry-run"]
    )
    assert r.exit_code == 0, r.output
    assert "FP8_DYNAMIC" in r.output and "keep" in r.output
    assert not os.path.exists(out)
