"""Importance matrices from Zarr activation dumps (issue 47, item 3): qstream's sums against a
float64 oracle and llama.cpp's float32 token-order definition, chunking-independent files,
the file byte-equal to ggml's GGUF writer, read by llama.cpp's own loader and used by
``llama_model_quantize``, legacy ``.dat`` files read, and crafted dumps refused."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from qstream.errors import InvalidParameterError, NonFiniteInputError
from qstream.exports.gguf.imatrix import importance_weights, read_imatrix, weights_for
from qstream.exports.gguf.importance import compute_imatrix, square_sums
from tests.support import llama_imatrix as llama
from tests.support.activations import dump_activations, tiny_llama

zarr = pytest.importorskip("zarr")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

HIDDEN, INTER, LAYERS = 256, 512, 2


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("imatrix")
    model = tiny_llama(root / "model", hidden=HIDDEN, inter=INTER, layers=LAYERS)
    acts = dump_activations(model, root / "acts.zarr", lengths=(37, 50, 29, 44), chunk_rows=16)
    return {"root": root, "model": model, "acts_path": root / "acts.zarr", "acts": acts}


def _file_tensors(path: Path) -> dict[str, np.ndarray]:
    """The tensors of a GGUF file as gguf-py reads them (flat float32)."""
    from gguf import GGUFReader

    return {
        t.name: np.asarray(t.data, dtype=np.float32).reshape(-1) for t in GGUFReader(path).tensors
    }


def _f32_token_order(x: np.ndarray) -> np.ndarray:
    """llama-imatrix's accumulation: ``acc[j] += x[j] * x[j]`` in float32, token by token."""
    acc = np.zeros(x.shape[1], dtype=np.float32)
    x = x.astype(np.float32)
    for row in x:
        acc += row * row
    return acc


def test_sums_equal_float64_oracle_and_llama_float32_token_order_within_bound(tiny, tmp_path):
    out = tmp_path / "a.imatrix"
    summary = compute_imatrix(tiny["acts_path"], tiny["model"], out, chunk_size=64)
    tensors = _file_tensors(out)
    names = {
        "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }  # fmt: skip
    expected = {f"blk.{i}.{g}.weight" for i in range(LAYERS) for g in names.values()}
    assert set(summary.entries) == expected and summary.left_out == ("lm_head",)
    n = 37 + 50 + 29 + 44
    assert summary.tokens == n and summary.chunk_count == n // 64
    for i in range(LAYERS):
        for hf, g in names.items():
            x = tiny["acts"][f"model.layers.{i}.{hf}"]
            got = tensors[f"blk.{i}.{g}.weight.in_sum2"].astype(np.float64)
            oracle = np.sum(x.astype(np.float64) ** 2, axis=0)
            np.testing.assert_allclose(got, oracle, rtol=2.0**-23, atol=0)
            llama32 = _f32_token_order(x).astype(np.float64)
            assert np.all(np.abs(got - llama32) <= n * 2.0**-24 * oracle)
            assert tensors[f"blk.{i}.{g}.weight.counts"].tolist() == [n]


def test_float64_sums_are_within_n_ulp53_of_the_exact_sum():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((300, 7)) * np.exp(rng.uniform(-8, 8, (300, 1)))).astype(np.float32)
    sums, count = square_sums(x, max_memory=4096)
    assert count == 300
    exact = [math.fsum(float(v) ** 2 for v in x[:, j]) for j in range(7)]
    assert np.all(np.abs(sums - exact) <= 300 * 2.0**-53 * np.array(exact))


def test_chunked_and_whole_reads_write_identical_files(tiny, tmp_path, monkeypatch):
    whole = tmp_path / "whole"
    whole.mkdir()
    group = zarr.open_group(str(whole / "acts.zarr"), mode="w")
    for name, a in tiny["acts"].items():
        group.create_array(name, data=a, chunks=a.shape)
    small = tmp_path / "small"
    small.mkdir()
    (small / "acts.zarr").symlink_to(tiny["acts_path"])
    files = []
    for folder, memory in ((whole, None), (small, 1 << 17), (small, 300_000), (small, None)):
        monkeypatch.chdir(folder)
        out = tmp_path / f"{len(files)}.imatrix"
        compute_imatrix("acts.zarr", tiny["model"], out, max_memory=memory)
        files.append(out.read_bytes())
    assert all(f == files[0] for f in files[1:])


def test_file_bytes_equal_ggml_gguf_writer_given_the_same_statistics(tiny, tmp_path):
    ours = tmp_path / "ours.imatrix"
    compute_imatrix(tiny["acts_path"], tiny["model"], ours, chunk_size=32, include_output=True)
    tensors = _file_tensors(ours)
    entries = {
        name[: -len(".in_sum2")]: (v.reshape(1, -1), tensors[name[: -len(".in_sum2")] + ".counts"])
        for name, v in tensors.items()
        if name.endswith(".in_sum2")
    }
    assert "output.weight" in entries
    theirs = tmp_path / "ggml.imatrix"
    llama.ggml_write_imatrix(theirs, entries, [str(tiny["acts_path"])], 160 // 32, 32)
    assert ours.read_bytes() == theirs.read_bytes()


@pytest.fixture(scope="module")
def loader(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return llama.build_loader(tmp_path_factory.mktemp("loader"))


def test_llama_cpp_loader_reads_the_file_as_qstream_reads_it(tiny, loader, tmp_path):
    out = tmp_path / "x.imatrix"
    compute_imatrix(tiny["acts_path"], tiny["model"], out, chunk_size=40)
    loaded = llama.load(loader, out)
    assert loaded["metadata"] and not loaded["legacy"]
    assert (loaded["chunk_count"], loaded["chunk_size"]) == (4, 40)
    assert loaded["datasets"] == [str(tiny["acts_path"])]
    ours = read_imatrix(out)
    assert set(loaded["entries"]) == set(ours.sums)
    for name, (sums, counts) in loaded["entries"].items():
        assert np.array_equal(sums, ours.sums[name].reshape(-1))
        assert counts.tolist() == ours.counts[name].tolist() == [160]
    mine = importance_weights(ours)
    for name, w in llama.quantize_weights(loaded).items():
        assert np.array_equal(w, mine[name])


def test_llama_model_quantize_uses_the_file(tiny, loader, tmp_path):
    from gguf import GGUFReader

    from qstream.compat.gguf import quantize
    from tests.support.gguf_models import run_converter

    f32 = run_converter(tiny["model"], tmp_path / "f32.gguf")
    imx = tmp_path / "x.imatrix"
    compute_imatrix(tiny["acts_path"], tiny["model"], imx)
    weights = llama.quantize_weights(llama.load(loader, imx))
    q4km = 15  # LLAMA_FTYPE_MOSTLY_Q4_K_M
    assert llama.llama_quantize(f32, tmp_path / "with.gguf", q4km, weights) == 0
    assert llama.llama_quantize(f32, tmp_path / "without.gguf", q4km, None) == 0
    src = {t.name: t for t in GGUFReader(f32).tensors}
    with_, without = (
        {t.name: t for t in GGUFReader(tmp_path / n).tensors} for n in ("with.gguf", "without.gguf")
    )
    q4k = [n for n, t in with_.items() if t.tensor_type.name == "Q4_K" and n in weights]
    assert "blk.0.ffn_down.weight" in q4k and len(q4k) >= 8
    mine = importance_weights(read_imatrix(imx))
    for name in q4k:
        assert without[name].tensor_type.name == "Q4_K"
        got = np.asarray(with_[name].data).tobytes()
        assert got != np.asarray(without[name].data).tobytes()
        x = np.asarray(src[name].data, dtype=np.float32)
        w = weights_for(mine, name, x.shape)
        assert np.asarray(quantize(x, "Q4_K", imatrix=w)).tobytes() == got


def _legacy(path: Path, entries: dict[str, tuple[np.ndarray, int]], chunks: int, name: str) -> None:
    """A legacy .dat as save_imatrix_legacy lays it out (values are ``sum / count * ncall``)."""
    with open(path, "wb") as f:
        f.write(struct.pack("<i", len(entries)))
        for key in sorted(entries):
            values, ncall = entries[key]
            f.write(struct.pack("<i", len(key)) + key.encode())
            f.write(struct.pack("<ii", ncall, values.size) + values.astype("<f4").tobytes())
        f.write(struct.pack("<ii", chunks, len(name)) + name.encode())


def test_legacy_dat_reads_as_llama_cpp_reads_it(loader, tmp_path):
    rng = np.random.default_rng(5)
    entries = {
        "blk.0.attn_q.weight": (rng.random(256).astype(np.float32) * 3, 4),
        "blk.1.ffn_down.weight": (rng.random(512).astype(np.float32), 0),
        "blk.0.ffn_gate_exps.weight": (rng.random(4 * 64).astype(np.float32), 7),
    }
    path = tmp_path / "old.dat"
    _legacy(path, entries, 9, "wiki.train.raw")
    ours = read_imatrix(path)
    loaded = llama.load(loader, path)
    assert ours.legacy and loaded["legacy"]
    assert ours.datasets == loaded["datasets"] == ["wiki.train.raw"]
    assert ours.chunk_count == loaded["chunk_count"] == 9
    theirs = llama.quantize_weights(loaded)
    mine = importance_weights(ours)
    assert set(mine) == set(theirs) == set(entries)
    for name in entries:
        assert np.array_equal(mine[name], theirs[name])
    assert weights_for(mine, "blk.0.ffn_gate_exps.weight", (4, 32, 64)).shape == (4, 64)
    with pytest.raises(InvalidParameterError, match="imatrix size 256 is different"):
        weights_for(mine, "blk.0.attn_q.weight", (256, 128))


def test_moe_expert_dumps_fill_rows_of_the_merged_entry(tmp_path):
    import json

    from safetensors.numpy import save_file

    model = tmp_path / "moe"
    model.mkdir()
    cfg = {"architectures": ["MixtralForCausalLM"], "hidden_size": 64, "intermediate_size": 96,
           "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
           "num_local_experts": 4, "num_experts_per_tok": 2, "vocab_size": 100,
           "max_position_embeddings": 128, "rms_norm_eps": 1e-5}  # fmt: skip
    (model / "config.json").write_text(json.dumps(cfg))
    shapes = {
        f"model.layers.0.block_sparse_moe.experts.{e}.{w}.weight": s
        for e in range(4)
        for w, s in (("w1", (96, 64)), ("w3", (96, 64)), ("w2", (64, 96)))
    }
    shapes["model.layers.0.block_sparse_moe.gate.weight"] = (4, 64)
    save_file(
        {k: np.zeros(s, np.float32) for k, s in shapes.items()}, str(model / "model.safetensors")
    )
    rng = np.random.default_rng(2)
    group = zarr.open_group(str(tmp_path / "acts.zarr"), mode="w")
    dumps = {"model.layers.0.block_sparse_moe.experts.0.w1": rng.standard_normal((30, 64)),
             "model.layers.0.block_sparse_moe.experts.2.w1": rng.standard_normal((11, 64)),
             "model.layers.0.block_sparse_moe.experts.1.w2": rng.standard_normal((5, 96)),
             "model.layers.0.block_sparse_moe.gate": rng.standard_normal((40, 64))}  # fmt: skip
    for k, v in dumps.items():
        group.create_array(k, data=v.astype(np.float32), chunks=(8, v.shape[1]))
    out = tmp_path / "moe.imatrix"
    compute_imatrix(tmp_path / "acts.zarr", model, out, chunk_size=8)
    imx = read_imatrix(out)
    assert sorted(imx.sums) == ["blk.0.ffn_down_exps.weight", "blk.0.ffn_gate_exps.weight",
                                "blk.0.ffn_gate_inp.weight"]  # fmt: skip
    gate = imx.sums["blk.0.ffn_gate_exps.weight"]
    assert gate.shape == (4, 64) and imx.counts["blk.0.ffn_gate_exps.weight"].tolist() == [
        30,
        0,
        11,
        0,
    ]
    for e in (0, 2):
        x = dumps[f"model.layers.0.block_sparse_moe.experts.{e}.w1"].astype(np.float32)
        np.testing.assert_allclose(gate[e], np.sum(x.astype(np.float64) ** 2, 0), rtol=2.0**-23)
    assert not gate[1].any() and not gate[3].any()
    w = importance_weights(imx)["blk.0.ffn_gate_exps.weight"].reshape(4, 64)
    assert np.all(w[1] == 1) and np.all(w[3] == 1)  # (llama-quantize: 1 for an unseen expert)
    assert imx.chunk_count == 40 // 8


def _crafted(tmp_path: Path, arrays: dict[str, np.ndarray]) -> Path:
    group = zarr.open_group(str(tmp_path / "bad.zarr"), mode="w")
    for k, v in arrays.items():
        group.create_array(k, data=v, chunks=(8, v.shape[-1]))
    return tmp_path / "bad.zarr"


@pytest.mark.parametrize(
    ("name", "width", "error", "message"),
    [
        ("model.layers.0.self_attn.q_proj", 100, InvalidParameterError,
         r"model.layers.0.self_attn.q_proj: 100 columns, but its weight .* has 256 in_features"),
        ("model.layers.0.self_attn.rotary", 256, InvalidParameterError,
         "model.layers.0.self_attn.rotary: not the input of a weight llama.cpp's llama"),
        ("model.layers.0.input_layernorm", 256, InvalidParameterError,
         "model.layers.0.input_layernorm: a weight of shape"),
        ("model.layers.7.mlp.up_proj", 256, InvalidParameterError,
         "model.layers.7.mlp.up_proj: no such weight in the model"),
        ("model.embed_tokens", 256, InvalidParameterError, "model.embed_tokens: not the input"),
    ],
)  # fmt: skip
def test_crafted_dumps_are_refused_before_any_work(tiny, tmp_path, name, width, error, message):
    good = tiny["acts"]["model.layers.1.mlp.down_proj"]
    acts = _crafted(tmp_path, {"model.layers.1.mlp.down_proj": good,
                               name: np.ones((16, width), np.float32)})  # fmt: skip
    out = tmp_path / "x.imatrix"
    with pytest.raises(error, match=message) as info:
        compute_imatrix(acts, tiny["model"], out)
    assert "\n" not in str(info.value) and not out.exists()


def test_nan_activations_are_refused_and_nothing_written(tiny, tmp_path):
    x = tiny["acts"]["model.layers.0.mlp.up_proj"].copy()
    x[17, 5] = np.nan
    acts = _crafted(tmp_path, {"model.layers.0.mlp.up_proj": x})
    out = tmp_path / "x.imatrix"
    with pytest.raises(NonFiniteInputError, match=r"model\.layers\.0\.mlp\.up_proj: NaN or inf"):
        compute_imatrix(acts, tiny["model"], out)
    assert not out.exists()


def test_lm_head_is_left_out_unless_asked(tiny, tmp_path):
    head = {"lm_head": tiny["acts"]["lm_head"]}
    acts = _crafted(
        tmp_path, {**head, "model.layers.0.mlp.up_proj": tiny["acts"]["model.layers.0.mlp.up_proj"]}
    )
    out = tmp_path / "x.imatrix"
    assert compute_imatrix(acts, tiny["model"], out).entries == ("blk.0.ffn_up.weight",)
    both = compute_imatrix(acts, tiny["model"], out, include_output=True)
    assert both.entries == ("blk.0.ffn_up.weight", "output.weight") and both.left_out == ()


def test_sample_writes_an_imatrix_of_every_layer_weight(tmp_path):
    import importlib.util

    path = Path(__file__).parents[2] / "samples" / "imatrix_example.py"
    spec = importlib.util.spec_from_file_location("imatrix_example", path)
    assert spec is not None and spec.loader is not None
    sample = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sample)
    sample.main(tmp_path)
    imx = read_imatrix(tmp_path / "model.imatrix")
    assert len(imx.sums) == 2 * 7 and {int(c[0]) for c in imx.counts.values()} == {155}
    assert imx.chunk_size == 64 and imx.chunk_count == 2


def test_reads_stay_under_the_memory_bound(tmp_path):
    import tracemalloc

    rng = np.random.default_rng(4)
    arr = zarr.open_group(str(tmp_path / "big.zarr"), mode="w").create_array(
        "x", shape=(4096, 1024), dtype="f4", chunks=(64, 1024)
    )
    for i in range(0, 4096, 512):
        arr[i : i + 512] = rng.standard_normal((512, 1024), dtype=np.float32)
    square_sums(arr[:4], 1 << 20)  # (compiled first: the compiler's own memory is not counted)
    bound = 2 << 20  # the array is 16 MiB
    tracemalloc.start()
    try:
        sums, _ = square_sums(arr, bound)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= bound
    x = arr[:].astype(np.float64)
    np.testing.assert_allclose(sums, np.sum(x * x, axis=0), rtol=4096 * 2.0**-53)
    with pytest.raises(InvalidParameterError, match="over a quarter of the memory bound"):
        square_sums(arr, 512 << 10)


def test_a_weighted_file_reports_what_the_imatrix_bought(tiny, tmp_path):
    """``convert --imatrix`` reports, per tensor, the SQNR and the importance-weighted SQNR
    with the imatrix and for the same tensor quantized without it (recomputed here from
    qstream.compat.gguf's unweighted quantization and the file's weights)."""
    from safetensors.numpy import load_file
    from typer.testing import CliRunner

    from cli.main import app
    from qstream.compat.gguf import dequantize, quantize

    imx = tmp_path / "m.imatrix"
    compute_imatrix(tiny["acts_path"], tiny["model"], imx)
    out = tmp_path / "m.gguf"
    r = CliRunner().invoke(
        app,
        [
            "convert",
            str(tiny["model"]),
            str(out),
            "--gguf-type",
            "Q4_K_M",
            "--imatrix",
            str(imx),
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    errors = json.loads(r.output)["error"]
    weights = importance_weights(read_imatrix(imx))
    source = load_file(str(tiny["model"] / "model.safetensors"))
    name, gguf_name = "model.layers.1.mlp.down_proj.weight", "blk.1.ffn_down.weight"
    e = errors[name]
    x = source[name].astype(np.float32)
    kind = json.loads(r.output)["tensors"][name]
    plain = dequantize(quantize(x, kind), kind, x.shape).astype(np.float64)
    w = weights[gguf_name].astype(np.float64)
    xd = x.astype(np.float64)
    assert e["without_imatrix"]["sqnr_db"] == pytest.approx(
        10 * np.log10(float((xd * xd).sum()) / float(((xd - plain) ** 2).sum())), rel=1e-12
    )
    assert e["without_imatrix"]["weighted_sqnr_db"] == pytest.approx(
        10 * np.log10(float((w * xd * xd).sum()) / float((w * (xd - plain) ** 2).sum())), rel=1e-12
    )
    weighted = [v for v in errors.values() if "without_imatrix" in v]
    # (every layer weight; the embedding and lm_head have no imatrix entry, as llama.cpp's)
    assert len(weighted) == len([n for n in errors if ".layers." in n])
    better = [v["weighted_sqnr_db"] > v["without_imatrix"]["weighted_sqnr_db"] for v in weighted]
    assert sum(better) >= 0.8 * len(better)  # (what llama.cpp's weighted search raises)
    r = CliRunner().invoke(
        app,
        [
            "convert",
            str(tiny["model"]),
            str(tmp_path / "t.gguf"),
            "--gguf-type",
            "Q4_K_M",
            "--imatrix",
            str(imx),
        ],
    )
    assert r.exit_code == 0 and "wSQNR w/o imx" in r.output, r.output


def test_square_sums_are_the_running_float64_sum_in_token_order(monkeypatch):
    """Each column's sum is ``acc += float64(x[i]) ** 2`` row after row, exactly (an oracle
    adding one row at a time), whatever the rows squared at once."""
    from qstream.exports.gguf import importance

    rng = np.random.default_rng(5)
    x = rng.standard_normal((777, 33)) * rng.choice([1e-20, 1.0, 1e15], (777, 33))
    x = x.astype(np.float32)
    want = np.zeros(33)
    for row in x:
        want += row.astype(np.float64) * row.astype(np.float64)
    for step_values in (33, 33 * 5 + 1, 1 << 19):
        monkeypatch.setattr(importance, "SQUARE_VALUES", step_values)
        sums, count = importance.square_sums(x, max_memory=1 << 20)
        assert count == 777 and sums.tobytes() == want.tobytes()
