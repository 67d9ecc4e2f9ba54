"""One reader type: ``qs.open_quantized`` gives a ``QuantizedCheckpoint`` for a converted
checkpoint in every layout (Zarr groups, packs, safetensors exports in both formats, sharded
or not, GGUF files), with ``.tensors``, iteration, the mapping protocol, ``summary()`` and
``view``, and the same values whichever layout it reads."""

import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

import qstream as qs

SAMPLE = Path(__file__).resolve().parents[2] / "samples" / "tiny-transformer.safetensors"


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """The bundled sample converted (one group per tensor, and packed) and exported."""
    root = tmp_path_factory.mktemp("layouts")
    qs.convert_checkpoint(SAMPLE, root / "groups.zarr", packs=False)
    qs.convert_checkpoint(SAMPLE, root / "packed.zarr", packs=True)
    made = {"groups": root / "groups.zarr", "packed": root / "packed.zarr"}
    for fmt in ("compressed-tensors", "qstream"):
        (root / fmt).mkdir()
        made[fmt] = root / fmt / "model.safetensors"
        qs.export_safetensors(made["groups"], made[fmt], format=fmt)
    (root / "sharded").mkdir()
    qs.export_safetensors(
        made["groups"], root / "sharded" / "model.safetensors", max_shard_size=200_000
    )
    made["sharded"] = root / "sharded" / "model.safetensors.index.json"
    assert made["sharded"].is_file()
    return made


def file_entry_bytes(path: Path) -> dict[str, int]:
    """Each entry's bytes, from the safetensors header itself."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    return {
        k: v["data_offsets"][1] - v["data_offsets"][0]
        for k, v in header.items()
        if k != "__metadata__"
    }


@pytest.mark.parametrize(
    "kind, layout",
    [
        ("groups", "groups"),
        ("packed", "packed"),
        ("compressed-tensors", "export"),
        ("qstream", "export"),
        ("sharded", "export"),
    ],
)
def test_every_layout_opens_as_a_quantized_checkpoint_with_the_same_values(outputs, kind, layout):
    ck = qs.open_quantized(outputs[kind])
    ref = qs.open_quantized(outputs["groups"])
    assert isinstance(ck, qs.QuantizedCheckpoint) and ck.layout == layout
    assert list(ck) == list(ck.tensors) == list(ck.keys()) and len(ck) == len(ck.tensors)
    # (an export may add entries of its own, e.g. a tied lm_head: the converted ones, in order)
    assert [n for n in ck if n in ref] == list(ref)
    assert "embed_tokens.weight" in ck and "nothing" not in ck and ck.get("nothing") is None
    with pytest.raises(KeyError):
        ck["nothing"]
    for name in ref:
        t, row, want = ck[name], ck.tensors[name], ref.tensors[name]
        assert row["shape"] == want["shape"] and row["kept"] == want["kept"]
        assert row["target"] == "keep" if want["kept"] else row["target"].startswith("int8/axis0")
        np.testing.assert_array_equal(np.asarray(t[...], np.float32), ref[name][...])
    summary = ck.summary()
    assert summary["layout"] == layout and summary["tensors"] is ck.tensors
    view = ck.view
    assert view.tensors == len(ck) and view.kept == sum(r["kept"] for r in ck.tensors.values())
    assert view.quantized == sum(not r["kept"] for r in ck.tensors.values())
    extra = [n for n in ck if n not in ref]  # an untied lm_head: the embedding's values
    assert view.quantized == sum(not r["kept"] for r in ref.tensors.values()) + len(extra)
    for name in extra:
        assert not ck.tensors[name]["kept"]
        np.testing.assert_array_equal(np.asarray(ck[name][...]), ref["embed_tokens.weight"][...])


def test_an_exports_rows_count_every_byte_of_its_entries(outputs):
    path = outputs["compressed-tensors"]
    ck = qs.open_quantized(path)
    entries = file_entry_bytes(path)
    assert sum(r["bytes_after"] for r in ck.tensors.values()) == sum(entries.values())
    row = ck.tensors["embed_tokens.weight"]
    assert (
        row["bytes_after"] == entries["embed_tokens.weight"] + entries["embed_tokens.weight_scale"]
    )
    assert ck.meta["format"] == "compressed-tensors"
    # the SQNR the conversion measured, as the export recorded it (kept tensors: none)
    measured = qs.open_quantized(outputs["groups"]).tensors["embed_tokens.weight"]["error"]
    assert row["error"] == {"sqnr_db": round(measured["sqnr_db"], 2)}
    assert all(r["error"] is None for r in ck.tensors.values() if r["kept"])


def test_a_safetensors_file_qstream_did_not_export_is_still_refused(tmp_path):
    save_file({"w": np.ones((4, 4), np.float32)}, str(tmp_path / "plain.safetensors"))
    with pytest.raises(qs.StoreError, match="not a qstream export"):
        qs.open_quantized(tmp_path / "plain.safetensors")


def test_a_gguf_file_opens_as_a_quantized_checkpoint_with_the_values_gguf_py_decodes(
    tmp_path, recwarn
):
    recipe = tmp_path / "q8.toml"
    recipe.write_text(
        '[defaults]\ndtype = "int8"\nblock_size = 32\naxis = -1\nmethod = "dynamic"\n'
        'scale_dtype = "float16"\n'
    )
    ref = qs.open_quantized(
        qs.convert_checkpoint(SAMPLE, tmp_path / "q8.zarr", recipe=recipe)["destination"]
    )
    path = tmp_path / "model.gguf"
    qs.export_gguf(tmp_path / "q8.zarr", path)
    ck = qs.open_quantized(path)
    assert not [w for w in recwarn if issubclass(w.category, qs.QStreamWarning)]
    assert isinstance(ck, qs.QuantizedCheckpoint) and ck.layout == "export"
    assert ck.meta["format"] == "gguf" and list(ck) == list(ref)  # (the source's own names)
    gguf = pytest.importorskip("gguf")
    reader = gguf.GGUFReader(str(path))
    stored = {t.name: t for t in reader.tensors}
    for name, row in ck.tensors.items():
        t = stored[name]
        assert row["shape"] == ref.tensors[name]["shape"]
        if ref.tensors[name]["kept"]:  # (a quantized one: the SQNR its conversion measured)
            assert row["error"] is None
        else:
            assert row["error"] == {"sqnr_db": round(ref.tensors[name]["error"]["sqnr_db"], 2)}
        assert row["bytes_after"] == int(t.n_bytes)
        assert row["kept"] == ref.tensors[name]["kept"]
        assert row["target"] == ("keep" if row["kept"] else t.tensor_type.name)
        want = gguf.quants.dequantize(t.data, t.tensor_type).reshape(row["shape"])
        np.testing.assert_array_equal(ck[name][...], want)
        np.testing.assert_array_equal(ck[name][...], ref[name][...].astype(np.float32))
    assert ck.view.quantized == sum(not r["kept"] for r in ref.tensors.values())


def test_a_gguf_header_is_parsed_once_to_open_and_describe_and_again_once_changed(
    tmp_path, monkeypatch
):
    """``open_quantized`` of a GGUF file reads its header to open it and to describe it
    (the SQNR qstream recorded): one parse while the file is unchanged; a file written anew
    at the same path is parsed anew."""
    from qstream.io.checkpoints import gguf_header

    parsed = []
    real = gguf_header._parse
    monkeypatch.setattr(gguf_header, "_parse", lambda *a: parsed.append(a[2]) or real(*a))
    path = tmp_path / "model.gguf"
    qs.export_gguf(SAMPLE, path)
    ck = qs.open_quantized(path)
    assert len(parsed) == 1 and any(r["error"] for r in ck.tensors.values())
    q4 = tmp_path / "q4.gguf"
    qs.export_gguf(SAMPLE, q4, type="Q4_0", pure=True)
    os.replace(q4, path)  # (another file at the same path)
    again = qs.open_quantized(path)
    assert len(parsed) == 2
    assert {r["target"] for r in again.tensors.values()} - {"keep"} == {"Q4_0"}
