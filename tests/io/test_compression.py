"""The ``compression`` option: how an output's chunks are stored. Every choice gives the same
values and report as the default; the files hold what was asked (raw chunks are the codes
themselves); a re-run under another compression is another job; bad spellings are refused
before anything is written."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import zarr
from typer.testing import CliRunner

import qstream as qs
from cli.main import app
from qstream.io.storage.compression import canonical

SPEC = qs.QuantSpec(dtype="int8", axis=0)  # per channel: codes one byte each
GROUPS = qs.QuantSpec(dtype="uint4", axis=1, block_size=32, method="dynamic", symmetric=False)


@pytest.fixture
def src(tmp_path) -> Path:
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((96, 256)) * np.exp(rng.normal(0, 0.5, (96, 1)))).astype(np.float32)
    path = tmp_path / "src.zarr"
    a = zarr.create_array(str(path), shape=x.shape, chunks=(32, 256), dtype="float32")
    a[...] = x
    return path


def _codecs(member: Path) -> list[dict]:
    """The compressors in a member's ``zarr.json`` (the codecs after the serializer)."""
    return json.loads((member / "zarr.json").read_text())["codecs"][1:]


def _values(dst) -> dict:
    q = qs.open_quantized(dst)
    return {
        "data": np.asarray(q.data[...]),
        "scale": np.asarray(q.scale[...]),
        "zero_point": np.asarray(q.zero_point[...]),
        "restored": q[...],
    }


def _same_values(a: dict, b: dict) -> None:
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
        assert a[k].dtype == b[k].dtype


def _same_report(a: qs.QuantReport, b: qs.QuantReport) -> None:
    da, db = a.to_dict(), b.to_dict()
    for k in ("error", "calibration", "bytes_written", "spec"):
        assert json.dumps(da[k], sort_keys=True) == json.dumps(db[k], sort_keys=True), k


@pytest.mark.parametrize(
    "given, want",
    [
        ("auto", "auto"),
        ("none", "none"),
        (None, "none"),
        (" None ", "none"),
        ("zstd", "zstd:0"),
        ("ZSTD:7", "zstd:7"),
        ("zstd:-5", "zstd:-5"),
        ("gzip", "gzip:5"),
        ("gzip:0", "gzip:0"),
        ("blosc", "blosc:zstd:5"),
        ("blosc:lz4", "blosc:lz4:5"),
        ("blosc:zlib:9", "blosc:zlib:9"),
    ],
)
def test_compression_spellings_are_read_one_way(given, want):
    assert canonical(given) == want


@pytest.mark.parametrize(
    "given, words",
    [
        ("lzma", "not one of"),
        ("", "not one of"),
        ("zstd:23", "from -131072 to 22"),
        ("gzip:10", "from 0 to 9"),
        ("gzip:fast", "from 0 to 9"),
        ("blosc:snappy", "lz4, lz4hc"),
        ("blosc:lz4:1:2", "not one of"),
        ("none:1", "not one of"),
        (5, "not int"),
    ],
)
def test_bad_compression_is_refused_before_anything_is_written(src, tmp_path, given, words):
    with pytest.raises(qs.InvalidParameterError, match=words):
        qs.quantize_store(src, tmp_path / "q.zarr", SPEC, compression=given)
    assert not (tmp_path / "q.zarr").exists()


@pytest.mark.parametrize(
    "compression, codec",
    [
        ("none", None),
        ("zstd:3", {"name": "zstd", "configuration": {"level": 3, "checksum": False}}),
        ("gzip:1", {"name": "gzip", "configuration": {"level": 1}}),
        ("blosc:lz4", {"name": "blosc", "configuration": {"cname": "lz4", "clevel": 5}}),
    ],
)
@pytest.mark.parametrize("spec", [SPEC, GROUPS], ids=["per-channel", "groups"])
def test_every_compression_gives_the_default_values_and_report(
    src, tmp_path, compression, codec, spec
):
    ref = qs.quantize_store(src, tmp_path / "auto.zarr", spec)
    out = tmp_path / "out.zarr"
    report = qs.quantize_store(src, out, spec, compression=compression)
    _same_values(_values(out), _values(tmp_path / "auto.zarr"))
    _same_report(report, ref)
    assert qs.open_quantized(out).summary()["compression"] == canonical(compression)
    members = ("data", "scale", "zero_point") if spec is SPEC else ("data",)
    for member in members:  # per-channel parameters follow the option too
        got = _codecs(out / member)
        if codec is None:
            assert got == []
        else:
            assert len(got) == 1 and got[0]["name"] == codec["name"]
            assert got[0]["configuration"].items() >= codec.get("configuration", {}).items()
    if spec is GROUPS:  # group scales are always raw
        assert _codecs(out / "scale") == _codecs(tmp_path / "auto.zarr" / "scale") == []
    # the zarr-python reader sees the same codes
    stored = zarr.open_array(str(out / "data"), mode="r")[...]
    np.testing.assert_array_equal(stored, zarr.open_array(str(tmp_path / "auto.zarr/data"))[...])


def test_raw_chunks_are_the_codes_themselves(src, tmp_path):
    out = tmp_path / "q.zarr"
    qs.quantize_store(src, out, SPEC, compression="none")
    codes = _values(out)["data"]
    chunks = zarr.open_array(str(out / "data"), mode="r").chunks
    files = sorted(p for p in (out / "data").iterdir() if p.name != "zarr.json")
    assert len(files) == -(-codes.shape[0] // chunks[0])
    for i, f in enumerate(files):
        rows = codes[i * chunks[0] : (i + 1) * chunks[0]]
        assert f.read_bytes() == rows.tobytes()


def test_default_output_keeps_the_sources_compressors(tmp_path):
    """``auto``: a Zarr v3 source's compressors for the codes, as before the option."""
    from zarr.codecs import GzipCodec

    x = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    a = zarr.create_array(
        str(tmp_path / "g.zarr"), shape=x.shape, dtype="float32", compressors=[GzipCodec(level=2)]
    )
    a[...] = x
    qs.quantize_store(tmp_path / "g.zarr", tmp_path / "q.zarr", SPEC)
    assert _codecs(tmp_path / "q.zarr/data") == [{"name": "gzip", "configuration": {"level": 2}}]
    qs.quantize_store(x, tmp_path / "n.zarr", SPEC)  # a NumPy source: zarr's default, zstd
    assert [c["name"] for c in _codecs(tmp_path / "n.zarr/data")] == ["zstd"]


def test_a_rerun_under_another_compression_is_another_job(src, tmp_path):
    out = tmp_path / "q.zarr"
    qs.quantize_store(src, out, SPEC, compression="none")
    assert qs.quantize_store(src, out, SPEC, compression=None).already_complete
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    for other in ("auto", "zstd"):
        with pytest.raises(qs.StoreError, match=r"different job.*overwrite=True"):
            qs.quantize_store(src, out, SPEC, compression=other)
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    report = qs.quantize_store(src, out, SPEC, compression="zstd", overwrite=True)
    assert not report.already_complete
    assert [c["name"] for c in _codecs(out / "data")] == ["zstd"]


def test_dequantize_compression(src, tmp_path):
    qs.quantize_store(src, tmp_path / "q.zarr", SPEC)
    qs.dequantize_store(tmp_path / "q.zarr", tmp_path / "auto.zarr")
    qs.dequantize_store(tmp_path / "q.zarr", tmp_path / "raw.zarr", compression="none")
    assert _codecs(tmp_path / "auto.zarr") == _codecs(tmp_path / "q.zarr/data")  # the codes'
    assert _codecs(tmp_path / "raw.zarr") == []
    a = zarr.open_array(str(tmp_path / "auto.zarr"))[...]
    b = zarr.open_array(str(tmp_path / "raw.zarr"))[...]
    np.testing.assert_array_equal(a, b)
    with pytest.raises(qs.StoreError, match=r"different job.*overwrite=True"):
        qs.dequantize_store(tmp_path / "q.zarr", tmp_path / "raw.zarr")
    again = qs.dequantize_store(tmp_path / "q.zarr", tmp_path / "raw.zarr", compression="none")
    assert again["already_complete"]


@pytest.fixture
def checkpoint(tmp_path) -> Path:
    from safetensors.numpy import save_file

    rng = np.random.default_rng(8)
    tensors = {
        "l0.weight": rng.standard_normal((64, 96)).astype(np.float32),
        "l1.weight": rng.standard_normal((32, 64)).astype(np.float32),
        "l0.bias": rng.standard_normal(96).astype(np.float32),  # kept (rank 1)
    }
    path = tmp_path / "m.safetensors"
    save_file(tensors, str(path))
    return path


RECIPE = qs.Recipe(defaults=qs.QuantSpec(dtype="int4", axis=1, block_size=32, method="dynamic"))


def test_convert_compression_reaches_every_tensor_and_is_part_of_the_job(checkpoint, tmp_path):
    ref = qs.convert_checkpoint(checkpoint, tmp_path / "auto", RECIPE)
    out = tmp_path / "raw"
    result = qs.convert_checkpoint(checkpoint, out, RECIPE, compression="none")
    assert result["compression"] == "none"
    for name in ("l0.weight", "l1.weight"):
        assert _codecs(out / name / "data") == []
        assert [c["name"] for c in _codecs(tmp_path / "auto" / name / "data")] == ["zstd"]
        _same_values(_values(out / name), _values(tmp_path / "auto" / name))
        assert result["tensors"][name]["error"] == ref["tensors"][name]["error"]
    assert _codecs(out / "l0.bias") == []  # kept tensors too
    np.testing.assert_array_equal(
        zarr.open_array(str(out / "l0.bias"))[...], zarr.open_array(str(tmp_path / "auto/l0.bias"))
    )
    assert qs.convert_checkpoint(checkpoint, out, RECIPE, compression="none")["already_complete"]
    with pytest.raises(qs.StoreError, match="overwrite"):
        qs.convert_checkpoint(checkpoint, out, RECIPE)


def test_conversion_begun_before_the_option_resumes_as_auto(checkpoint, tmp_path):
    """A root without ``compression`` (written before the option) is an ``auto`` run's."""
    out = tmp_path / "c"
    qs.convert_checkpoint(checkpoint, out, RECIPE)
    doc = json.loads((out / "zarr.json").read_text())
    meta = doc["attributes"]["qstream_checkpoint"]
    del meta["compression"]
    meta["complete"] = False
    (out / "zarr.json").write_text(json.dumps(doc))
    again = qs.convert_checkpoint(checkpoint, out, RECIPE)
    assert not again["already_complete"] and set(again["tensors"]) == {
        "l0.weight",
        "l1.weight",
        "l0.bias",
    }
    with pytest.raises(qs.StoreError, match="overwrite"):
        qs.convert_checkpoint(checkpoint, out, RECIPE, compression="none")


def test_convert_to_safetensors_writes_its_working_group_raw(checkpoint, tmp_path):
    from safetensors.numpy import load_file

    seen = []

    def on_tensor(ev):
        if ev.result is not None and not ev.result["kept"]:
            work = tmp_path / "m8.safetensors.qstream-work" / ev.name / "data"
            seen.append(_codecs(work))

    dst = tmp_path / "m8.safetensors"
    qs.convert_checkpoint(checkpoint, dst, RECIPE, on_tensor=on_tensor)
    assert seen == [[], []]
    qs.convert_checkpoint(checkpoint, tmp_path / "z", RECIPE)  # zstd, then exported
    qs.export_safetensors(tmp_path / "z", tmp_path / "e.safetensors")
    a, b = load_file(str(dst)), load_file(str(tmp_path / "e.safetensors"))
    assert set(a) == set(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes()
    with pytest.raises(qs.InvalidParameterError, match="safetensors"):
        qs.convert_checkpoint(checkpoint, tmp_path / "x.safetensors", RECIPE, compression="zstd")
    assert not [p for p in os.listdir(tmp_path) if p.startswith("x.")]


def test_cli_compression_option_and_its_mistakes(src, tmp_path):
    runner = CliRunner()
    r = runner.invoke(
        app, ["quantize", str(src), str(tmp_path / "q.zarr"), "--compression", "none", "-q"]
    )
    assert r.exit_code == 0, r.output
    assert _codecs(tmp_path / "q.zarr/data") == []
    r = runner.invoke(
        app,
        ["dequantize", str(tmp_path / "q.zarr"), str(tmp_path / "d.zarr"), "--compression", "gzip"],
    )
    assert r.exit_code == 0, r.output
    assert _codecs(tmp_path / "d.zarr") == [{"name": "gzip", "configuration": {"level": 5}}]
    r = runner.invoke(
        app, ["quantize", str(src), str(tmp_path / "b.zarr"), "--compression", "zstd:99"]
    )
    assert r.exit_code != 0 and "zstd level must be an integer" in r.output
    assert not (tmp_path / "b.zarr").exists()


def test_blosc_chunks_of_multi_byte_values_are_the_bytes_zarr_writes(src, tmp_path):
    """qstream's own chunk writer shuffles with the typesize zarr records (float32: 4)."""
    qs.quantize_store(src, tmp_path / "q.zarr", SPEC)
    qs.dequantize_store(tmp_path / "q.zarr", tmp_path / "d.zarr", compression="blosc:lz4")
    d = zarr.open_array(str(tmp_path / "d.zarr"))
    assert _codecs(tmp_path / "d.zarr")[0]["configuration"]["typesize"] == 4
    z = zarr.create_array(
        str(tmp_path / "z.zarr"),
        shape=d.shape,
        chunks=d.chunks,
        dtype=d.dtype,
        compressors=d.compressors,
        chunk_key_encoding={"name": "default", "separator": "."},
    )
    z[...] = d[...]
    files = sorted(p.name for p in (tmp_path / "d.zarr").iterdir() if p.name.startswith("c."))
    assert files
    for f in files:
        assert (tmp_path / "d.zarr" / f).read_bytes() == (tmp_path / "z.zarr" / f).read_bytes()
