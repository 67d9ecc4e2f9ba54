"""Exports that inference stacks load, checked with the real loaders in fresh processes:
transformers through compressed-tensors, and gguf-py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file
from typer.testing import CliRunner

import qstream as qs
from cli.main import app
from tests.support.fresh import run
from tests.support.llama_folder import write_tokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
LOADER = os.path.join(os.path.dirname(HERE), "support", "hf_loader.py")
INT4_G128 = {
    "defaults": {"dtype": "int4", "axis": 1, "block_size": 128, "method": "dynamic"},
    "rules": [{"pattern": "*embed*", "action": "keep"}, {"pattern": "lm_head*", "action": "keep"}],
}


def fresh(*args, check=True) -> subprocess.CompletedProcess:
    """A fresh Python process (qstream never imported there: tests/support/fresh.py)."""
    r = run([*args], env={**os.environ, "PYTHONWARNINGS": "ignore"}, timeout=600)
    if check:
        assert r.returncode == 0, r.stderr[-3000:]
    return r


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    pytest.importorskip("transformers")
    pytest.importorskip("compressed_tensors")
    folder = tmp_path_factory.mktemp("llama")
    fresh(LOADER, "build", folder, 256)
    write_tokenizer(str(folder))
    return folder


def expected(zarr_out, path) -> str:
    """qstream's dequantization of every quantized tensor of a converted output (.npz)."""
    root = qs.open_quantized(zarr_out)
    arrays = {n: root[n][...] for n in root if isinstance(root[n], qs.QuantizedArray)}
    np.savez(path, **arrays)
    return str(path)


def convert_both(llama, tmp_path, recipe, tag):
    """Convert to a loadable export and to a Zarr output (the reference), same recipe."""
    recipe = qs.Recipe.from_dict(recipe) if recipe else None
    out = tmp_path / tag / "model.safetensors"
    out.parent.mkdir()
    qs.convert_checkpoint(llama, out, recipe)
    qs.convert_checkpoint(llama, tmp_path / f"{tag}.zarr", recipe)
    return out.parent, expected(tmp_path / f"{tag}.zarr", tmp_path / f"{tag}.npz")


def loaded(folder, npz, *extra) -> dict:
    return json.loads(fresh(LOADER, "load", folder, npz, *extra).stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "tag,recipe",
    [
        ("int8-channel", None),  # the default recipe: every 2-D tensor, embeddings included
        ("int4-g128", INT4_G128),
        ("int4-g128-full", {**INT4_G128, "defaults": {
            **INT4_G128["defaults"], "symmetric_levels": "full"}}),
        ("uint8-asym", {"defaults": {"dtype": "uint8", "axis": 0, "symmetric": False}}),
    ],
)  # fmt: skip
def test_transformers_loads_the_export_bit_identical_to_qstream_dequantize(
    llama, tmp_path, tag, recipe
):
    folder, npz = convert_both(llama, tmp_path, recipe, tag)
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "llama"  # the source's config, merged
    qc = config["quantization_config"]
    assert qc["quantization_status"] == "compressed"
    assert all("format" in g for g in qc["config_groups"].values())
    got = loaded(folder, npz)
    assert got["quantized"] > 0 and got["bit_exact"] == got["quantized"], got
    assert got["logits_equal"], got
    assert got["max_weight"] < 1.0  # weights, not codes


def test_packed_int4_export_layout_and_size(llama, tmp_path):
    int8, _ = convert_both(llama, tmp_path, {"defaults": {"dtype": "int8", "axis": 0}}, "i8")
    int4, _ = convert_both(
        llama,
        tmp_path,
        {
            "defaults": {
                "dtype": "int4",
                "axis": 1,
                "block_size": 128,
                "method": "dynamic",
                "scale_dtype": "float16",  # as llm-compressor's W4A16 (16-bit scales)
            },
            # (a 4-bit Embedding does not load in transformers: 8 bits, as in the int8 export)
            "rules": [
                {
                    "pattern": "*embed*",
                    "spec": {"dtype": "int8", "axis": 0, "block_size": None, "method": "minmax"},
                }
            ],
        },
        "i4",
    )
    t = load_file(str(int4 / "model.safetensors"))
    w = "model.layers.0.mlp.up_proj."
    assert t[w + "weight_packed"].dtype == np.int32 and t[w + "weight_packed"].shape == (512, 32)
    assert t[w + "weight_shape"].tolist() == [512, 256]
    assert t[w + "weight_scale"].shape == (512, 2)
    root = qs.open_quantized(tmp_path / "i4.zarr")
    codes = root[w + "weight"].quantized(...).astype(np.int64)
    words = t[w + "weight_packed"].view(np.uint32).astype(np.int64)
    nibbles = (words[:, :, None] >> (4 * np.arange(8))) & 15  # element c at bits 4 * (c % 8)
    np.testing.assert_array_equal(nibbles.reshape(512, 256) - 8, codes)
    ratio = os.path.getsize(int4 / "model.safetensors") / os.path.getsize(
        int8 / "model.safetensors"
    )
    assert ratio <= 0.55, ratio


def test_asymmetric_int4_loads_exactly_with_dequantize_and_never_silently_wrong(llama, tmp_path):
    recipe = {**INT4_G128, "defaults": {"dtype": "uint4", "axis": 1, "block_size": 64,
                                         "method": "dynamic", "symmetric": False}}  # fmt: skip
    folder, npz = convert_both(llama, tmp_path, recipe, "u4")
    t = load_file(str(folder / "model.safetensors"))
    assert t["model.layers.0.mlp.up_proj.weight_zero_point"].shape == (512 // 8, 4)  # packed
    got = loaded(folder, npz, "--dequantize")
    assert got["bit_exact"] == got["quantized"] > 0 and got["logits_equal"], got
    # transformers' default path cannot take packed 4-bit zero points: it fails, loudly
    r = fresh(LOADER, "load", folder, npz, check=False)
    assert r.returncode != 0


def test_export_without_a_model_config_writes_the_quantization_config_alone(tmp_path):
    rng = np.random.default_rng(0)
    save_file(
        {"a.weight": rng.standard_normal((16, 64)).astype(np.float32)},
        str(tmp_path / "m.safetensors"),
    )
    qs.convert_checkpoint(tmp_path / "m.safetensors", tmp_path / "q.zarr")
    (tmp_path / "out").mkdir()
    result = qs.export_safetensors(tmp_path / "q.zarr", tmp_path / "out" / "model.safetensors")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert "model_type" not in config and config["quantization_config"]["config_groups"]
    assert result["loader"].startswith("transformers")
    # given one, the model's config is merged (and one qstream did not write is refused)
    (tmp_path / "cfg.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    qs.export_safetensors(
        tmp_path / "q.zarr", tmp_path / "out" / "model.safetensors", config=tmp_path / "cfg.json",
        overwrite=True,
    )  # fmt: skip
    assert json.loads((tmp_path / "out" / "config.json").read_text())["hidden_size"] == 64


def test_a_config_json_qstream_did_not_write_is_never_replaced(tmp_path):
    rng = np.random.default_rng(0)
    save_file(
        {"a.weight": rng.standard_normal((16, 64)).astype(np.float32)},
        str(tmp_path / "m.safetensors"),
    )
    (tmp_path / "out").mkdir()
    mine = tmp_path / "out" / "config.json"
    mine.write_text('{"model_type": "mine"}')
    for overwrite in (False, True):
        with pytest.raises(qs.StoreError, match="not a qstream export"):
            qs.convert_checkpoint(
                tmp_path / "m.safetensors",
                tmp_path / "out" / "model.safetensors",
                overwrite=overwrite,
            )
    assert mine.read_text() == '{"model_type": "mine"}'
    assert sorted(os.listdir(tmp_path / "out")) == ["config.json"]


def test_an_export_never_replaces_the_config_json_of_another_export_in_its_folder(tmp_path):
    """A folder holds one model config: an export of another name there (a conversion, an
    export, a scheme) is refused before any work while the first export is there (with
    overwrite too), and the first stays described by its own config; once it is gone, the
    second is written."""
    rng = np.random.default_rng(0)
    weights = {f"l{i}.weight": rng.standard_normal((32, 64)).astype(np.float32) for i in range(2)}
    save_file(weights, str(tmp_path / "m.safetensors"))
    folder = tmp_path / "out"
    folder.mkdir()
    qs.convert_checkpoint(tmp_path / "m.safetensors", folder / "a.safetensors")
    config = (folder / "config.json").read_bytes()
    assert json.loads(config)["qstream_export"]["weights"] == "a.safetensors"
    before = {n: (folder / n).read_bytes() for n in os.listdir(folder)}
    int4 = qs.Recipe.from_dict({"defaults": INT4_G128["defaults"] | {"block_size": 32}})
    runner = CliRunner()
    for overwrite in (False, True):
        with pytest.raises(qs.StoreError, match=r"describes the export .*a\.safetensors"):
            qs.convert_checkpoint(
                tmp_path / "m.safetensors", folder / "b.safetensors", int4, overwrite=overwrite
            )
        args = ["convert", str(tmp_path / "m.safetensors"), str(folder / "c.safetensors")]
        r = runner.invoke(app, [*args, "--scheme", "FP8_DYNAMIC", *(["--overwrite"] * overwrite)])
        assert r.exit_code == 2 and "a.safetensors" in r.output, r.output
    assert {n: (folder / n).read_bytes() for n in os.listdir(folder)} == before
    # the first export's rerun is still complete, described by its own config
    qs.convert_checkpoint(tmp_path / "m.safetensors", folder / "a.safetensors")
    assert {n: (folder / n).read_bytes() for n in os.listdir(folder)} == before
    # the same conversion under another name: the same config, shared as it is
    qs.convert_checkpoint(tmp_path / "m.safetensors", folder / "a2.safetensors")
    assert (folder / "config.json").read_bytes() == config
    assert (folder / "a2.safetensors").read_bytes() == before["a.safetensors"]
    (folder / "a.safetensors").unlink()
    (folder / "a2.safetensors").unlink()
    qs.convert_checkpoint(tmp_path / "m.safetensors", folder / "b.safetensors", int4)
    written = json.loads((folder / "config.json").read_text())
    assert written["qstream_export"]["weights"] == "b.safetensors"
    assert written["quantization_config"]["config_groups"]["group_0"]["weights"]["num_bits"] == 4


@pytest.mark.parametrize(
    "spec,named",
    [
        ({"dtype": "float8_e4m3fn", "axis": 0}, "float8_e4m3fn codes"),
        ({"dtype": "int8", "axis": 1}, "one scale per input column"),
        ({"dtype": "int4", "axis": 1, "block_size": 48, "method": "dynamic"}, "do not divide"),
        ({"dtype": "int4", "axis": 0, "block_size": 8, "method": "dynamic"}, "output axis"),
    ],
)
def test_an_export_the_loader_cannot_read_is_refused_before_any_work(tmp_path, spec, named):
    rng = np.random.default_rng(0)
    save_file(
        {"l.weight": rng.standard_normal((16, 64)).astype(np.float32)},
        str(tmp_path / "m.safetensors"),
    )
    (tmp_path / "out").mkdir()
    recipe = qs.Recipe.from_dict({"defaults": spec})
    with pytest.raises(qs.InvalidParameterError, match=f"l.weight: .*{named}"):
        qs.convert_checkpoint(
            tmp_path / "m.safetensors", tmp_path / "out" / "m.safetensors", recipe
        )
    assert os.listdir(tmp_path / "out") == []
    qs.convert_checkpoint(tmp_path / "m.safetensors", tmp_path / "q.zarr", recipe)
    with pytest.raises(qs.InvalidParameterError, match=named):
        qs.export_safetensors(tmp_path / "q.zarr", tmp_path / "out" / "e.safetensors")
    assert os.listdir(tmp_path / "out") == []
    qs.export_safetensors(tmp_path / "q.zarr", tmp_path / "out" / "e.safetensors", format="qstream")
    assert os.listdir(tmp_path / "out") == ["e.safetensors"]  # qstream's layout: no config


# --- GGUF ---------------------------------------------------------------------------------


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's q/k row order (its converter's permute)."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


@pytest.mark.parametrize(
    "recipe,types",
    [
        (None, {"Q8_0"}),
        (
            {"defaults": {"dtype": "int4", "axis": 1, "block_size": 32, "method": "dynamic"}},
            {"Q4_0"},
        ),
        (
            {"defaults": {"dtype": "uint4", "axis": 1, "block_size": 32, "method": "dynamic",
                          "symmetric": False}},
            {"Q4_1"},
        ),
    ],
)  # fmt: skip
def test_gguf_export_equals_gguf_py_quantize_then_dequantize_bit_for_bit(
    llama, tmp_path, recipe, types
):
    gguf = pytest.importorskip("gguf")
    out = tmp_path / "m.gguf"
    result = qs.convert_checkpoint(llama, out, qs.Recipe.from_dict(recipe) if recipe else None)
    assert set(result["tensors"].values()) - {"F32"} == types
    source = load_file(str(llama / "model.safetensors"))
    config = json.loads((llama / "config.json").read_text())
    reader = gguf.GGUFReader(str(out))
    assert bytes(reader.fields["general.architecture"].parts[-1]).decode() == "llama"
    assert int(reader.fields["llama.block_count"].parts[-1][0]) == 2
    assert int(reader.fields["llama.attention.head_count_kv"].parts[-1][0]) == 2
    tensors = {t.name: t for t in reader.tensors}
    mapping = {
        "model.embed_tokens.weight": "token_embd.weight",
        "lm_head.weight": "output.weight",
        "model.norm.weight": "output_norm.weight",
        "model.layers.1.self_attn.q_proj.weight": "blk.1.attn_q.weight",
        "model.layers.1.self_attn.k_proj.weight": "blk.1.attn_k.weight",
        "model.layers.0.mlp.down_proj.weight": "blk.0.ffn_down.weight",
    }
    assert len(tensors) == len(source)
    for hf, name in mapping.items():
        x = source[hf]
        if "q_proj" in hf:
            x = _permute(x, config["num_attention_heads"])
        if "k_proj" in hf:
            x = _permute(x, config["num_key_value_heads"])
        t = tensors[name]
        kind = t.tensor_type
        want = gguf.quants.dequantize(gguf.quants.quantize(x, kind), kind)
        got = gguf.quants.dequantize(t.data, kind)
        assert got.shape == x.shape
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_gguf_from_a_qstream_output_equals_qstream_dequantize(tmp_path):
    gguf = pytest.importorskip("gguf")
    rng = np.random.default_rng(4)
    tensors = {
        "a.weight": rng.standard_normal((24, 128)).astype(np.float32),
        "b.weight": rng.standard_normal((16, 256)).astype(np.float32),
        "n": rng.standard_normal(64).astype(np.float32),
    }
    save_file(tensors, str(tmp_path / "m.safetensors"))
    recipe = qs.Recipe.from_dict({
        "defaults": {"dtype": "int8", "axis": 0, "scale_dtype": "float16"},
        "rules": [{"pattern": "b.*", "spec": {"dtype": "int4", "axis": 1, "block_size": 64,
                   "method": "dynamic", "scale_dtype": "float16"}}],
    })  # fmt: skip
    qs.convert_checkpoint(tmp_path / "m.safetensors", tmp_path / "q.zarr", recipe)
    result = qs.export_gguf(tmp_path / "q.zarr", tmp_path / "q.gguf")
    assert result["tensors"] == {"a.weight": "Q8_0", "b.weight": "Q4_0", "n": "F32"}
    root = qs.open_quantized(tmp_path / "q.zarr")
    for t in gguf.GGUFReader(str(tmp_path / "q.gguf")).tensors:
        got = gguf.quants.dequantize(t.data, t.tensor_type)
        np.testing.assert_array_equal(got.view(np.uint32), root[t.name][...].view(np.uint32))
    # float32 scales that float16 does not hold: refused, naming the tensor, nothing written
    qs.convert_checkpoint(tmp_path / "m.safetensors", tmp_path / "f.zarr")
    with pytest.raises(qs.InvalidParameterError, match=r"a\.weight: float32 scales"):
        qs.export_gguf(tmp_path / "f.zarr", tmp_path / "f.gguf")
    assert not (tmp_path / "f.gguf").exists()


def test_gguf_refuses_nonfinite_values_and_foreign_files_and_reruns_idempotently(tmp_path):
    x = np.ones((4, 64), np.float32)
    x[1, 3] = np.nan
    save_file({"w": x}, str(tmp_path / "m.safetensors"))
    with pytest.raises(qs.NonFiniteInputError, match="w: holds NaN"):
        qs.convert_checkpoint(tmp_path / "m.safetensors", tmp_path / "m.gguf")
    assert os.listdir(tmp_path) == ["m.safetensors"]  # no partial file left
    save_file({"w": np.ones((4, 64), np.float32)}, str(tmp_path / "m.safetensors"))
    assert not qs.convert_checkpoint(tmp_path / "m.safetensors", tmp_path / "m.gguf")[
        "already_complete"
    ]
    assert qs.convert_checkpoint(tmp_path / "m.safetensors", tmp_path / "m.gguf")[
        "already_complete"
    ]
    (tmp_path / "x.gguf").write_bytes(b"not mine")
    with pytest.raises(qs.StoreError, match="not a qstream export"):
        qs.convert_checkpoint(tmp_path / "m.safetensors", tmp_path / "x.gguf", overwrite=True)
    assert (tmp_path / "x.gguf").read_bytes() == b"not mine"


def test_first_int4_conversion_in_a_fresh_process_registers_the_zarr_types(tmp_path):
    rng = np.random.default_rng(0)
    save_file(
        {"w.weight": rng.standard_normal((8, 64)).astype(np.float32)},
        str(tmp_path / "m.safetensors"),
    )
    (tmp_path / "r.toml").write_text(
        '[defaults]\ndtype = "int4"\naxis = 1\nblock_size = 32\nmethod = "dynamic"\n'
    )
    r = subprocess.run(
        [sys.executable, "-c", "from cli.main import main; main()", "convert",
         "m.safetensors", "out.zarr", "--recipe", "r.toml", "--quiet"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert qs.open_quantized(tmp_path / "out.zarr")["w.weight"].qtype.name == "int4"


def test_outputs_with_float_offsets_are_refused_by_the_integer_layouts(tmp_path):
    import zarr

    x = (np.random.default_rng(5).uniform(262, 297, (8, 64))).astype(np.float32)
    zarr.create_array(str(tmp_path / "t.zarr"), shape=x.shape, dtype="f4")[...] = x
    spec = qs.QuantSpec(dtype="uint8", symmetric=False, offset="range")
    qs.quantize_store(str(tmp_path / "t.zarr"), str(tmp_path / "q.zarr"), spec)
    for fmt in ("compressed-tensors", "qstream"):
        with pytest.raises(qs.InvalidParameterError, match="float offset"):
            qs.export_safetensors(tmp_path / "q.zarr", tmp_path / "e.safetensors", format=fmt)
    with pytest.raises(qs.InvalidParameterError, match="float offset"):
        qs.export_gguf(tmp_path / "q.zarr", tmp_path / "e.gguf")
    qs.export_safetensors(tmp_path / "q.zarr", tmp_path / "e.safetensors", format="dequantized")
    got = load_file(str(tmp_path / "e.safetensors"))["weight"]
    np.testing.assert_array_equal(got, qs.open_quantized(tmp_path / "q.zarr")[...])


@pytest.mark.parametrize("fmt", ["compressed-tensors", "qstream"])
def test_exports_read_back_as_qstream_dequantize_gives_them(tmp_path, fmt):
    rng = np.random.default_rng(8)
    tensors = {
        "a.weight": rng.standard_normal((40, 128)).astype(np.float32),
        "b.weight": rng.standard_normal((24, 256)).astype(np.float32),
        "c.weight": rng.standard_normal((20, 64)).astype(np.float32) + 0.3,
        "d.weight": rng.standard_normal((12, 128)).astype(np.float32),
        "e.weight": rng.standard_normal((16, 64)).astype(np.float32),
        "norm": rng.standard_normal(64).astype(np.float32),
    }
    save_file(tensors, str(tmp_path / "m.safetensors"))
    rules = [
        {"pattern": "b.*", "spec": {"dtype": "int4", "axis": 1, "block_size": 128,
                                    "method": "dynamic"}},
        {"pattern": "c.*", "spec": {"dtype": "uint8", "axis": 0, "symmetric": False}},
        {"pattern": "d.*", "spec": {"dtype": "uint4", "axis": 1, "block_size": 32,
                                    "method": "dynamic", "symmetric": False}},
        {"pattern": "e.*", "spec": {"dtype": "int8", "axis": None}},
    ]  # fmt: skip
    if fmt == "qstream":  # every type and granularity qstream's own layout holds
        rules += [
            {"pattern": "a.*", "spec": {"dtype": "float8_e4m3fn", "axis": 0}},
            {"pattern": "f.*", "spec": {"dtype": "int8", "axis": 0, "block_size": 4,
                                        "method": "dynamic"}},
            {"pattern": "g.*", "spec": {"dtype": "float4_e2m1fn", "axis": 0}},
            {"pattern": "h.*", "spec": {"dtype": "float8_e4m3fnuz", "axis": 1}},
            {"pattern": "t3", "spec": {"dtype": "int4", "axis": 2, "block_size": 8,
                                       "method": "dynamic"}},
        ]  # fmt: skip
        extra = {
            "f.weight": rng.standard_normal((18, 32)).astype(np.float32),
            "g.weight": rng.standard_normal((10, 32)).astype(np.float32),
            "h.weight": rng.standard_normal((10, 32)).astype(np.float32),
            "t3": rng.standard_normal((3, 5, 16)).astype(np.float32),
        }
        save_file({**tensors, **extra}, str(tmp_path / "m.safetensors"))
    recipe = qs.Recipe.from_dict({"defaults": {"dtype": "int8", "axis": 0}, "rules": rules})
    qs.convert_checkpoint(tmp_path / "m.safetensors", tmp_path / "q.zarr", recipe)
    (tmp_path / "x").mkdir()
    out = tmp_path / "x" / "model.safetensors"
    qs.export_safetensors(tmp_path / "q.zarr", out, format=fmt, max_shard_size=6000)
    index = tmp_path / "x" / "model.safetensors.index.json"
    assert index.exists()  # sharded: read through the index
    back, root = qs.open_quantized(index), qs.open_quantized(tmp_path / "q.zarr")
    assert list(back) == list(root)
    for n in root:
        want = root[n][...]
        np.testing.assert_array_equal(
            np.asarray(back[n][...]).view(np.uint32), want.view(np.uint32)
        )
        if want.ndim == 2:
            np.testing.assert_array_equal(back[n][3:7, 5:9], want[3:7, 5:9])
    r = CliRunner().invoke(app, ["dequantize", str(index), str(tmp_path / "d.zarr"), "-q"])
    assert r.exit_code == 0, r.output
    d = qs.open_quantized(tmp_path / "d.zarr")
    for n in root:
        np.testing.assert_array_equal(d[n][...], root[n][...])


def test_gguf_permutes_q_and_k_biases_and_reads_big_tensors_by_slabs(tmp_path):
    gguf = pytest.importorskip("gguf")
    rng = np.random.default_rng(9)
    heads, kv, hidden = 4, 2, 64
    t = {
        "model.layers.0.self_attn.q_proj.weight": rng.standard_normal((hidden, hidden)),
        "model.layers.0.self_attn.q_proj.bias": rng.standard_normal(hidden),
        "model.layers.0.self_attn.k_proj.weight": rng.standard_normal((hidden // 2, hidden)),
        "model.layers.0.self_attn.k_proj.bias": rng.standard_normal(hidden // 2),
        "model.embed_tokens.weight": rng.standard_normal((96, hidden)),
    }
    save_file({k: v.astype(np.float32) for k, v in t.items()}, str(tmp_path / "model.safetensors"))
    config = {"model_type": "llama", "num_attention_heads": heads, "num_key_value_heads": kv,
              "hidden_size": hidden, "num_hidden_layers": 1, "intermediate_size": 128,
              "vocab_size": 96}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    recipe = qs.Recipe.from_dict({"min_rank": 1})
    qs.export_gguf(tmp_path / "model.safetensors", tmp_path / "m.gguf", recipe=recipe,
                   max_memory=1 << 20, tokenizer=False)  # fmt: skip
    got = {x.name: x for x in gguf.GGUFReader(str(tmp_path / "m.gguf")).tensors}
    for hf, name, n in [
        ("model.layers.0.self_attn.q_proj.bias", "blk.0.attn_q.bias", heads),
        ("model.layers.0.self_attn.k_proj.bias", "blk.0.attn_k.bias", kv),
        ("model.layers.0.self_attn.q_proj.weight", "blk.0.attn_q.weight", heads),
        ("model.layers.0.self_attn.k_proj.weight", "blk.0.attn_k.weight", kv),
    ]:
        x = _permute(t[hf].astype(np.float32), n)
        r = got[name]
        if r.tensor_type == gguf.GGMLQuantizationType.F32:
            np.testing.assert_array_equal(np.asarray(r.data).reshape(x.shape), x)
        else:
            want = gguf.quants.dequantize(gguf.quants.quantize(x, r.tensor_type), r.tensor_type)
            np.testing.assert_array_equal(gguf.quants.dequantize(r.data, r.tensor_type), want)


def test_a_re_export_in_another_form_leaves_no_stale_file_and_a_changed_source_is_redone(
    tmp_path,
):
    rng = np.random.default_rng(10)
    save_file({f"l{i}.weight": rng.standard_normal((32, 64)).astype(np.float32) for i in range(4)},
              str(tmp_path / "m.safetensors"))  # fmt: skip
    qs.convert_checkpoint(tmp_path / "m.safetensors", tmp_path / "q.zarr")
    (tmp_path / "x").mkdir()
    out = tmp_path / "x" / "model.safetensors"
    qs.export_safetensors(tmp_path / "q.zarr", out)
    qs.export_safetensors(tmp_path / "q.zarr", out, max_shard_size=3000, overwrite=True)
    names = sorted(os.listdir(tmp_path / "x"))
    assert "model.safetensors" not in names and "model.safetensors.index.json" in names
    qs.export_safetensors(tmp_path / "q.zarr", out, overwrite=True)  # back to one file
    assert sorted(os.listdir(tmp_path / "x")) == ["config.json", "model.safetensors"]
    assert qs.export_safetensors(tmp_path / "q.zarr", out)["already_complete"]
    # the folder of an export reads as its values (not its codes as weights)
    back = qs.open_quantized(out)
    qs.convert_checkpoint(tmp_path / "x", tmp_path / "again.zarr")
    again = qs.open_quantized(tmp_path / "again.zarr")
    assert sorted(again) == sorted(back)
    # a GGUF of a source that changed is not "already complete"
    qs.convert_checkpoint(tmp_path / "m.safetensors", tmp_path / "m.gguf")
    save_file({f"l{i}.weight": np.ones((32, 64), np.float32) for i in range(4)},
              str(tmp_path / "m.safetensors"))  # fmt: skip
    with pytest.raises(qs.StoreError, match="holds another export"):
        qs.convert_checkpoint(tmp_path / "m.safetensors", tmp_path / "m.gguf")
    # missing folders are made (every command's rule)
    qs.export_safetensors(tmp_path / "q.zarr", tmp_path / "nowhere" / "e.safetensors")
    assert (tmp_path / "nowhere" / "e.safetensors").is_file()


# --- the model config: only from what the user named ---------------------------------------

SECRET = "registry-token-9f3a1c"


def _crafted_source(tmp_path):
    """A converted checkpoint whose root names, as its source, a folder holding a secret
    config.json (as ``~/.docker/config.json`` does)."""
    save_file(
        {"a.weight": np.random.default_rng(0).standard_normal((16, 64)).astype(np.float32)},
        str(tmp_path / "m.safetensors"),
    )
    q = tmp_path / "q.zarr"
    recipe = {"defaults": {"dtype": "int8", "axis": 0, "scale_dtype": "float16"}}  # (GGUF too)
    qs.convert_checkpoint(tmp_path / "m.safetensors", q, qs.Recipe.from_dict(recipe))
    victim = tmp_path / "victim"
    victim.mkdir()
    secret = {"model_type": "llama", "num_attention_heads": 4, "num_key_value_heads": 4,
              "auths": {"registry.example": {"auth": SECRET}}}  # fmt: skip
    (victim / "config.json").write_text(json.dumps(secret))
    (victim / "model.safetensors").write_bytes(b"")
    return q, victim


@pytest.mark.parametrize("recorded", ["folder", "file"])
def test_an_export_never_reads_a_config_where_the_outputs_metadata_says_its_source_was(
    tmp_path, recorded
):
    q, victim = _crafted_source(tmp_path)
    doc = json.loads((q / "zarr.json").read_text())
    where = victim if recorded == "folder" else victim / "model.safetensors"
    doc["attributes"]["qstream_checkpoint"]["source"] = str(where)
    (q / "zarr.json").write_text(json.dumps(doc))
    (tmp_path / "api").mkdir()
    result = qs.export_safetensors(q, tmp_path / "api" / "model.safetensors")
    (tmp_path / "cli").mkdir()
    r = CliRunner().invoke(app, ["export", str(q), str(tmp_path / "cli" / "model.safetensors")])
    assert r.exit_code == 0, r.output
    assert "quantization_config only" in r.output and "--config" in r.output
    for folder in ("api", "cli"):
        text = (tmp_path / folder / "config.json").read_text()
        assert SECRET not in text and "auths" not in text and "model_type" not in text
        assert json.loads(text)["quantization_config"]["config_groups"]
    assert result["config"] == str(tmp_path / "api" / "config.json")
    # nor a GGUF (its config: --config, or the one kept inside SRC)
    qs.export_gguf(q, tmp_path / "m.gguf")
    assert SECRET.encode() not in (tmp_path / "m.gguf").read_bytes()
    # the recorded source is shown as provenance
    shown = CliRunner().invoke(app, ["inspect", str(q)])
    assert shown.exit_code == 0 and f"from {where}" in shown.output, shown.output
    # what the user names is used: --config, or a config.json kept inside the output itself
    (tmp_path / "cfg.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    again = ["export", str(q), str(tmp_path / "cli" / "model.safetensors")]
    r = CliRunner().invoke(app, [*again, "--config", str(tmp_path / "cfg.json"), "--overwrite"])
    assert r.exit_code == 0, r.output
    merged = json.loads((tmp_path / "cli" / "config.json").read_text())
    assert merged["hidden_size"] == 64 and merged["quantization_config"]
    (q / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 32}))
    (tmp_path / "own").mkdir()
    qs.export_safetensors(q, tmp_path / "own" / "model.safetensors")
    assert json.loads((tmp_path / "own" / "config.json").read_text())["hidden_size"] == 32


def test_a_config_json_link_inside_an_output_is_refused_not_followed(tmp_path):
    q, victim = _crafted_source(tmp_path)
    (q / "config.json").symlink_to(victim / "config.json")
    (tmp_path / "out").mkdir()
    with pytest.raises(qs.StoreError, match="is a link"):
        qs.export_safetensors(q, tmp_path / "out" / "model.safetensors")
    assert os.listdir(tmp_path / "out") == []
    # with the user's own config named, the link is not needed (and still not read)
    (tmp_path / "cfg.json").write_text(json.dumps({"model_type": "llama"}))
    qs.export_safetensors(q, tmp_path / "out" / "model.safetensors", config=tmp_path / "cfg.json")
    assert SECRET not in (tmp_path / "out" / "config.json").read_text()


def test_the_source_config_helper_finds_the_config_of_the_checkpoint_the_user_named(tmp_path):
    from qstream.exports.safetensors import source_config

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    (tmp_path / "model" / "model.safetensors").write_bytes(b"")
    want = str(tmp_path / "model" / "config.json")
    assert source_config(tmp_path / "model") == want
    assert source_config(tmp_path / "model" / "model.safetensors") == want
    assert source_config(tmp_path / "none") is None
    assert source_config("s3://bucket/model") is None


def test_an_export_of_something_not_a_qstream_output_is_refused_by_name(tmp_path):
    q, _ = _crafted_source(tmp_path)
    qs.export_safetensors(q, tmp_path / "e.safetensors", format="qstream")
    with pytest.raises(qs.InvalidParameterError, match="not a qstream output"):
        qs.export_safetensors(tmp_path / "e.safetensors", tmp_path / "f.safetensors")


class _Recorder:
    """A progress reporter that keeps what it is told."""

    def __init__(self) -> None:
        self.stages: list[tuple[str, int, int]] = []
        self.calls: list[tuple[int, int]] = []

    def stage(self, name: str, total: int, done: int = 0) -> None:
        self.stages.append((name, total, done))

    def __call__(self, done: int, total: int) -> None:
        self.calls.append((done, total))


def test_exports_report_the_bytes_they_write_to_a_progress_reporter(tmp_path):
    sample = Path(__file__).resolve().parents[2] / "samples" / "tiny-transformer.safetensors"
    recipe = tmp_path / "q8.toml"
    recipe.write_text(
        '[defaults]\ndtype = "int8"\nblock_size = 32\naxis = -1\nmethod = "dynamic"\n'
        'scale_dtype = "float16"\n'
    )
    qs.convert_checkpoint(sample, tmp_path / "q8.zarr", recipe=recipe)
    for out in ("m.safetensors", "m.gguf"):
        seen = _Recorder()
        export = qs.export_gguf if out.endswith(".gguf") else qs.export_safetensors
        result = export(tmp_path / "q8.zarr", tmp_path / out, progress=seen)
        assert seen.stages == [("write", result["bytes"], 0)]
        done = [d for d, _ in seen.calls]
        assert done == sorted(done) and seen.calls[-1] == (result["bytes"], result["bytes"])
