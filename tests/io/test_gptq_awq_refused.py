"""GPTQ and AWQ checkpoints (packed int4 ``qweight`` / ``qzeros`` / ``scales``, GPTQ's act-order
``g_idx``, with the ``quantization_config`` those libraries write) are refused by name before
any tensor byte is read, by the Python API and by every command (``convert`` with and without
``--dry-run``, ``dequantize``, ``calibrate --tensor``): exit 2, nothing created. No reference
decoder is installable in the test environment without changing its other packages
(``gptqmodel`` upgrades torch and brings CUDA; ``autoawq`` brings accelerate, which changes how
transformers loads models), so qstream does not decode them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

import qstream as qs
from qstream.errors import StoreError
from qstream.io.checkpoints import tensor as tensor_module

HIDDEN, INTER, GROUP = 128, 256, 64


def _packed_linear(rng: np.random.Generator, n_in: int, n_out: int, method: str) -> dict:
    """One linear layer in the library's packed layout (random int4 codes, fp16 scales)."""
    groups = n_in // GROUP
    scales = (rng.random((groups, n_out)) * 0.01 + 0.001).astype(np.float16)
    if method == "gptq":  # codes packed along the input axis, 8 a word; zeros along outputs
        return {
            "qweight": rng.integers(-(2**31), 2**31, (n_in // 8, n_out), dtype=np.int32),
            "qzeros": rng.integers(-(2**31), 2**31, (groups, n_out // 8), dtype=np.int32),
            "scales": scales,
            "g_idx": (rng.permutation(n_in) // GROUP).astype(np.int32),
        }
    return {  # AWQ (GEMM): codes packed along the output axis
        "qweight": rng.integers(-(2**31), 2**31, (n_in, n_out // 8), dtype=np.int32),
        "qzeros": rng.integers(-(2**31), 2**31, (groups, n_out // 8), dtype=np.int32),
        "scales": scales,
    }


CONFIGS = {
    "gptq": {
        "quant_method": "gptq",
        "bits": 4,
        "group_size": GROUP,
        "desc_act": True,
        "sym": True,
        "checkpoint_format": "gptq",
    },
    "awq": {
        "quant_method": "awq",
        "bits": 4,
        "group_size": GROUP,
        "version": "gemm",
        "zero_point": True,
    },
}


def build(folder: Path, method: str, config: bool = True) -> Path:
    rng = np.random.default_rng(0)
    tensors: dict[str, np.ndarray] = {
        "model.embed_tokens.weight": rng.standard_normal((64, HIDDEN)).astype(np.float16),
        "model.norm.weight": np.ones(HIDDEN, np.float16),
    }
    for name, (n_in, n_out) in {
        "model.layers.0.mlp.up_proj": (HIDDEN, INTER),
        "model.layers.0.mlp.down_proj": (INTER, HIDDEN),
    }.items():
        for leaf, a in _packed_linear(rng, n_in, n_out, method).items():
            tensors[f"{name}.{leaf}"] = a
    folder.mkdir()
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    doc = {"model_type": "llama", "hidden_size": HIDDEN, "intermediate_size": INTER}
    if config:
        doc["quantization_config"] = CONFIGS[method]
    (folder / "config.json").write_text(json.dumps(doc))
    return folder


@pytest.fixture
def no_reads(monkeypatch):
    """Every way a checkpoint tensor's bytes are read, recorded."""
    reads: list[str] = []
    cls = tensor_module.CheckpointTensor
    for attr in ("__getitem__", "read_into", "view"):
        real = getattr(cls, attr)

        def spy(self, *a, _real=real, _attr=attr, **k):
            reads.append(f"{self.name}.{_attr}")
            return _real(self, *a, **k)

        monkeypatch.setattr(cls, attr, spy)
    for fn in ("read_file_run", "map_file_run"):
        real = getattr(tensor_module, fn)

        def spy_fn(*a, _real=real, _fn=fn, **k):
            reads.append(_fn)
            return _real(*a, **k)

        monkeypatch.setattr(tensor_module, fn, spy_fn)
    return reads


@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_the_api_refuses_by_name_before_reading_a_byte(tmp_path, method, no_reads):
    src = build(tmp_path / "m", method)
    with pytest.raises(StoreError, match=repr(method)):
        qs.open_checkpoint(src)
    with pytest.raises(qs.QStreamError, match=repr(method)):
        qs.plan_convert(src, tmp_path / "out.zarr")
    with pytest.raises(qs.QStreamError, match=repr(method)):
        qs.convert_checkpoint(src, tmp_path / "out.zarr")
    assert not (tmp_path / "out.zarr").exists()
    assert no_reads == []
    plain = build(tmp_path / "plain", method, config=False)
    (plain / "model.safetensors").unlink()
    save_file({"w": np.ones((4, 4), np.float32)}, str(plain / "model.safetensors"))
    qs.open_checkpoint(plain)["w"][1:3]  # (the spy sees a read)
    assert no_reads


@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_every_command_refuses_by_name_with_exit_2_creating_nothing(tmp_path, method, no_reads):
    from typer.testing import CliRunner

    from cli.main import app

    src = str(build(tmp_path / "m", method))
    runner = CliRunner()
    for dst, args in [
        (tmp_path / "out.zarr", ["convert", src, str(tmp_path / "out.zarr"), "--dry-run"]),
        (tmp_path / "out.zarr", ["convert", src, str(tmp_path / "out.zarr")]),
        (tmp_path / "e.safetensors", ["convert", src, str(tmp_path / "e.safetensors")]),
        (tmp_path / "p", ["dequantize", src, str(tmp_path / "p" / "model.safetensors")]),
        (tmp_path / "d.zarr", ["dequantize", src, str(tmp_path / "d.zarr")]),
    ]:
        r = runner.invoke(app, args)
        assert r.exit_code == 2, (args, r.output)
        assert repr(method) in r.output, (args, r.output)
        assert not dst.exists(), args
    r = runner.invoke(app, ["calibrate", src, "--tensor", "model.norm.weight"])
    assert r.exit_code == 2 and repr(method) in r.output, r.output
    assert no_reads == []


@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_the_packed_layout_without_a_config_is_refused_by_its_tensor_names(tmp_path, method):
    src = build(tmp_path / "m", method, config=False)
    with pytest.raises(StoreError, match="GPTQ"):
        qs.open_checkpoint(src)
    got = qs.describe_checkpoint(src)
    assert got["quantization"].startswith("GPTQ") and not got["decoded"]
