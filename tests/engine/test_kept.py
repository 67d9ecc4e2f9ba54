"""Kept tensors (stored as they are): a small one is written whole at once, without zarr's
event loop, and its files are the ones zarr itself writes; a large one goes through zarr.
Their chunk files lie side by side in the array's folder, as the quantized members' do."""

from __future__ import annotations

import json
import os
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import zarr
from safetensors.numpy import save_file

import qstream as qs
from qstream.engine.convert import kept
from qstream.io.checkpoints.open import open_checkpoint


def _files(node) -> tuple[dict, dict[str, bytes]]:
    """(the parsed zarr.json, {relative path: bytes} of the chunk files) of an array."""
    chunks = {
        os.path.relpath(os.path.join(h, f), node): Path(h, f).read_bytes()
        for h, _, fs in os.walk(node)
        for f in fs
        if f != "zarr.json"
    }
    with open(os.path.join(node, "zarr.json")) as f:
        return json.load(f), chunks


@pytest.fixture
def checkpoint(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {
        "norm": rng.standard_normal(1000).astype(np.float32),
        "proj": rng.standard_normal((3000, 700)).astype(np.float32),  # several chunks
        "half": rng.standard_normal((64, 33)).astype(np.float16),
        "zeros": np.zeros((40, 8), np.float32),  # (zarr leaves all-fill chunks unwritten)
    }
    save_file(tensors, str(tmp_path / "m.safetensors"))
    return tensors, open_checkpoint(str(tmp_path / "m.safetensors"))


@pytest.mark.parametrize("compression", ["none", "zstd:3"])
@pytest.mark.parametrize("as_dtype", [None, "bfloat16"])
@pytest.mark.parametrize("name", ["norm", "proj", "half", "zeros"])
def test_a_small_kept_tensor_written_whole_has_the_files_zarr_writes(
    tmp_path, checkpoint, monkeypatch, name, as_dtype, compression
):
    tensors, ck = checkpoint
    whole = tmp_path / "whole"
    whole.mkdir()
    got = kept.keep_tensor(ck[name], str(whole / name), compression, None, as_dtype)
    monkeypatch.setattr(kept, "WHOLE", 0)  # every tensor through zarr
    by_zarr = tmp_path / "zarr"
    by_zarr.mkdir()
    want = kept.keep_tensor(ck[name], str(by_zarr / name), compression, None, as_dtype)
    assert got == want
    assert _files(whole / name) == _files(by_zarr / name)
    # chunk files side by side ("c.0.0"): no chunk folder to create per kept tensor
    assert not [rel for rel in _files(whole / name)[1] if os.sep in rel]
    qs.register_zarr_types()  # (bfloat16, for zarr 3.1)
    values = zarr.open_array(str(whole / name))[...]
    expected = tensors[name].astype(ml_dtypes.bfloat16 if as_dtype else tensors[name].dtype)
    assert values.dtype == expected.dtype
    np.testing.assert_array_equal(values.view(np.uint8), expected.view(np.uint8))


def test_many_kept_tensors_convert_and_read_back(tmp_path):
    rng = np.random.default_rng(1)
    tensors = {f"model.layers.{i}.norm.weight": rng.standard_normal(256) for i in range(300)}
    tensors = {k: v.astype(np.float32) for k, v in tensors.items()}
    save_file(tensors, str(tmp_path / "norms.safetensors"))
    report = qs.convert_checkpoint(str(tmp_path / "norms.safetensors"), str(tmp_path / "out"))
    assert len(report["tensors"]) == 300
    assert all(r["kept"] for r in report["tensors"].values())
    out = qs.open_quantized(str(tmp_path / "out"))
    for name in ("model.layers.0.norm.weight", "model.layers.299.norm.weight"):
        np.testing.assert_array_equal(out[name][...], tensors[name])
    assert not [p for p in os.listdir(tmp_path / "out") if p.startswith(".qstream-tmp")]


@pytest.mark.parametrize("compression", ["auto", "none"])
def test_a_restored_kept_tensor_written_whole_has_the_files_zarr_writes(
    tmp_path, monkeypatch, compression
):
    rng = np.random.default_rng(2)
    tensors = {
        "norm": rng.standard_normal(1000).astype(np.float32),
        "bias": rng.standard_normal((64, 33)).astype(np.float16),
        "emb": rng.standard_normal((300, 70)).astype(ml_dtypes.bfloat16),
        "zeros": np.zeros((40, 8), np.float32),  # (zarr leaves all-fill chunks unwritten)
    }
    save_file(tensors, str(tmp_path / "m.safetensors"))
    keep_all = qs.Recipe.from_dict({"rules": [{"pattern": "*", "action": "keep"}]})
    qs.convert_checkpoint(
        str(tmp_path / "m.safetensors"), str(tmp_path / "c"), keep_all, compression=compression
    )
    qs.dequantize_store(str(tmp_path / "c"), str(tmp_path / "whole"), compression=compression)
    monkeypatch.setattr(kept, "WHOLE", 0)  # every tensor through zarr
    qs.dequantize_store(str(tmp_path / "c"), str(tmp_path / "zarr"), compression=compression)
    for name, x in tensors.items():
        assert _files(tmp_path / "whole" / name) == _files(tmp_path / "zarr" / name)
        got = zarr.open_array(str(tmp_path / "whole" / name))[...]
        np.testing.assert_array_equal(got.view(np.uint8), x.view(np.uint8))
