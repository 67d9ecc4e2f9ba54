"""GGUF exports are planned before any tensor is read (qstream.exports.gguf.plan): a spec no GGUF
type holds is refused (never changed silently), an explicit type alone picks the type and
its rule, and the report carries each quantized tensor's error as written."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from safetensors.numpy import save_file
from typer.testing import CliRunner

import qstream as qs
from cli.main import app
from qstream.exports.gguf.plan import GGUFPlan, plan_gguf
from tests.support.llama_folder import write_tokenizer

runner = CliRunner()
HIDDEN, HEADS, KV = 64, 4, 2
CONFIG = {
    "model_type": "llama",
    "num_attention_heads": HEADS,
    "num_key_value_heads": KV,
    "hidden_size": HIDDEN,
    "num_hidden_layers": 1,
    "intermediate_size": 128,
    "vocab_size": 96,
    "max_position_embeddings": 512,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-6,
}


def cli(*args):
    return runner.invoke(app, [str(a) for a in args])


def llama_tensors(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    h = HIDDEN
    shapes = {
        "model.embed_tokens.weight": (96, h),
        "model.layers.0.self_attn.q_proj.weight": (h, h),
        "model.layers.0.self_attn.k_proj.weight": (h // 2, h),
        "model.layers.0.self_attn.v_proj.weight": (h // 2, h),
        "model.layers.0.self_attn.o_proj.weight": (h, h),
        "model.layers.0.mlp.gate_proj.weight": (128, h),
        "model.layers.0.mlp.up_proj.weight": (128, h),
        "model.layers.0.mlp.down_proj.weight": (h, 128),
        "model.layers.0.input_layernorm.weight": (h,),
        "model.layers.0.post_attention_layernorm.weight": (h,),
        "model.norm.weight": (h,),
        "lm_head.weight": (96, h),
    }
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}


@pytest.fixture
def model(tmp_path):
    """A tiny Llama-shaped checkpoint with its config.json (in its own folder)."""
    folder = tmp_path / "model"
    folder.mkdir()
    save_file(llama_tensors(), str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(CONFIG))
    write_tokenizer(str(folder))
    return folder


def written(folder) -> list[str]:
    return sorted(p for p in os.listdir(folder) if not p.startswith("."))


# --- part 1: the spec is never changed silently --------------------------------------------


@pytest.mark.parametrize(
    "flags,asked",
    [
        (["--block-size", "128"], "blocks of 128"),
        (["--dtype", "uint8", "--asymmetric"], "an asymmetric range"),
        (["--dtype", "int8", "--axis", "1"], "one scale per channel on axis 1"),
        (["--dtype", "int4", "--block-size", "32", "--axis", "0"], "blocks along axis 0"),
        (["--dtype", "float8_e4m3fn"], "no block type of float8_e4m3fn"),
        (["--dtype", "int8", "--block-size", "32", "--method", "percentile"], "percentile"),
    ],
)
def test_a_spec_no_gguf_type_holds_is_refused_naming_tensor_ask_nearest_and_flag(
    model, tmp_path, flags, asked
):
    out = tmp_path / "out"
    out.mkdir()
    r = cli("convert", model / "model.safetensors", out / "m.gguf", *flags)
    assert r.exit_code == 2, r.output
    assert "internal error" not in r.output
    assert asked in r.output
    assert "error: lm_head.weight (recipe [defaults]" in r.output  # the first (file order)
    assert "--gguf-type" in r.output and "nearest type is Q" in r.output
    assert written(out) == []


def test_nearest_type_follows_width_and_symmetry(model, tmp_path):
    for spec, nearest in [
        ({"dtype": "int4", "axis": 1}, "Q4_0"),
        ({"dtype": "uint4", "axis": 1, "symmetric": False}, "Q4_1"),
        ({"dtype": "int8", "axis": None}, "Q8_0"),
        ({"dtype": "int8", "axis": 1, "block_size": 32, "method": "dynamic",
          "round_mode": "half_away_from_zero"}, "Q8_0"),
    ]:  # fmt: skip
        recipe = qs.Recipe.from_dict(
            {"defaults": spec, "rules": [{"pattern": "lm_head*", "action": "keep"}]}
        )
        with pytest.raises(qs.InvalidParameterError, match=f"nearest type is {nearest}"):
            qs.export_gguf(model / "model.safetensors", tmp_path / "x.gguf", recipe=recipe)
    # a rule is named when it gives the spec
    recipe = qs.Recipe.from_dict(
        {"rules": [{"pattern": "*mlp*", "spec": {"dtype": "int4", "axis": 1}}]}
    )
    with pytest.raises(qs.InvalidParameterError, match=r"recipe rule 1 \('\*mlp\*'\)"):
        qs.export_gguf(model / "model.safetensors", tmp_path / "x.gguf", recipe=recipe)
    assert not (tmp_path / "x.gguf").exists()


@pytest.mark.parametrize(
    "spec,kind",
    [
        ({"dtype": "int8", "axis": -1, "block_size": 32, "method": "dynamic"}, "Q8_0"),
        ({"dtype": "int4", "axis": 1, "block_size": 32, "method": "dynamic"}, "Q4_0"),
        ({"dtype": "uint4", "axis": 1, "block_size": 32, "method": "dynamic",
          "symmetric": False}, "Q4_1"),
        ({"dtype": "int4", "axis": 1, "block_size": 32, "method": "minmax"}, "Q4_0"),
    ],
)  # fmt: skip
def test_specs_a_type_holds_map_to_it_and_the_plan_states_its_rule(model, spec, kind):
    recipe = qs.Recipe.from_dict({"defaults": spec})
    plan = plan_gguf(model / "model.safetensors", recipe)
    assert isinstance(plan, GGUFPlan) and plan.architecture == "llama"
    quantized = [t for t in plan.tensors if not t.kept]
    assert {t.type for t in quantized} == {kind}
    assert all(f"gguf-py's {kind}" in t.rule for t in quantized)
    assert {t.type for t in plan.tensors if t.kept} == {"F32"}  # the norms (rank 1)
    row = next(r for r in plan.rows() if r["name"].endswith("q_proj.weight"))
    assert row["gguf_name"] == "blk.0.attn_q.weight"
    assert row["target"] == kind and row["shape"] == [HIDDEN, HIDDEN]
    assert row["bytes_before"] == HIDDEN * HIDDEN * 4
    from qstream.compat.gguf import TYPE_SIZE

    assert row["bytes_after"] == HIDDEN * HIDDEN // 32 * TYPE_SIZE[kind]


def test_an_explicit_type_alone_picks_type_and_rule(model, tmp_path):
    recipe = qs.Recipe.from_dict({
        "defaults": {"dtype": "int8", "axis": 1, "block_size": 128, "method": "dynamic"},
        "rules": [{"pattern": "lm_head*", "action": "keep", "dtype": "bfloat16"}],
    })  # fmt: skip
    plan = plan_gguf(model / "model.safetensors", recipe, "q4_0")
    by = {t.name: t for t in plan.tensors}
    assert by["model.embed_tokens.weight"].type == "Q4_0"
    assert by["model.embed_tokens.weight"].rule.startswith("--gguf-type Q4_0: gguf-py's Q4_0")
    assert "d = m / -8" in by["model.embed_tokens.weight"].rule
    assert by["lm_head.weight"].type == "BF16" and by["lm_head.weight"].kept  # its keep dtype
    r = cli(
        "convert", model / "model.safetensors", tmp_path / "m.gguf", "--block-size", "128",
        "--gguf-type", "Q4_0",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    assert set(qs.export_gguf(model, tmp_path / "m.gguf", type="Q4_0", pure=True,
                              overwrite=True)["tensors"].values()) == {"Q4_0", "F32"}  # fmt: skip
    with pytest.raises(qs.InvalidParameterError, match="unknown GGUF type 'IQ4_NL'"):
        plan_gguf(model / "model.safetensors", recipe, "IQ4_NL")


def test_the_plan_reads_shapes_and_dtypes_only(model):
    class Header:  # a tensor whose values cannot be read
        def __init__(self, shape, dtype):
            self.shape, self.dtype = shape, np.dtype(dtype)

        def __getitem__(self, key):
            raise AssertionError("the plan read a tensor's values")

    tensors = {n: Header(v.shape, v.dtype) for n, v in llama_tensors().items()}
    plan = plan_gguf(model / "model.safetensors", None, None, None, tensors=tensors)
    assert [t.name for t in plan.tensors] == list(tensors)
    assert plan.bytes_before == sum(v.nbytes for v in llama_tensors().values())
    bad = qs.Recipe.from_dict({"defaults": {"dtype": "int8", "axis": 0, "method": "mse"}})
    with pytest.raises(qs.InvalidParameterError, match="method mse"):
        plan_gguf(model / "model.safetensors", bad, tensors=tensors)


def test_the_report_has_each_quantized_tensors_error_as_gguf_py_computes_it(model, tmp_path):
    gguf = pytest.importorskip("gguf")
    recipe = qs.Recipe.from_dict(
        {"defaults": {"dtype": "int4", "axis": 1, "block_size": 32, "method": "dynamic"}}
    )
    result = qs.export_gguf(model, tmp_path / "m.gguf", recipe=recipe, max_memory=1 << 20)
    source = llama_tensors()
    assert set(result["error"]) == {n for n, v in source.items() if v.ndim == 2}
    assert {r["name"] for r in result["plan"]} == set(source)
    for name, err in result["error"].items():
        x = source[name].astype(np.float64)
        y = gguf.quants.dequantize(gguf.quants.quantize(source[name], 2), 2).astype(np.float64)
        e = x - y
        assert err["count"] == x.size
        assert err["max_abs"] == np.abs(e).max()
        np.testing.assert_allclose(
            err["sqnr_db"], 10 * np.log10((x * x).sum() / (e * e).sum()), rtol=1e-12
        )
    # the command line prints them as a table, worst first
    r = cli("convert", model, tmp_path / "c.gguf", "--dtype", "int4", "--block-size", "32")
    assert r.exit_code == 0, r.output
    assert "worst SQNR first" in r.output and "model.layers.0.mlp.up_proj.weight" in r.output
    assert "Q4_0" in r.output and "architecture llama" in r.output


def test_a_qstream_outputs_codes_are_copied_and_another_type_is_refused(model, tmp_path):
    recipe = qs.Recipe.from_dict({"defaults": {"dtype": "int8", "axis": 0,
                                               "scale_dtype": "float16"}})  # fmt: skip
    qs.convert_checkpoint(model / "model.safetensors", tmp_path / "q.zarr", recipe)
    result = qs.export_gguf(tmp_path / "q.zarr", tmp_path / "q.gguf")
    assert set(result["tensors"].values()) == {"Q8_0", "F32"}
    root = qs.open_quantized(tmp_path / "q.zarr")
    name = "model.layers.0.mlp.up_proj.weight"
    assert result["error"][name]["sqnr_db"] == root[name].report["error"]["sqnr_db"]
    with pytest.raises(qs.InvalidParameterError, match=r"lm_head\.weight: holds int8 codes.*Q4_0"):
        qs.export_gguf(tmp_path / "q.zarr", tmp_path / "r.gguf", type="Q4_0")
    r = cli("export", tmp_path / "q.zarr", tmp_path / "r.gguf", "--gguf-type", "Q4_0")
    assert r.exit_code == 2 and "internal error" not in r.output
    assert not (tmp_path / "r.gguf").exists()
    r = cli("export", tmp_path / "q.zarr", tmp_path / "r.gguf")
    assert r.exit_code == 0, r.output
    assert "worst SQNR first" in r.output
    r = cli("export", tmp_path / "q.zarr", tmp_path / "r.gguf")
    assert r.exit_code == 0 and "already complete" in r.output, r.output


# --- part 2: crafted model configs and names are refused by the plan ------------------------


def _without(key):
    return {k: v for k, v in CONFIG.items() if k != key}


CRAFTED = {
    "missing num_attention_heads": (_without("num_attention_heads"), "num_attention_heads"),
    "missing hidden_size": (_without("hidden_size"), "hidden_size"),
    "missing vocab_size": (_without("vocab_size"), "vocab_size"),
    "zero heads": ({**CONFIG, "num_attention_heads": 0}, "num_attention_heads"),
    "negative heads": ({**CONFIG, "num_attention_heads": -4}, "num_attention_heads"),
    "huge heads": ({**CONFIG, "num_attention_heads": 10**30}, "num_attention_heads"),
    "string heads": ({**CONFIG, "num_attention_heads": "4"}, "num_attention_heads"),
    "float heads": ({**CONFIG, "num_attention_heads": 4.5}, "num_attention_heads"),
    "bool heads": ({**CONFIG, "num_attention_heads": True}, "num_attention_heads"),
    "list heads": ({**CONFIG, "num_attention_heads": [4]}, "num_attention_heads"),
    "heads not splitting q rows": ({**CONFIG, "num_attention_heads": 3,
                                    "num_key_value_heads": 1}, "num_attention_heads"),
    "zero kv heads": ({**CONFIG, "num_key_value_heads": 0}, "num_key_value_heads"),
    "kv heads not a divisor": ({**CONFIG, "num_key_value_heads": 3}, "num_key_value_heads"),
    "kv heads above heads": ({**CONFIG, "num_key_value_heads": 8}, "num_key_value_heads"),
    "zero layers": ({**CONFIG, "num_hidden_layers": 0}, "num_hidden_layers"),
    "huge vocab": ({**CONFIG, "vocab_size": 2**40}, "vocab_size"),
    "negative intermediate": ({**CONFIG, "intermediate_size": -1}, "intermediate_size"),
    "dict context": ({**CONFIG, "max_position_embeddings": {"a": 1}}, "max_position_embeddings"),
    "zero head_dim": ({**CONFIG, "head_dim": 0}, "head_dim"),
    "hidden below heads": ({**CONFIG, "hidden_size": 2}, "hidden_size"),
    "zero rope": ({**CONFIG, "rope_theta": 0}, "rope_theta"),
    "string rope": ({**CONFIG, "rope_theta": "1e4"}, "rope_theta"),
    "huge rope": ({**CONFIG, "rope_theta": 1e300}, "rope_theta"),
    "rope parameters list": ({**_without("rope_theta"), "rope_parameters": []}, "rope_parameters"),
    "negative eps": ({**CONFIG, "rms_norm_eps": -1e-6}, "rms_norm_eps"),
    "model_type number": ({**CONFIG, "model_type": 5}, "model_type"),
    "model_type surrogate": ({"model_type": "\ud800"}, "model_type"),
    "model_type NUL": ({"model_type": "qwen\x00"}, "model_type"),
    "model_type huge": ({"model_type": "x" * 10_000}, "model_type"),
}  # fmt: skip
RAW = {
    "JSON array": ("[1, 2]", "a JSON array, not an object"),
    "JSON string": ('"llama"', "a JSON string, not an object"),
    "JSON null": ("null", "a JSON null, not an object"),
    "invalid JSON": ('{"model_type": ', "not valid JSON"),
    "empty file": ("", "not valid JSON"),
    "not UTF-8": (b"\xff\xfe\xfa", "not valid JSON"),
    "nested deeply": ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    "NaN eps": ('{"model_type": "llama", "num_attention_heads": 4, "hidden_size": 64,'
                ' "num_hidden_layers": 1, "intermediate_size": 128, "vocab_size": 96,'
                ' "rms_norm_eps": NaN}', "rms_norm_eps"),
}  # fmt: skip


def crafted_text(case: str) -> bytes:
    if case in RAW:
        raw = RAW[case][0]
        return raw if isinstance(raw, bytes) else raw.encode()
    return json.dumps(CRAFTED[case][0]).encode("utf-8", "surrogatepass")


@pytest.mark.parametrize("command", ["convert", "export"])
@pytest.mark.parametrize("case", [*CRAFTED, *RAW])
def test_a_crafted_config_is_refused_naming_field_and_file_and_nothing_is_written(
    model, tmp_path, command, case
):
    crafted = tmp_path / "crafted.json"
    crafted.write_bytes(crafted_text(case))
    out = tmp_path / "out"
    out.mkdir()
    r = cli(command, model / "model.safetensors", out / "x.gguf", "--config", crafted)
    assert r.exit_code == 2, r.output
    assert "internal error" not in r.output
    named = CRAFTED[case][1] if case in CRAFTED else RAW[case][1]
    assert named in r.output
    if "heads not splitting" in case:  # (the tensor it fails on is named instead of the file)
        assert "q_proj.weight" in r.output
    else:
        assert "crafted.json" in r.output
    assert written(out) == []


def test_a_crafted_config_beside_the_checkpoint_is_refused_too(model, tmp_path):
    (model / "config.json").write_text(json.dumps({**CONFIG, "num_attention_heads": 0}))
    for command in ("convert", "export"):
        r = cli(command, model / "model.safetensors", tmp_path / "x.gguf")
        assert r.exit_code == 2 and "internal error" not in r.output, r.output
        assert "config.json: num_attention_heads must be an integer" in r.output
    with pytest.raises(qs.InvalidParameterError, match="config: num_attention_heads"):
        plan_gguf(model / "model.safetensors", config={**CONFIG, "num_attention_heads": -1})
    assert not (tmp_path / "x.gguf").exists()


def crafted_checkpoint(path, names) -> None:
    """A safetensors file written by hand, its names as given (no library writes these)."""
    import struct

    header, off = {}, 0
    for n in names:
        header[n] = {"dtype": "F32", "shape": [4, 64], "data_offsets": [off, off + 1024]}
        off += 1024
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(off))


@pytest.mark.parametrize("with_config", [False, True])
@pytest.mark.parametrize("bad", ["x\x00y", "up\ud800.weight", "a\x1fb"])
def test_tensor_names_with_nul_control_characters_or_surrogates_are_refused(
    tmp_path, bad, with_config
):
    folder = tmp_path / "m"
    folder.mkdir()
    crafted_checkpoint(folder / "model.safetensors", [bad, "model.norm.weight"])
    if with_config:
        (folder / "config.json").write_text(json.dumps(CONFIG))
    out = tmp_path / "out"
    out.mkdir()
    for command in ("convert", "export"):
        r = cli(command, folder / "model.safetensors", out / "x.gguf")
        assert r.exit_code == 2, r.output
        assert "internal error" not in r.output
        assert "tensor name" in r.output and "which a GGUF file cannot hold" in r.output
        assert written(out) == []


# --- part 3: architectures ------------------------------------------------------------------


@pytest.mark.parametrize("command", ["convert", "export"])
def test_an_unsupported_architecture_is_refused_listing_the_supported_ones(
    model, tmp_path, command
):
    (model / "config.json").write_text(
        json.dumps({**CONFIG, "architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox"})
    )
    r = cli(command, model, tmp_path / "x.gguf")
    assert r.exit_code == 2, r.output
    assert "GPTNeoXForCausalLM" in r.output and "Qwen2MoeForCausalLM" in r.output
    assert not (tmp_path / "x.gguf").exists()


def test_1d_tensors_of_a_bf16_source_are_f32_and_a_tied_lm_head_is_left_out(tmp_path):
    import ml_dtypes

    folder = tmp_path / "m"
    folder.mkdir()
    tensors = {k: v.astype(ml_dtypes.bfloat16) for k, v in llama_tensors().items()}
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({**CONFIG, "tie_word_embeddings": True}))
    plan = plan_gguf(folder, type="BF16", tokenizer=False)
    types = {t.gguf_name: t.type for t in plan.tensors}
    assert "output.weight" not in types and types["token_embd.weight"] == "BF16"
    assert types["blk.0.attn_norm.weight"] == types["output_norm.weight"] == "F32"
    assert any("--no-tokenizer" in w for w in plan.warnings)


def test_a_model_without_a_tokenizer_is_refused_up_front_unless_no_tokenizer(model, tmp_path):
    (model / "tokenizer.model").unlink()
    out = tmp_path / "x.gguf"
    for extra in ([], ["--dry-run"]):
        r = cli("convert", model, out, "--gguf-type", "Q8_0", *extra)
        assert r.exit_code == 2, r.output
        assert "no tokenizer.json or tokenizer.model" in r.output
        assert "--no-tokenizer" in r.output
    r = cli("convert", model, out, "--gguf-type", "Q8_0", "--no-tokenizer", "--dry-run")
    assert r.exit_code == 0, r.output
    assert "llama.cpp will not load it" in r.output
    assert not out.exists()
    r = cli("convert", model, out, "--gguf-type", "Q8_0", "--no-tokenizer")
    assert r.exit_code == 0, r.output
    assert "llama.cpp will not load it" in r.output and out.exists()


def test_a_tied_qwen2_moe_is_refused_since_llama_cpp_needs_its_output_weight(model, tmp_path):
    cfg = {**CONFIG, "architectures": ["Qwen2MoeForCausalLM"], "tie_word_embeddings": True}
    (model / "config.json").write_text(json.dumps(cfg))
    r = cli("convert", model, tmp_path / "x.gguf", "--dry-run")
    assert r.exit_code == 2, r.output
    assert "tie_word_embeddings" in r.output and "output.weight" in r.output
    assert not (tmp_path / "x.gguf").exists()


@pytest.mark.parametrize("flags", [["--pure"], ["--no-tokenizer"], []])
def test_the_dry_run_of_a_k_quant_file_plans_the_types_the_run_writes(model, tmp_path, flags):
    gguf = pytest.importorskip("gguf")
    out = tmp_path / "x.gguf"
    args = ("convert", model, out, "--gguf-type", "Q6_K", *flags)
    r = cli(*args, "--dry-run", "--json")
    assert r.exit_code == 0, r.output
    planned = {t["gguf_name"]: t["target"] for t in json.loads(r.output)["plan"]}
    assert not out.exists()
    r = cli(*args, "-q")
    assert r.exit_code == 0, r.output
    written = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(out)).tensors}
    assert planned == written
