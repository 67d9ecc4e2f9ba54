"""Checkpoints quantized already, made by compressed-tensors 0.20's own compressors applied to
a tiny transformers Llama (sharded, with the quantization_config they write): qstream reads
each quantized weight as compressed-tensors' own decompressor gives it, bit for bit, row
ranges included, keeps activation scales as plain tensors, and refuses crafted variants
before any weight is read."""

from __future__ import annotations

import glob
import json
import os
import shutil

import numpy as np
import pytest

import qstream as qs
from qstream.errors import StoreError

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("compressed_tensors")
from compressed_tensors.compressors import BaseCompressor, ModelCompressor  # noqa: E402
from compressed_tensors.quantization import (  # noqa: E402
    QuantizationArgs,
    QuantizationConfig,
    QuantizationScheme,
    apply_quantization_config,
    preset_name_to_scheme,
)
from compressed_tensors.quantization.utils import (  # noqa: E402
    calculate_qparams,
    generate_gparam,
    maybe_pad_tensor_for_block_quant,
)
from safetensors.torch import load_file, save_file  # noqa: E402

W4_CHANNEL_ASYM = QuantizationScheme(
    targets=["Linear"],
    weights=QuantizationArgs(num_bits=4, type="int", strategy="channel", symmetric=False),
)
W4_GROUP_SYM = QuantizationScheme(
    targets=["Linear"],
    weights=QuantizationArgs(num_bits=4, type="int", strategy="group", group_size=32),
)
W3_GROUP_ASYM = QuantizationScheme(
    targets=["Linear"],
    weights=QuantizationArgs(
        num_bits=3, type="int", strategy="group", group_size=32, symmetric=False
    ),
)
SCHEMES = {
    "FP8": "FP8",  # float-quantized, per tensor
    "FP8_DYNAMIC": "FP8_DYNAMIC",  # per channel
    "FP8_BLOCK": "FP8_BLOCK",  # 128 x 128 blocks
    "NVFP4": "NVFP4",
    "MXFP4": "MXFP4",
    "MXFP8": "MXFP8",
    "W8A8": "W8A8",  # int-quantized, per channel
    "W8A16": "W8A16",  # int8 groups of 128
    "W4A16": "W4A16",  # pack-quantized, groups of 128
    "W4A16_ASYM": "W4A16_ASYM",  # with zero points
    "W4_CHANNEL_ASYM": W4_CHANNEL_ASYM,
    "W4_GROUP_SYM": W4_GROUP_SYM,
    "W3_GROUP_ASYM": W3_GROUP_ASYM,
}


def _observed(w: torch.Tensor, args: QuantizationArgs):
    """The min and max llm-compressor's min-max observer hands calculate_qparams."""
    if args.strategy == "tensor":
        return torch.aminmax(w)
    if args.strategy == "channel":
        return w.amin(1, keepdim=True), w.amax(1, keepdim=True)
    if args.strategy == "block":
        b = args.block_structure
        p = maybe_pad_tensor_for_block_quant(w, tuple(b))
        r = p.reshape(p.shape[0] // b[0], b[0], p.shape[1] // b[1], b[1])
        return r.amin((1, 3)), r.amax((1, 3))
    g = w.reshape(w.shape[0], -1, args.group_size)
    return g.amin(-1), g.amax(-1)


def build(folder: str, scheme) -> None:
    """A tiny Llama quantized by compressed-tensors' own compressors, saved in shards."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        hidden_size=128,
        # FP8 blocks of 128: partial edge blocks; groups of 128 divide 384
        intermediate_size=320 if scheme in ("FP8", "FP8_BLOCK", "FP8_DYNAMIC") else 384,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    if isinstance(scheme, str):
        scheme = preset_name_to_scheme(scheme, ["Linear"])
    qc = QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"])
    apply_quantization_config(model, qc)
    for m in model.modules():
        s = getattr(m, "quantization_scheme", None)
        if s is None or s.weights is None:
            continue
        w = m.weight.data
        gs = None
        if s.weights.strategy == "tensor_group":
            gs = generate_gparam(*torch.aminmax(w))
            m.weight_global_scale.data.copy_(gs)
        scale, zp = calculate_qparams(*_observed(w, s.weights), s.weights, global_scale=gs)
        m.weight_scale.data = scale.to(m.weight_scale.dtype).reshape(m.weight_scale.shape)
        if hasattr(m, "weight_zero_point"):
            m.weight_zero_point.data = zp.to(m.weight_zero_point.dtype).reshape(
                m.weight_zero_point.shape
            )
        if hasattr(m, "input_scale"):
            m.input_scale.data.fill_(0.25)
    mc = ModelCompressor.from_pretrained_model(model)
    mc.compress_model(model)
    model.save_pretrained(folder, max_shard_size="200KB")
    mc.update_config(folder)


def stored(folder: str) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in sorted(glob.glob(os.path.join(folder, "*.safetensors"))):
        out.update(load_file(f))
    return out


def reference(folder: str) -> dict[str, torch.Tensor]:
    """Every quantized weight as compressed-tensors' own decompressor gives it."""
    with open(os.path.join(folder, "config.json")) as f:
        qc = json.load(f)["quantization_config"]
    group = qc["config_groups"]["group_0"]
    scheme = QuantizationScheme(**{k: v for k, v in group.items() if k != "format"})
    comp = BaseCompressor.get_value_from_registry(group["format"] or qc["format"])
    sd = stored(folder)
    bases = {n.rsplit(".", 1)[0] for n in sd if n.endswith(".weight_scale")}
    out = {}
    for base in sorted(bases):
        local = {n[len(base) + 1 :]: t for n, t in sd.items() if n.startswith(base + ".")}
        out[base + ".weight"] = comp.decompress(local, scheme)["weight"]
    return out


def bits(a) -> np.ndarray:
    if isinstance(a, torch.Tensor):
        a = a.contiguous()
        return a.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[a.element_size()]).numpy()
    return a.view({1: np.uint8, 2: np.int16, 4: np.int32}[a.dtype.itemsize])


@pytest.fixture(scope="module", params=list(SCHEMES))
def checkpoint(request, tmp_path_factory):
    folder = str(tmp_path_factory.mktemp(request.param.lower()))
    build(folder, SCHEMES[request.param])
    return folder


def test_every_weight_equals_compressed_tensors_decompression_bit_for_bit(checkpoint):
    ref = reference(checkpoint)
    assert len(ref) == 14
    got = qs.open_checkpoint(checkpoint)
    for name, want in ref.items():
        t = got[name]
        assert tuple(t.shape) == tuple(want.shape)
        assert np.array_equal(bits(t[...]), bits(want)), name
        # a row range (FP8 blocks: not aligned to 128) decodes the same bits
        assert np.array_equal(bits(t[70:133, 5:77]), bits(want[70:133, 5:77])), name


def test_scales_are_consumed_and_activation_scales_stay_plain_tensors(checkpoint):
    got = qs.open_checkpoint(checkpoint)
    raw = stored(checkpoint)
    params = ("weight_scale", "weight_zero_point", "weight_global_scale", "weight_shape")
    assert not [n for n in got if n.rsplit(".", 1)[1] in params]
    assert not [n for n in got if n.endswith("_packed")]
    for name in [n for n in raw if n.endswith("input_scale")]:
        assert np.array_equal(bits(got[name][...]), bits(raw[name]))
    plain = [n for n in raw if n.endswith(("norm.weight", "embed_tokens.weight", "lm_head.weight"))]
    for name in plain:
        assert np.array_equal(bits(got[name][...]), bits(raw[name]))


def _variant(src: str, dst: str, edit) -> str:
    """A copy of ``src`` with one tensor of one shard changed by ``edit(tensors)``."""
    shutil.copytree(src, dst)
    for f in sorted(glob.glob(os.path.join(dst, "*.safetensors"))):
        sd = load_file(f)
        if "model.layers.0.self_attn.q_proj.weight_scale" in sd:
            edit(sd)
            save_file(sd, f, metadata={"format": "pt"})
            index = os.path.join(dst, "model.safetensors.index.json")
            with open(index) as fi:
                doc = json.load(fi)
            doc["weight_map"] = {
                n: s for n, s in doc["weight_map"].items() if n in sd or s != os.path.basename(f)
            }
            with open(index, "w") as fo:
                json.dump(doc, fo)
            return dst
    raise AssertionError("no shard holds the tensor")


@pytest.fixture(scope="module")
def fp8_block(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("fp8_block_v"))
    build(folder, "FP8_BLOCK")
    return folder


Q = "model.layers.0.self_attn.q_proj.weight_scale"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda sd: sd.update({Q: torch.cat([sd[Q], sd[Q]])}), "matches no strategy"),
        (lambda sd: sd.update({Q: sd[Q].to(torch.float16)}), "float16"),
        (lambda sd: sd[Q].view(-1)[0].fill_(float("nan")), "NaN"),
        (lambda sd: sd[Q].view(-1)[0].fill_(0.0), "zero scales"),
        (lambda sd: sd[Q].view(-1)[0].fill_(-1.0), "negative scales"),
        (lambda sd: sd.pop(Q), "half a pair"),
    ],
    ids=["shape", "dtype", "nan", "zero", "negative", "missing"],
)
def test_crafted_scales_are_refused_when_the_checkpoint_is_opened(
    fp8_block, tmp_path, edit, message
):
    bad = _variant(fp8_block, str(tmp_path / "bad"), edit)
    with pytest.raises(StoreError, match=message):
        qs.open_checkpoint(bad)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"quant_method": "gptq"}, "'gptq'"),
        ({"quant_method": "awq"}, "'awq'"),
        ({"format": "sparse-24-bitmask", "config_groups": {}}, "sparse-24-bitmask"),
    ],
)
def test_unknown_methods_and_formats_are_refused_by_name(fp8_block, tmp_path, change, message):
    bad = str(tmp_path / "bad")
    shutil.copytree(fp8_block, bad)
    path = os.path.join(bad, "config.json")
    with open(path) as f:
        doc = json.load(f)
    doc["quantization_config"].update(change)
    with open(path, "w") as f:
        json.dump(doc, f)
    with pytest.raises(StoreError, match=message):
        qs.open_checkpoint(bad)


def test_a_scaled_fp8_layout_without_its_config_is_refused(fp8_block, tmp_path):
    bare = str(tmp_path / "bare")
    shutil.copytree(fp8_block, bare)
    os.remove(os.path.join(bare, "config.json"))
    with pytest.raises(StoreError, match="without its scale"):
        qs.open_checkpoint(bare)


def test_the_command_line_refuses_an_undecoded_format_with_exit_2_creating_nothing(
    fp8_block, tmp_path
):
    from typer.testing import CliRunner

    from cli.main import app

    bad = str(tmp_path / "bad")
    shutil.copytree(fp8_block, bad)
    path = os.path.join(bad, "config.json")
    with open(path) as f:
        doc = json.load(f)
    doc["quantization_config"]["config_groups"]["group_0"]["format"] = "marlin-24"
    with open(path, "w") as f:
        json.dump(doc, f)
    runner = CliRunner()
    for extra in (["--dry-run"], []):
        dst = tmp_path / "out.zarr"
        r = runner.invoke(app, ["convert", bad, str(dst), *extra])
        assert r.exit_code == 2, r.output
        assert "marlin-24" in r.output
        assert not dst.exists()
    name = "model.layers.0.mlp.up_proj.weight"
    r = runner.invoke(app, ["calibrate", bad, "--tensor", name])
    assert r.exit_code == 2 and "marlin-24" in r.output


def test_a_compressed_tensors_source_converts_from_its_decoded_values(fp8_block, tmp_path):
    dst = str(tmp_path / "out.zarr")
    qs.convert_checkpoint(fp8_block, dst)
    ref = reference(fp8_block)
    name = "model.layers.0.mlp.down_proj.weight"
    got = qs.open_quantized(f"{dst}/{name}")[...]
    want = ref[name].float().numpy()
    err = np.abs(got.astype(np.float32) - want).max()
    assert err <= np.abs(want).max() / 100  # int8 of the decoded values, not of the codes


_LOAD = """
import json, sys, torch, transformers
m = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], torch_dtype=torch.bfloat16)
print(json.dumps({n: p.detach().view(torch.int16).flatten().tolist()[:4096]
                  for n, p in m.named_parameters() if n.endswith("proj.weight")}))
"""


def test_dequantize_of_a_quantized_folder_writes_a_plain_model_transformers_loads(
    fp8_block, tmp_path
):
    """``qstream dequantize CT_FOLDER out/model.safetensors --dtype bfloat16``: the values
    compressed-tensors' decompressor gives, and the source's config without its
    quantization_config, loaded by transformers (a fresh process) as a plain bf16 model."""
    from typer.testing import CliRunner

    from cli.main import app
    from tests.support import fresh

    out = tmp_path / "plain"
    r = CliRunner().invoke(
        app, ["dequantize", fp8_block, str(out / "model.safetensors"), "--dtype", "bfloat16"]
    )
    assert r.exit_code == 0, r.output
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config and config["torch_dtype"] == "bfloat16"
    p = fresh.run(["-c", _LOAD, out], timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    loaded = json.loads(p.stdout.strip().splitlines()[-1])
    want = reference(fp8_block)
    assert loaded and set(loaded) <= set(want)
    for name, values in loaded.items():
        w = want[name].to(torch.bfloat16).view(torch.int16).flatten().tolist()[:4096]
        assert values == w, name


@pytest.fixture(scope="module")
def fp8_static(tmp_path_factory):
    """FP8 per tensor with static activation scales (``input_scale`` beside each weight)."""
    folder = str(tmp_path_factory.mktemp("fp8_static"))
    build(folder, "FP8")
    return folder


def test_activation_scales_stay_plain_in_zarr_and_are_left_out_of_a_decoded_model(
    fp8_static, tmp_path
):
    """``input_scale`` is a plain tensor of the source (and of a Zarr conversion, bit for
    bit, never quantized); ``qstream dequantize SRC out/model.safetensors`` leaves it out:
    transformers loads the plain model without an unexpected key."""
    from transformers import AutoModelForCausalLM
    from typer.testing import CliRunner

    from cli.main import app

    raw = stored(fp8_static)
    scales = [n for n in raw if n.endswith(".input_scale")]
    assert len(scales) == 14
    dst = str(tmp_path / "out.zarr")
    every = qs.Recipe.from_dict({"min_rank": 0, "rules": [{"pattern": "*", "spec": {}}]})
    plan = qs.plan_convert(fp8_static, dst, every)  # (a recipe quantizing every tensor)
    targets = {r["name"]: r["target"] for r in plan.tensors}
    assert {n: targets[n] for n in scales} == dict.fromkeys(scales, "keep")
    assert targets["model.norm.weight"] != "keep"
    qs.convert_checkpoint(fp8_static, dst, every)
    group = qs.open_checkpoint(dst)  # (kept tensors: plain Zarr arrays)
    for name in scales:
        assert np.array_equal(bits(group[name][...]), bits(raw[name])), name
    out = tmp_path / "plain"
    r = CliRunner().invoke(app, ["dequantize", fp8_static, str(out / "model.safetensors")])
    assert r.exit_code == 0, r.output
    written = load_file(str(out / "model.safetensors"))
    assert not [n for n in written if "scale" in n]
    assert set(written) == set(reference(fp8_static)) | {
        n for n in raw if n.endswith(("norm.weight", "embed_tokens.weight", "lm_head.weight"))
    }
    _, info = AutoModelForCausalLM.from_pretrained(str(out), output_loading_info=True)
    assert not info["unexpected_keys"] and not info["missing_keys"]


NAMES = {
    "FP8": "compressed-tensors float-quantized (FP8, per tensor)",
    "FP8_DYNAMIC": "compressed-tensors float-quantized (FP8, per channel)",
    "FP8_BLOCK": "compressed-tensors float-quantized (FP8, blocks 128x128)",
    "NVFP4": "compressed-tensors nvfp4-pack-quantized (NVFP4)",
    "MXFP4": "compressed-tensors mxfp4-pack-quantized (MXFP4)",
    "MXFP8": "compressed-tensors mxfp8-quantized (MXFP8)",
    "W8A8": "compressed-tensors int-quantized (INT8, per channel)",
    "W8A16": "compressed-tensors pack-quantized (INT8, groups of 128)",
    "W4A16": "compressed-tensors pack-quantized (INT4, groups of 128)",
    "W4A16_ASYM": "compressed-tensors pack-quantized (INT4, groups of 128, zero points)",
    "W4_CHANNEL_ASYM": "compressed-tensors pack-quantized (INT4, per channel, zero points)",
    "W4_GROUP_SYM": "compressed-tensors pack-quantized (INT4, groups of 32)",
    "W3_GROUP_ASYM": "compressed-tensors pack-quantized (INT3, groups of 32, zero points)",
}


def _inspect_json(path: str) -> dict:
    from typer.testing import CliRunner

    from cli.main import app

    r = CliRunner().invoke(app, ["inspect", path, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.output[r.output.index("{") :])


def test_inspect_names_the_format_of_a_quantized_folder_file_and_index(checkpoint, request):
    """``qstream inspect`` of a compressed-tensors checkpoint (folder, index or one shard)
    names its format and scheme as the quantization_config compressed-tensors wrote says."""
    want = NAMES[request.node.callspec.params["checkpoint"]]
    raw = stored(checkpoint)
    for path in (
        checkpoint,
        os.path.join(checkpoint, "model.safetensors.index.json"),
        sorted(glob.glob(os.path.join(checkpoint, "*.safetensors")))[0],
    ):
        got = _inspect_json(path)
        assert got["quantization"] == want and got["decoded"] is True, path
    got = _inspect_json(checkpoint)
    assert got["tensors"] == len(raw)
    assert {t["name"]: t["shape"] for t in got["tensor_list"]} == {
        n: list(t.shape) for n, t in raw.items()
    }


@pytest.mark.parametrize(
    ("config", "name", "decoded"),
    [
        ({"quant_method": "fp8", "weight_block_size": [128, 128]},
         "DeepSeek fp8 blocks 128x128", True),
        ({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": True},
         "GPTQ 4-bit, groups of 128, act-order", False),
        ({"quant_method": "awq", "bits": 4, "group_size": 64}, "AWQ 4-bit, groups of 64", False),
    ],
)  # fmt: skip
def test_inspect_names_other_quantization_methods_and_says_which_are_refused(
    tmp_path, config, name, decoded
):
    folder = tmp_path / "m"
    folder.mkdir()
    w = torch.ones(256, 128).to(torch.float8_e4m3fn)
    save_file(
        {"a.weight": w, "a.weight_scale_inv": torch.ones(2, 1)}, str(folder / "m.safetensors")
    )
    (folder / "config.json").write_text(json.dumps({"quantization_config": config}))
    got = _inspect_json(str(folder))
    assert got["quantization"] == name and got["decoded"] is decoded
    assert (got["refused"] is None) is decoded
    if not decoded:
        assert repr(config["quant_method"]) in got["refused"]


def test_requantizing_reports_its_error_against_the_decoded_source(fp8_block, tmp_path):
    """The SQNR ``convert`` reports of a quantized source is that of the new values against
    the source's decoded values (compressed-tensors' decompression: what the user has), not
    against its stored codes."""
    from typer.testing import CliRunner

    from cli.main import app

    dst = str(tmp_path / "out.zarr")
    r = CliRunner().invoke(app, ["convert", fp8_block, dst, "--json"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.output[r.output.index("{") :])
    ref, raw = reference(fp8_block), stored(fp8_block)
    assert len(ref) == 14
    for name, want in ref.items():
        row = report["tensors"][name]
        got = np.asarray(qs.open_quantized(f"{dst}/{name}")[...], np.float64)
        x = want.double().numpy()
        sqnr = 10 * np.log10((x**2).sum() / ((x - got) ** 2).sum())
        assert row["error"]["sqnr_db"] == pytest.approx(sqnr, rel=1e-9), name
        codes = raw[name].double().numpy()
        wrong = 10 * np.log10((codes**2).sum() / ((codes - got) ** 2).sum())
        assert abs(wrong - sqnr) > 10, name  # (the codes are not the values)
