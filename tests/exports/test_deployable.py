"""A compressed-tensors export is a folder a user deploys as it is: checked in fresh
processes with transformers (``AutoTokenizer`` and ``AutoModelForCausalLM`` on the folder
alone, ``generate`` with the chat template), never with qstream's own reader."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from typer.testing import CliRunner

import qstream as qs
from cli.main import app
from tests.support.fresh import run_json

HERE = os.path.dirname(os.path.abspath(__file__))
DEPLOY = os.path.join(os.path.dirname(HERE), "support", "hf_deploy.py")


def fresh(*args: object) -> dict:
    """Run the helper in a fresh Python process (qstream never imported there)."""
    return run_json(DEPLOY, *args, timeout=600)


def build(folder, tied: bool, dtype: str = "float32", hidden: int = 128):
    pytest.importorskip("transformers")
    pytest.importorskip("compressed_tensors")
    fresh("build", folder, hidden, "tied" if tied else "untied", dtype)
    return folder


@pytest.fixture(scope="module")
def untied(tmp_path_factory):
    return build(tmp_path_factory.mktemp("untied") / "src", tied=False)


@pytest.fixture(scope="module")
def tied(tmp_path_factory):
    return build(tmp_path_factory.mktemp("tied") / "src", tied=True)


def reference(src, tmp_path, recipe=None, tied_to: str | None = None) -> str:
    """qstream's dequantized values of every quantized tensor (a Zarr conversion of the same
    source and recipe), as an .npz; ``tied_to``: the embedding lm_head is untied from."""
    qs.convert_checkpoint(src, tmp_path / "ref.zarr", recipe)
    root = qs.open_quantized(tmp_path / "ref.zarr")
    arrays = {n: root[n][...] for n in root if isinstance(root[n], qs.QuantizedArray)}
    if tied_to is not None and tied_to in arrays:
        arrays["lm_head.weight"] = arrays[tied_to]
    np.savez(tmp_path / "ref.npz", **arrays)
    return str(tmp_path / "ref.npz")


def written_text(folder) -> dict[str, str]:
    """Every file of the folder, read as text (safetensors headers included)."""
    return {
        f: open(os.path.join(folder, f), "rb").read().decode("latin-1") for f in os.listdir(folder)
    }


def test_the_export_folder_deploys_as_is_with_tokenizer_chat_template_and_no_local_path(
    untied, tmp_path
):
    out = tmp_path / "deploy" / "model.safetensors"
    qs.convert_checkpoint(untied, out)
    folder = out.parent
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                 "generation_config.json"):  # fmt: skip
        assert (folder / name).read_bytes() == (untied / name).read_bytes(), name
    for name, text in written_text(folder).items():
        assert str(tmp_path) not in text and "/tmp" not in text, name
    got = fresh("load", folder, reference(untied, tmp_path), "float32")
    assert got["quantized"] > 0 and got["bit_exact"] == got["quantized"], got
    assert got["logits_equal"] and got["generated"] > 0, got


def test_a_model_file_qstream_did_not_write_is_refused_in_the_plan_and_left_alone(untied, tmp_path):
    folder = tmp_path / "deploy"
    folder.mkdir()
    (folder / "tokenizer.json").write_text('{"mine": true}')
    with pytest.raises(qs.StoreError, match=r"tokenizer\.json exists and qstream did not write it"):
        qs.plan_convert(untied, folder / "model.safetensors")
    r = CliRunner().invoke(app, ["convert", str(untied), str(folder / "model.safetensors")])
    assert r.exit_code == 2 and "tokenizer.json" in r.output, r.output
    assert (folder / "tokenizer.json").read_text() == '{"mine": true}'
    assert sorted(os.listdir(folder)) == ["tokenizer.json"]


def test_a_rerun_replaces_the_model_files_qstream_copied_when_the_source_changed(untied, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for f in os.listdir(untied):
        (src / f).write_bytes((untied / f).read_bytes())
    out = tmp_path / "deploy" / "model.safetensors"
    qs.convert_checkpoint(src, out)
    doc = json.loads((src / "generation_config.json").read_text())
    doc["max_new_tokens"] = 7
    (src / "generation_config.json").write_text(json.dumps(doc))
    qs.convert_checkpoint(src, out, overwrite=True)
    copied = json.loads((out.parent / "generation_config.json").read_text())
    assert copied["max_new_tokens"] == 7
    plan = qs.plan_convert(src, out, overwrite=True).to_dict()
    assert "generation_config.json" in plan["copies"]


def test_a_tied_quantized_embedding_is_untied_in_the_plan_and_the_folder_runs(tied, tmp_path):
    out = tmp_path / "deploy" / "model.safetensors"
    r = CliRunner().invoke(app, ["convert", str(tied), str(out), "--dry-run"])
    assert r.exit_code == 0 and "untied as llm-compressor does" in r.output, r.output
    assert not out.parent.exists()
    qs.convert_checkpoint(tied, out)
    config = json.loads((out.parent / "config.json").read_text())
    assert config["tie_word_embeddings"] is False
    groups = config["quantization_config"]["config_groups"].values()
    assert any("lm_head" in t for g in groups for t in g["targets"])
    npz = reference(tied, tmp_path, tied_to="model.embed_tokens.weight")
    assert "lm_head.weight" in np.load(npz)
    got = fresh("load", out.parent, npz, "float32")
    assert not got["tied"] and got["bit_exact"] == got["quantized"], got
    assert got["logits_equal"] and got["generated"] > 0, got
    # qstream's own reader decodes the untied lm_head as the embedding's values, not codes
    ck = qs.open_quantized(out)
    head, embed = ck["lm_head.weight"], ck["model.embed_tokens.weight"]
    np.testing.assert_array_equal(np.asarray(head[...]), np.asarray(embed[...]))
    assert np.asarray(head[...]).dtype.kind == "f"


def test_a_tied_embedding_kept_in_float_stays_tied(tied, tmp_path):
    out = tmp_path / "deploy" / "model.safetensors"
    recipe = qs.Recipe.from_dict({"rules": [{"pattern": "*embed_tokens*", "action": "keep"}]})
    plan = qs.plan_convert(tied, out, recipe)
    assert not any("untied" in n for n in plan.notes)
    qs.convert_checkpoint(tied, out, recipe)
    assert json.loads((out.parent / "config.json").read_text())["tie_word_embeddings"] is True
    got = fresh("load", out.parent, reference(tied, tmp_path, recipe), "float32")
    assert got["tied"] and got["bit_exact"] == got["quantized"] > 0, got
    assert got["logits_equal"] and got["generated"] > 0, got


def _moe(folder, model_type: str, expert: str):
    """A two-expert MoE layer's tensors (names as the Hub ships them) and its config."""
    from safetensors.numpy import save_file

    folder.mkdir()
    rng = np.random.default_rng(0)
    w = {f"model.layers.0.{expert}.{e}.{p}.weight": rng.standard_normal((32, 64), np.float32)
         for e in range(2) for p in ("gate", "up")}  # fmt: skip
    w["model.layers.0.self_attn.q_proj.weight"] = rng.standard_normal((64, 64), np.float32)
    save_file(w, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({"model_type": model_type}))
    return folder


@pytest.mark.parametrize(
    "model_type,expert",
    [
        ("mixtral", "block_sparse_moe.experts"),
        ("qwen3_moe", "mlp.experts"),
        ("deepseek_v3", "mlp.experts"),
    ],
)
def test_moe_experts_in_a_recipe_export_are_refused_in_the_plan_naming_the_model_type(
    tmp_path, model_type, expert
):
    # (the measurements behind these refusals: tests/exports/test_moe_exports.py)
    src = _moe(tmp_path / "src", model_type, expert)
    out = tmp_path / "out" / "model.safetensors"
    r = CliRunner().invoke(app, ["convert", str(src), str(out), "--dry-run"])
    assert r.exit_code == 2 and r.output.startswith(f"error: {model_type}: "), r.output
    assert f"fuses {model_type}'s experts into 3-D" in r.output
    assert not out.parent.exists()
    keep = qs.Recipe.from_dict({"rules": [{"pattern": "*experts*", "action": "keep"}]})
    with pytest.raises(qs.InvalidParameterError, match=f"^{model_type}: .*experts"):
        qs.plan_convert(src, out, keep)  # kept float experts do not load either
    assert not out.parent.exists()
