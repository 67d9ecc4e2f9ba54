"""Mixture-of-experts compressed-tensors folders, per model type (Mixtral, Qwen2-MoE,
Qwen3-MoE, tiny models built with transformers 5.24), checked against compressed-tensors'
own export of the same checkpoint (its ``ModelCompressor`` on per-expert ``nn.Linear``
modules, ``tests/support/ct_reference.py``), both loaded in fresh processes by
``AutoModelForCausalLM.from_pretrained``: where compressed-tensors' own export loads,
qstream's writes the same bytes and loads to the same weights and logits; where it does not,
qstream refuses in the plan, naming the model type and the reason."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import qstream as qs
from cli.main import app
from tests.support.fresh import run_json

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("compressed_tensors")

MOE = ["mixtral", "qwen2_moe", "qwen3_moe"]
SCHEMES = ["W8A16", "W4A16", "FP8_DYNAMIC"]
#: the cases the default run keeps (Mixtral, one model built: a load, a refusal, a recipe);
#: the others run with ``pytest -m slow`` (the whole grid: ~3.5 min on 2 cores)
QUICK = {("mixtral", "W4A16")}


def grid(pairs: list[tuple[str, str]], quick: set[tuple[str, str]]) -> list[object]:
    """``pairs`` as parameters, those not in ``quick`` marked slow."""
    return [pytest.param(*p, marks=() if p in quick else pytest.mark.slow) for p in pairs]


def per_type(quick: str) -> list[object]:
    """The model types as parameters, all but ``quick`` marked slow."""
    return [pytest.param(m, marks=() if m == quick else pytest.mark.slow) for m in MOE]


fresh = run_json  # (a support script in a fresh process: tests/support/fresh.py)


@pytest.fixture(scope="module")
def moe(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param) / "src"
    fresh("hf_deploy.py", "build", folder, 128, "untied", "float32", request.param)
    return request.param, folder


def _raw(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.element_size() == 1 else t


def _same(a: dict, b: dict) -> list[str]:
    """The names whose tensors differ (dtype, shape or bytes) or exist in one dict only."""
    out = sorted(set(a) ^ set(b))
    for k in set(a) & set(b):
        x, y = a[k], b[k]
        if x.dtype != y.dtype or x.shape != y.shape or not torch.equal(_raw(x), _raw(y)):
            out.append(k)
    return out


@pytest.fixture(scope="module")
def mixtral_bf16(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mixtral_bf16") / "src"
    fresh("hf_deploy.py", "build", folder, 128, "untied", "bfloat16", "mixtral")
    return folder


@pytest.mark.parametrize(
    ("moe", "scheme"), grid([(m, s) for m in MOE for s in SCHEMES], QUICK), indirect=["moe"]
)
def test_moe_scheme_export_loads_like_compressed_tensors_own_export(moe, scheme, tmp_path):
    _check_like_ct(moe[1], scheme, tmp_path, "float32")


@pytest.mark.parametrize("scheme", [pytest.param(s, marks=pytest.mark.slow) for s in SCHEMES])
def test_bf16_mixtral_scheme_export_loads_like_compressed_tensors_own_export_in_bf16(
    mixtral_bf16, scheme, tmp_path
):
    _check_like_ct(mixtral_bf16, scheme, tmp_path, "bfloat16")


def _check_like_ct(src, scheme: str, tmp_path, dtype: str) -> None:
    from safetensors.torch import load_file

    ref = tmp_path / "ct"
    made = fresh("ct_reference.py", "export", src, ref, scheme)
    out = tmp_path / "qs" / "model.safetensors"
    plan = qs.plan_convert(src, out, scheme=scheme)
    assert not any("expert" in n and "refus" in n for n in plan.notes)
    # (1 MiB, the smallest bound: weights of 256 rows written in slabs of 170)
    report = qs.convert_checkpoint(src, out, scheme=scheme, max_memory=1 << 20)
    experts = [n for n in report["tensors"] if ".experts." in n]
    assert experts and all(not report["tensors"][n]["kept"] for n in experts)
    ours, theirs = load_file(out), load_file(ref / "model.safetensors")
    assert len(theirs) == made["tensors"] and _same(ours, theirs) == []
    ct_run = fresh("hf_deploy.py", "run", ref, tmp_path / "ct.pt", dtype)
    qs_run = fresh("hf_deploy.py", "run", out.parent, tmp_path / "qs.pt", dtype)
    assert ct_run["loads"] and qs_run["loads"], (ct_run, qs_run)
    assert qs_run["dtype"] == f"torch.{dtype}"
    assert qs_run["generated"] > 0 and qs_run["finite"]
    a, b = torch.load(tmp_path / "qs.pt"), torch.load(tmp_path / "ct.pt")
    fused = [k for k in a["state"] if k.endswith("experts.gate_up_proj")]
    assert len(fused) == 2, sorted(a["state"])[:20]  # transformers' 3-D experts, a layer each
    assert _same(a["state"], b["state"]) == []
    assert torch.equal(a["logits"], b["logits"])
    # the experts hold the dequantized weights (not a fresh initialisation): near the source
    w = load_file(src / "model.safetensors")
    first = next(n for n in sorted(w) if "layers.0." in n and ".experts.0." in n
                 and n.endswith(("w1.weight", "gate_proj.weight")))  # fmt: skip
    got = a["state"]["model.layers.0.mlp.experts.gate_up_proj"][0, : w[first].shape[0]]
    assert got.dtype == w[first].dtype
    assert (got - w[first]).float().abs().max() < 0.1 * w[first].float().abs().max()


@pytest.mark.parametrize(
    ("moe", "scheme"),
    grid([(m, s) for m in MOE for s in ("FP8_BLOCK", "MXFP8A16")], {("mixtral", "FP8_BLOCK")}),
    indirect=["moe"],
)  # fmt: skip
def test_moe_scheme_export_refused_where_compressed_tensors_own_export_fails(moe, scheme, tmp_path):
    kind, src = moe
    out = tmp_path / "qs" / "model.safetensors"
    r = CliRunner().invoke(app, ["convert", str(src), str(out), "--scheme", scheme, "--dry-run"])
    assert r.exit_code == 2 and r.output.startswith(f"error: {kind}: "), r.output
    assert scheme in r.output and "3-D experts.gate_up_proj" in r.output
    assert not out.parent.exists()


@pytest.mark.slow  # (the reference's behaviour, ~8 s of torch processes; qstream's refusal above)
@pytest.mark.parametrize("moe", ["mixtral"], indirect=True)
def test_compressed_tensors_own_fp8_block_export_of_moe_experts_does_not_load(moe, tmp_path):
    """The measurement behind the refusal: Mixtral's experts span 2 blocks, and
    compressed-tensors' own FP8_BLOCK export of them fails transformers' load."""
    _, src = moe
    fresh("ct_reference.py", "export", src, tmp_path / "ct", "FP8_BLOCK")
    got = fresh("hf_deploy.py", "run", tmp_path / "ct", tmp_path / "ct.pt", "float32")
    assert not got["loads"] and "conversion" in got["error"].lower(), got


@pytest.mark.parametrize("moe", per_type("mixtral"), indirect=True)
def test_moe_recipe_export_with_kept_experts_is_refused_as_compressed_tensors_own_fails(
    moe, tmp_path
):
    kind, src = moe
    out = tmp_path / "qs" / "model.safetensors"
    r = CliRunner().invoke(app, ["convert", str(src), str(out), "--exclude", "*experts*"])
    assert r.exit_code == 2 and r.output.startswith(f"error: {kind}: "), r.output
    assert "kept float experts" in r.output and not out.parent.exists()
    r = CliRunner().invoke(app, ["convert", str(src), str(out), "--dry-run"])
    assert r.exit_code == 2 and "one symmetric 4-bit layout" in r.output, r.output


@pytest.mark.slow  # (the reference's behaviour, ~15 s of torch processes; qstream's refusal above)
@pytest.mark.parametrize("moe", per_type("mixtral"), indirect=True)
def test_compressed_tensors_own_integer_export_with_kept_experts_does_not_load(moe, tmp_path):
    """The measurement behind the refusal: compressed-tensors' own integer export with its
    experts ignored fails transformers' load; an FP8 scheme passes float experts through."""
    _, src = moe
    fresh("ct_reference.py", "export", src, tmp_path / "w4", "W4A16", "keep-experts")
    got = fresh("hf_deploy.py", "run", tmp_path / "w4", tmp_path / "w4.pt", "float32")
    assert not got["loads"] and "conversion" in got["error"].lower(), got
    fresh("ct_reference.py", "export", src, tmp_path / "f8", "FP8_DYNAMIC", "keep-experts")
    assert fresh("hf_deploy.py", "run", tmp_path / "f8", tmp_path / "f8.pt", "float32")["loads"]


@pytest.mark.parametrize("moe", per_type("mixtral"), indirect=True)
def test_moe_recipe_export_with_symmetric_int4_experts_loads_bit_exact(moe, tmp_path):
    import numpy as np

    kind, src = moe
    out = tmp_path / "qs" / "model.safetensors"
    args = ["convert", str(src), str(out), "--dtype", "int4", "--block-size", "128",
            "--exclude", "*embed*", "--exclude", "*gate.weight"]  # fmt: skip
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    asym = CliRunner().invoke(app, [*args[:3], "--overwrite", "--asymmetric", *args[3:]])
    assert asym.exit_code == 2 and f"error: {kind}: " in asym.output, asym.output
    got = fresh("hf_deploy.py", "run", out.parent, tmp_path / "qs.pt", "float32")
    assert got["loads"] and got["finite"] and got["generated"] > 0, got
    state = torch.load(tmp_path / "qs.pt")["state"]
    ck = qs.open_quantized(out)
    mlp = "block_sparse_moe.experts.{}." if kind == "mixtral" else "mlp.experts.{}."
    parts = ("w1", "w3", "w2") if kind == "mixtral" else ("gate_proj", "up_proj", "down_proj")
    names = [mlp + p for p in parts]
    compared = 0
    for layer in range(2):
        fused = state[f"model.layers.{layer}.mlp.experts.gate_up_proj"].numpy()
        down = state[f"model.layers.{layer}.mlp.experts.down_proj"].numpy()
        for e in range(4):
            g, u, d = (
                np.asarray(ck[f"model.layers.{layer}.{n.format(e)}.weight"][...], np.float32)
                for n in names
            )
            np.testing.assert_array_equal(
                fused[e].view(np.uint32), np.concatenate([g, u]).view(np.uint32)
            )
            np.testing.assert_array_equal(down[e].view(np.uint32), d.view(np.uint32))
            compared += 1
    assert compared == 8
