"""gpt-oss's MXFP4 experts (``quant_method: mxfp4``), a tiny GptOss model from transformers
5.24 with its experts stored as gpt-oss stores them: ``*_blocks`` (random E2M1 code pairs,
written directly, not by qstream) and ``*_scales`` (random E8M0 exponents, the extremes 0 and
254 included). qstream reads each pair as transformers' own ``convert_moe_packed_tensors``
gives it, bit for bit, under the name and in the layout transformers' model has; decoding to
``model.safetensors`` gives a plain model transformers loads with those values; crafted
variants are refused before any block is read, by the command line too (exit 2, nothing
created)."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

import qstream as qs
from qstream.errors import StoreError

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import GptOssConfig, GptOssForCausalLM  # noqa: E402
from transformers.integrations.mxfp4 import convert_moe_packed_tensors  # noqa: E402

EXPERTS = ("gate_up_proj", "down_proj")
QC = {
    "quant_method": "mxfp4",
    "modules_to_not_convert": [
        "model.layers.*.self_attn",
        "model.layers.*.mlp.router",
        "model.embed_tokens",
        "lm_head",
    ],
}


def _config() -> GptOssConfig:
    return GptOssConfig(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_local_experts=4,
        num_experts_per_tok=2,
        vocab_size=128,
        layer_types=["sliding_attention", "full_attention"],
    )


def build(folder: str, extremes: bool = True) -> dict[str, torch.Tensor]:
    """The checkpoint as gpt-oss ships it: each expert matrix ``[experts, in, out]`` of the
    model stored as ``[experts, out, in / 32, 16]`` uint8 blocks and ``[experts, out,
    in / 32]`` E8M0 scales (the inverse of transformers' unpacking); returns what is stored."""
    torch.manual_seed(0)
    cfg = _config()
    model = GptOssForCausalLM(cfg).to(torch.bfloat16)
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    g = torch.Generator().manual_seed(1)
    for name in [k for k in sd if k.endswith(EXPERTS)]:
        e, i, o = sd.pop(name).shape
        blocks = torch.randint(0, 256, (e, o, i // 32, 16), dtype=torch.uint8, generator=g)
        scales = torch.randint(112, 132, (e, o, i // 32), dtype=torch.uint8, generator=g)
        if extremes:  # 2 ** -127 (subnormal), 2 ** 127 (codes >= 4 overflow to infinity)
            scales[0, 0, 0], scales[-1, -1, -1] = 0, 254
        sd[name + "_blocks"], sd[name + "_scales"] = blocks, scales
    os.makedirs(folder, exist_ok=True)
    save_file(sd, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    doc = cfg.to_dict()
    doc["quantization_config"] = dict(QC)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(doc, f)
    return sd


def reference(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers' own conversion of every pair (what ``from_pretrained`` dequantizes to)."""
    bases = [n.removesuffix("_blocks") for n in sd if n.endswith("_blocks")]
    return {b: convert_moe_packed_tensors(sd[b + "_blocks"], sd[b + "_scales"]) for b in bases}


def bits(a) -> np.ndarray:
    if isinstance(a, torch.Tensor):
        return a.contiguous().view(torch.int16).numpy()
    return a.view(np.int16)


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("gpt_oss_mxfp4"))
    return folder, build(folder)


def test_experts_equal_transformers_conversion_bit_for_bit_in_its_layout(gpt_oss):
    folder, sd = gpt_oss
    ref = reference(sd)
    assert len(ref) == 4
    shapes = {n: tuple(p.shape) for n, p in GptOssForCausalLM(_config()).named_parameters()}
    got = qs.open_checkpoint(folder)
    assert not [n for n in got if n.endswith(("_blocks", "_scales"))]
    assert set(got) == set(shapes)  # every parameter of the model, under its own name
    for name, want in ref.items():
        t = got[name]
        assert tuple(t.shape) == shapes[name] == tuple(want.shape)
        assert np.dtype(t.dtype).name == "bfloat16"
        assert np.array_equal(bits(t[...]), bits(want)), name
        assert np.array_equal(bits(t[1:3, 5:40, 7:]), bits(want[1:3, 5:40, 7:])), name
    for name in ("model.layers.0.mlp.experts.down_proj_bias", "model.embed_tokens.weight"):
        assert np.array_equal(bits(got[name][...]), bits(sd[name]))


def test_dequantize_writes_a_plain_gpt_oss_transformers_loads_with_those_values(gpt_oss, tmp_path):
    from typer.testing import CliRunner

    from cli.main import app

    folder, sd = gpt_oss
    out = tmp_path / "plain"
    r = CliRunner().invoke(
        app, ["dequantize", folder, str(out / "model.safetensors"), "--dtype", "bfloat16"]
    )
    assert r.exit_code == 0, r.output
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config
    model = GptOssForCausalLM.from_pretrained(str(out), dtype=torch.bfloat16)
    params = dict(model.named_parameters())
    for name, want in reference(sd).items():
        assert np.array_equal(bits(params[name].detach()), bits(want)), name


def test_converting_reads_the_decoded_experts(tmp_path):
    folder = str(tmp_path / "finite")
    sd = build(folder, extremes=False)
    dst = str(tmp_path / "out.zarr")
    qs.convert_checkpoint(folder, dst)
    name = "model.layers.1.mlp.experts.gate_up_proj"
    got = np.asarray(qs.open_quantized(f"{dst}/{name}")[...], np.float32)
    want = reference(sd)[name].float().numpy()
    assert got.shape == want.shape
    # int8 of the decoded values (not of the codes): within a step of each row's range
    assert np.abs(got - want).max() <= np.abs(want).max() / 100


def _variant(src: str, dst: str, edit=None, config=None) -> str:
    shutil.copytree(src, dst)
    path = os.path.join(dst, "model.safetensors")
    if edit is not None:
        sd = load_file(path)
        edit(sd)
        save_file(sd, path, metadata={"format": "pt"})
    if config is not None:
        cpath = os.path.join(dst, "config.json")
        with open(cpath) as f:
            doc = json.load(f)
        config(doc)
        with open(cpath, "w") as f:
            json.dump(doc, f)
    return dst


B = "model.layers.0.mlp.experts.down_proj_blocks"
S = "model.layers.0.mlp.experts.down_proj_scales"


@pytest.mark.parametrize(
    ("edit", "config", "message"),
    [
        (lambda sd: sd.pop(S), None, "half a pair"),
        (lambda sd: sd.pop(B), None, "half a pair"),
        (lambda sd: sd[S].view(-1)[3].fill_(255), None, "NaN"),
        (lambda sd: sd.update({S: sd[S][:, :, :1].contiguous()}), None, "scales"),
        (lambda sd: sd.update({S: sd[S].to(torch.float32)}), None, "uint8"),
        (None, lambda doc: doc.pop("quantization_config"), "gpt-oss MXFP4"),
        (lambda sd: sd.update({"model.norm.weight": sd[S][0].clone()}), None, "stored as uint8"),
    ],
    ids=["no-scales", "no-blocks", "nan-scale", "scale-shape", "scale-dtype", "no-config", "stray"],
)
def test_crafted_variants_are_refused_before_any_block_is_read(
    gpt_oss, tmp_path, edit, config, message
):
    from typer.testing import CliRunner

    from cli.main import app

    bad = _variant(gpt_oss[0], str(tmp_path / "bad"), edit, config)
    with pytest.raises(StoreError, match=message):
        qs.open_checkpoint(bad)
    for extra in (["--dry-run"], []):
        dst = tmp_path / "out.zarr"
        r = CliRunner().invoke(app, ["convert", bad, str(dst), *extra])
        assert r.exit_code == 2, r.output
        assert not dst.exists()


def test_inspect_names_the_gpt_oss_format(gpt_oss):
    from typer.testing import CliRunner

    from cli.main import app

    r = CliRunner().invoke(app, ["inspect", gpt_oss[0]])
    assert r.exit_code == 0, r.output
    assert "gpt-oss MXFP4 experts" in r.output
    got = qs.describe_checkpoint(gpt_oss[0])
    assert got["decoded"] is True and got["types"]["uint8"] == 8
