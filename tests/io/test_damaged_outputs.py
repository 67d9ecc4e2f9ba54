"""A finished output whose chunk of codes or scales was removed is refused, never read as
zeros: qstream writes every chunk of a finished output's ``data`` and ``scale`` (its
all-zero zero points excepted), so an absent one is damage. Real damage: files removed
from outputs qstream wrote. ``inspect`` names it and exits 1; writing the output again
with ``--overwrite`` repairs it."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import zarr
from safetensors.numpy import save_file
from typer.testing import CliRunner

import qstream as qs
from cli.main import app
from qstream.errors import StoreError

runner = CliRunner()
SPEC = qs.QuantSpec(dtype="int8", axis=0, symmetric=True)


def _values() -> np.ndarray:
    return np.random.default_rng(50).standard_normal((64, 96)).astype(np.float32)


@pytest.mark.parametrize("compression", ["zstd", "none"])
def test_an_absent_chunk_of_codes_is_refused_by_every_reader(tmp_path, compression):
    out = str(tmp_path / "q.zarr")
    qs.quantize_store(_values(), out, SPEC, compression=compression)
    before = qs.open_quantized(out)[...]
    assert np.abs(before).sum() > 0
    os.remove(os.path.join(out, "data", "c.0.0"))
    arr = qs.open_quantized(out)
    with pytest.raises(StoreError, match=r"missing chunk .*data/c\.0\.0.*damaged"):
        arr[0:2]
    with pytest.raises(StoreError, match="missing chunk"):
        arr.quantized()
    r = runner.invoke(app, ["dequantize", out, str(tmp_path / "d.zarr"), "-q"])
    assert r.exit_code == 1
    assert "missing chunk" in r.output and "data/c.0.0" in r.output
    # what the failed dequantize left is not a finished output
    assert not zarr.open_array(str(tmp_path / "d.zarr")).attrs["qstream"].get("complete")


def test_an_absent_chunk_of_scales_is_refused_when_opened(tmp_path):
    out = str(tmp_path / "q.zarr")
    qs.quantize_store(_values(), out, SPEC)
    os.remove(os.path.join(out, "scale", "c.0"))
    with pytest.raises(StoreError, match=r"missing chunk .*scale/c\.0"):
        qs.open_quantized(out)


def test_all_zero_zero_points_are_not_written_and_still_read(tmp_path):
    out = str(tmp_path / "q.zarr")
    qs.quantize_store(_values(), out, SPEC)
    assert not [n for n in os.listdir(os.path.join(out, "zero_point")) if n != "zarr.json"]
    assert qs.open_quantized(out).summary()["damaged"] == []


def test_inspect_names_what_a_finished_output_lacks_and_exits_1(tmp_path):
    out = str(tmp_path / "q.zarr")
    qs.quantize_store(_values(), out, SPEC, compression="none")
    r = runner.invoke(app, ["inspect", out])
    assert r.exit_code == 0 and "damaged" not in r.output
    chunk = os.path.join(out, "data", "c.0.0")
    with open(chunk, "r+b") as f:  # a truncated raw chunk: of the wrong size
        f.truncate(100)
    r = runner.invoke(app, ["inspect", out])
    assert r.exit_code == 1
    assert "damaged" in r.output and "data/c.0.0 absent or of the wrong size" in r.output
    r = runner.invoke(app, ["inspect", out, "--json"])
    assert r.exit_code == 1
    doc = json.loads(r.stdout)  # (one JSON document on stdout, the error on stderr)
    assert doc["damaged"] == ["data/c.0.0"] and doc["complete"] is True


def test_quantizing_again_repairs_a_damaged_output(tmp_path):
    src = str(tmp_path / "src.zarr")
    zarr.create_array(src, data=_values(), chunks=(16, 96))
    out = str(tmp_path / "q.zarr")
    assert runner.invoke(app, ["quantize", src, out, "--axis", "0", "-q"]).exit_code == 0
    want = qs.open_quantized(out)[...]
    os.remove(os.path.join(out, "data", "c.0.0"))
    r = runner.invoke(app, ["quantize", src, out, "--axis", "0", "-q"])
    assert r.exit_code == 0
    np.testing.assert_array_equal(qs.open_quantized(out)[...], want)


def test_a_pack_without_its_codes_is_refused_and_overwrite_repairs_it(tmp_path):
    rng = np.random.default_rng(51)
    ck = str(tmp_path / "ck.safetensors")
    tensors = {f"layers.{i}.mlp.weight": rng.standard_normal((32, 64)).astype(np.float32)
               for i in range(4)}  # fmt: skip
    save_file(tensors, ck)
    out = str(tmp_path / "o.zarr")
    qs.convert_checkpoint(ck, out, packs=True)
    packs = os.path.join(out, "_packs")
    (pack,) = [n for n in os.listdir(packs) if n.startswith("p")]
    want = {n: qs.open_quantized(out)[n][...] for n in tensors}
    (chunk,) = [n for n in os.listdir(os.path.join(packs, pack, "data")) if n != "zarr.json"]
    os.remove(os.path.join(packs, pack, "data", chunk))
    ckpt = qs.open_quantized(out)
    for name in tensors:
        with pytest.raises(StoreError, match=r"missing chunk .*_packs"):
            ckpt[name][0:1]
    qs.convert_checkpoint(ck, out, packs=True, overwrite=True)
    assert [n for n in os.listdir(packs) if n.startswith("p")] == [pack]
    for name, values in want.items():
        np.testing.assert_array_equal(qs.open_quantized(out)[name][...], values)


def test_a_finished_checkpoint_whose_index_lost_a_batch_is_refused_not_read_shorter(tmp_path):
    rng = np.random.default_rng(52)
    ck = str(tmp_path / "ck.safetensors")
    save_file(
        {f"t{i}.weight": rng.standard_normal((8, 16)).astype(np.float32) for i in range(3)}, ck
    )
    out = str(tmp_path / "o.zarr")
    assert runner.invoke(app, ["convert", ck, out, "-q"]).exit_code == 0
    index = os.path.join(out, "_index")
    batches = sorted(n for n in os.listdir(index) if n.startswith("b"))
    import shutil

    shutil.rmtree(os.path.join(index, batches[0]))
    with pytest.raises(StoreError, match=r"damaged: its index \(_index\) lists [0-2] of the 3"):
        qs.open_quantized(out)
    for args in (["inspect", out], ["convert", ck, out], ["dequantize", out, str(tmp_path / "d")]):
        r = runner.invoke(app, args)
        assert r.exit_code != 0 and "lists" in r.output and "--overwrite" in r.output, args
    assert runner.invoke(app, ["convert", ck, out, "-q", "--overwrite"]).exit_code == 0
    assert len(qs.open_quantized(out)) == 3


@pytest.mark.parametrize(
    "command",
    [
        ["convert", "{ck}", "{dst}/new/o.zarr"],
        ["convert", "{ck}", "{dst}/o.safetensors"],
        ["quantize", "{arr}", "{dst}/q.zarr"],
        ["dequantize", "{q}", "{dst}/d.zarr"],
        ["export", "{q}", "{dst}/e.safetensors"],
    ],
    ids=["convert", "convert-safetensors", "quantize", "dequantize", "export"],
)
def test_a_refused_memory_bound_writes_nothing(tmp_path, command):
    import zarr as zarr_

    ck = str(tmp_path / "ck.safetensors")
    save_file({"layers.0.mlp.weight": _values()}, ck)
    arr = str(tmp_path / "a.zarr")
    zarr_.create_array(arr, data=_values())
    q = str(tmp_path / "q.zarr")
    qs.quantize_store(_values(), q, SPEC)
    dst = tmp_path / "dst"
    dst.mkdir()
    args = [a.format(ck=ck, arr=arr, q=q, dst=dst) for a in command]
    r = runner.invoke(app, [*args, "--max-memory", "1KB"])
    assert r.exit_code == 2
    assert "--max-memory must be at least 1 MiB" in r.output
    assert os.listdir(dst) == []
    with pytest.raises(qs.InvalidParameterError, match="max_memory must be at least 1 MiB"):
        qs.open_quantized(q, max_memory=1000)


@pytest.fixture
def kept_garbage(tmp_path):
    """A converted checkpoint (a weight quantized, a norm kept) whose kept tensor's chunk
    holds garbage."""
    rng = np.random.default_rng(53)
    ck = str(tmp_path / "ck.safetensors")
    tensors = {
        "layers.0.mlp.up_proj.weight": rng.standard_normal((32, 64)).astype(np.float32),
        "layers.0.norm.weight": rng.standard_normal(64).astype(np.float32),
    }
    save_file(tensors, ck)
    out = str(tmp_path / "o.zarr")
    qs.convert_checkpoint(ck, out)
    with open(os.path.join(out, "layers.0.norm.weight", "c.0"), "wb") as f:
        f.write(os.urandom(21))
    return out


@pytest.mark.parametrize(
    "command",
    [
        ["dequantize", "{out}", "{tmp}/r.safetensors"],
        ["dequantize", "{out}", "{tmp}/r.zarr"],
        ["export", "{out}", "{tmp}/ct/model.safetensors"],
        ["export", "{out}", "{tmp}/qf/q.safetensors", "--format", "qstream"],
    ],
    ids=["dequantize-safetensors", "dequantize-zarr", "export-ct", "export-qstream"],
)
def test_a_corrupt_chunk_of_a_kept_tensor_is_named_not_an_internal_error(
    kept_garbage, tmp_path, command
):
    args = [a.format(out=kept_garbage, tmp=tmp_path) for a in command]
    r = runner.invoke(app, [*args, "-q"])
    assert r.exit_code == 1
    assert "corrupt chunk" in r.output and "layers.0.norm.weight/c.0" in r.output
    assert "internal error" not in r.output and "cannot write" not in r.output
    if command[0] == "export":  # no config.json left without the weights it describes
        folder = os.path.dirname(args[2])
        assert not [n for n in os.listdir(folder) if n.endswith((".json", ".safetensors"))]


def test_a_kept_tensor_is_written_whole_and_its_absent_chunk_refused(tmp_path):
    rng = np.random.default_rng(55)
    ck = str(tmp_path / "ck.safetensors")
    save_file(
        {
            "layers.0.mlp.up_proj.weight": rng.standard_normal((32, 64)).astype(np.float32),
            "layers.0.norm.weight": np.zeros(64, np.float32),  # (all zero: written all the same)
        },
        ck,
    )
    out = str(tmp_path / "o.zarr")
    qs.convert_checkpoint(ck, out)
    chunk = os.path.join(out, "layers.0.norm.weight", "c.0")
    assert os.path.getsize(chunk) > 0
    assert qs.open_quantized(out).damaged() == []
    os.remove(chunk)
    os.remove(os.path.join(out, "layers.0.mlp.up_proj.weight", "scale", "c.0"))
    ckpt = qs.open_quantized(out)
    assert ckpt.damaged() == ["layers.0.mlp.up_proj.weight/scale/c.0", "layers.0.norm.weight/c.0"]
    with pytest.raises(StoreError, match=r"kept tensor 'layers.0.norm.weight' is damaged"):
        ckpt["layers.0.norm.weight"]
    r = runner.invoke(app, ["inspect", out])
    assert r.exit_code == 1 and "layers.0.norm.weight/c.0" in r.stderr
    r = runner.invoke(app, ["dequantize", out, str(tmp_path / "d.zarr"), "-q"])
    assert r.exit_code == 1 and "damaged" in r.output


def test_a_zero_d_tensor_written_through_zarr_is_not_called_damaged_without_its_zero_chunk(
    tmp_path,
):
    # (earlier versions wrote 0-d members through zarr, which leaves an all-zero chunk out)
    ck = str(tmp_path / "ck.safetensors")
    save_file({"scalar": np.zeros((), np.float32), "w.weight": _values()}, ck)
    out = str(tmp_path / "o.zarr")
    recipe = qs.Recipe(defaults=qs.QuantSpec(dtype="int8", axis=None, symmetric=True), min_rank=0)
    qs.convert_checkpoint(ck, out, recipe)
    data = os.path.join(out, "scalar", "data")
    for n in os.listdir(data):
        if n != "zarr.json":
            os.remove(os.path.join(data, n))
    ckpt = qs.open_quantized(out)
    assert ckpt.damaged() == []
    assert float(ckpt["scalar"][...]) == 0.0
    assert runner.invoke(app, ["inspect", out]).exit_code == 0


def test_max_memory_takes_any_real_number_of_bytes_and_refuses_nan(tmp_path):
    q = str(tmp_path / "q.zarr")
    qs.quantize_store(_values(), q, SPEC, max_memory=np.int64(1 << 30))
    assert qs.open_quantized(q, max_memory=np.int64(1 << 30)).shape == (64, 96)
    for bad in (float("nan"), float("inf"), "1GiB"):
        with pytest.raises(qs.InvalidParameterError, match="max_memory must be a number"):
            qs.open_quantized(q, max_memory=bad)


def test_an_output_in_a_memory_store_that_lost_a_chunk_is_refused_when_read():
    qs.quantize_store(_values(), "memory://damaged-read", SPEC, chunks=(32, 96), overwrite=True)
    arr = qs.open_quantized("memory://damaged-read")
    whole = arr[...]
    arr.group.store_path.store._store_dict.pop("data/c.1.0")  # (zarr's MemoryStore's dict)
    arr = qs.open_quantized("memory://damaged-read")
    np.testing.assert_array_equal(arr[0:32], whole[0:32])
    with pytest.raises(StoreError, match=r"missing chunk .*data/c\.1\.0"):
        arr[32:40]
    assert arr.summary()["damaged"] == ["data/c.1.0"]
