"""``qstream inspect`` of exports lists their tensors as the formats' own readers see them:
qstream's safetensors (single and sharded) against safetensors' ``safe_open``, qstream's GGUF
and a GGUF gguf-py's ``GGUFWriter`` wrote against gguf-py's ``GGUFReader``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from cli.main import app

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter  # noqa: E402
from gguf import quants as gguf_quants  # noqa: E402
from safetensors import safe_open  # noqa: E402

SAMPLE = Path(__file__).resolve().parents[2] / "samples" / "tiny-transformer.safetensors"
runner = CliRunner()


def run(*args: object) -> Any:
    return runner.invoke(app, [str(a) for a in args])


def inspected(path: Path) -> dict[str, Any]:
    """``qstream inspect PATH --json``, parsed."""
    r = run("inspect", path, "--json")
    assert r.exit_code == 0, r.output
    doc: dict[str, Any] = json.loads(r.stdout)
    return doc


def safe_open_entries(files: list[Path]) -> dict[str, tuple[str, list[int]]]:
    """name -> (dtype, shape) as safetensors' own reader reports them."""
    out = {}
    for f in files:
        with safe_open(str(f), "np") as st:
            for k in st.keys():  # noqa: SIM118 (safe_open has no __iter__)
                s = st.get_slice(k)
                out[k] = (s.get_dtype(), list(s.get_shape()))
    return out


def reader_entries(path: Path) -> list[tuple[str, str, list[int], int]]:
    """(name, type, shape slowest first, bytes) as gguf-py's reader reports them."""
    return [
        (t.name, t.tensor_type.name, [int(d) for d in reversed(t.shape)], int(t.n_bytes))
        for t in GGUFReader(str(path)).tensors
    ]


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The bundled sample converted to one safetensors, a sharded one and a GGUF."""
    d = tmp_path_factory.mktemp("exports")
    out = {
        "single": d / "one" / "model.safetensors",
        "sharded": d / "shards" / "model.safetensors",
        "gguf": d / "x.gguf",
    }
    for args in (
        [out["single"]],
        [out["sharded"], "--max-shard-size", "300KB"],
        [out["gguf"]],
    ):
        r = run("convert", SAMPLE, *args)
        assert r.exit_code == 0, r.output
    return out


def test_safetensors_export_lists_every_entry_as_safe_open_reads_it(exports):
    doc = inspected(exports["single"])
    got = {t["name"]: (t["dtype"], t["shape"]) for t in doc["tensor_list"]}
    assert got == safe_open_entries([exports["single"]])
    assert doc["entries"] == len(got)
    # tensors as convert and export count them: a quantized one's codes and parameters
    assert doc["tensors"] == len(doc["tensor_bytes"]) == len(got) - len(doc["quantized"])
    assert sum(doc["tensor_bytes"].values()) == doc["bytes"]
    for name in doc["quantized"]:
        assert doc["tensor_bytes"][name] == sum(
            t["bytes"] for t in doc["tensor_list"] if t["name"] in (name, f"{name}_scale")
        )
    quantized = {t["name"]: t["target"] for t in doc["tensor_list"] if t["target"]}
    assert quantized and all(v == "int8 axis 0" for v in quantized.values())
    assert all(got[n][0] == "I8" for n in quantized)  # (the codes are the quantized entries)
    assert sum(t["bytes"] for t in doc["tensor_list"]) == doc["bytes"]


def test_sharded_export_lists_the_entries_of_every_shard(exports):
    index = exports["sharded"].parent / "model.safetensors.index.json"
    shards = sorted(index.parent.glob("model-*-of-*.safetensors"))
    assert len(shards) > 1, "the sample must be split for this test"
    doc = inspected(index)
    got = {t["name"]: (t["dtype"], t["shape"]) for t in doc["tensor_list"]}
    assert len(got) == len(doc["tensor_list"])  # (each entry once)
    assert got == safe_open_entries(shards)
    assert {t["target"] for t in doc["tensor_list"]} == {"int8 axis 0", None}
    assert sum(t["bytes"] for t in doc["tensor_list"]) == doc["bytes"]


def test_qstream_gguf_lists_tensors_as_gguf_py_reads_them(exports):
    doc = inspected(exports["gguf"])
    got = [(t["name"], t["type"], t["shape"], t["bytes"]) for t in doc["tensor_list"]]
    assert got == reader_entries(exports["gguf"])
    assert doc["written_by"] == "qstream" and doc["source"] == str(SAMPLE)


def _foreign_gguf(path: Path) -> None:
    """A small llama GGUF written by gguf-py (another tool): tokenizer, model keys, an F32
    norm, Q8_0 matrices and a 3-D expert tensor."""
    w = GGUFWriter(str(path), "llama")
    w.add_context_length(4096)
    w.add_block_count(1)
    w.add_embedding_length(64)
    w.add_head_count(4)
    w.add_expert_count(4)
    w.add_expert_used_count(2)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(100)])
    rng = np.random.default_rng(0)
    w.add_tensor("output_norm.weight", rng.standard_normal(64).astype(np.float32))
    for name, shape in (("token_embd.weight", (100, 64)), ("blk.0.attn_q.weight", (64, 64)),
                        ("blk.0.ffn_up_exps.weight", (4, 96, 64))):  # fmt: skip
        x = rng.standard_normal(shape).astype(np.float32)
        q8 = gguf_quants.quantize(x, GGMLQuantizationType.Q8_0)
        w.add_tensor(name, q8, raw_dtype=GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_another_tools_gguf_lists_tensors_and_its_model_summary(tmp_path):
    path = tmp_path / "other.gguf"
    _foreign_gguf(path)
    doc = inspected(path)
    got = [(t["name"], t["type"], t["shape"], t["bytes"]) for t in doc["tensor_list"]]
    assert got == reader_entries(path)
    assert ("blk.0.ffn_up_exps.weight", "Q8_0", [4, 96, 64]) in [g[:3] for g in got]
    summary = {k: doc[k] for k in ("architecture", "tokenizer", "vocab_size", "context_length",
                                   "block_count", "expert_count", "written_by")}  # fmt: skip
    assert summary == {"architecture": "llama", "tokenizer": "gpt2", "vocab_size": 100,
                       "context_length": 4096, "block_count": 1, "expert_count": 4,
                       "written_by": "another tool"}  # fmt: skip


def test_inspect_prints_the_summary_then_one_row_per_tensor(tmp_path):
    path = tmp_path / "other.gguf"
    _foreign_gguf(path)
    r = run("inspect", path)
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert any(line.split() == ["context_length", "4096"] for line in lines)
    assert any(line.split() == ["tokenizer", "gpt2"] for line in lines)
    for name, kind, shape, _ in reader_entries(path):
        row = [line for line in lines if line.split()[:1] == [name]]
        assert len(row) == 1 and kind in row[0] and str(shape) in row[0], r.stdout


@pytest.mark.parametrize("kind", ["single", "gguf"])
def test_plot_of_an_export_writes_a_bar_chart(exports, tmp_path, kind):
    pytest.importorskip("matplotlib")
    png = tmp_path / f"{kind}.png"
    r = run("inspect", exports[kind], "--plot", png)
    assert r.exit_code == 0, r.output
    assert f"figure written to {png}" in r.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    # the title counts tensors as inspect's table does (a quantized one's entries: one tensor)
    svg = tmp_path / f"{kind}.svg"
    assert run("inspect", exports[kind], "--plot", svg).exit_code == 0
    title = next(t for t in svg.read_text().split("<!-- ")[1:] if "bytes per stored type" in t)
    lines = run("inspect", exports[kind]).stdout.splitlines()
    rows = [line for line in lines if " tensors" in line]
    assert f"({rows[0].split(' tensors')[0].split()[-1]} tensors" in title, (title[:120], rows)


def test_a_safetensors_export_records_the_sqnr_its_conversion_measured(tmp_path):
    import qstream as qs

    measured = tmp_path / "m.zarr"
    assert run("convert", SAMPLE, measured, "-q").exit_code == 0
    one, shards = tmp_path / "one" / "model.safetensors", tmp_path / "s" / "model.safetensors"
    assert run("export", measured, one, "-q").exit_code == 0
    assert run("export", measured, shards, "--max-shard-size", "300KB", "-q").exit_code == 0
    rows = qs.open_quantized(measured).tensors
    want = {n: round(r["error"]["sqnr_db"], 2) for n, r in rows.items() if not r["kept"]}
    for path in (one, shards.parent / "model.safetensors.index.json"):
        doc = inspected(path)
        said = {n: q["sqnr_db"] for n, q in doc["quantized"].items()}
        assert said == {**want, "lm_head.weight": want["embed_tokens.weight"]}  # (untied)
        assert doc["summary"]["worst_sqnr_db"] == min(said.values())
        opened = qs.open_quantized(path).tensors
        assert {n: opened[n]["error"]["sqnr_db"] for n in said} == said
        assert all(opened[n]["error"] is None for n in opened if n not in said)


def test_a_gguf_export_records_the_sqnr_it_measured_for_inspect_and_the_reader(tmp_path):
    """A GGUF file qstream wrote carries each quantized tensor's SQNR (measured as it was
    written, in the header after, to 0.01 dB): from a float source (measured by the export)
    and from a converted output (its conversion's figures, copied with its codes)."""
    import qstream as qs

    measured = tmp_path / "m.zarr"
    recipe = tmp_path / "q8.toml"
    recipe.write_text('[defaults]\ndtype = "int8"\nblock_size = 32\naxis = -1\n'
                      'method = "dynamic"\nscale_dtype = "float16"\n')  # fmt: skip
    assert run("convert", SAMPLE, measured, "--recipe", recipe, "-q").exit_code == 0
    rows = qs.open_quantized(measured).tensors
    from_zarr = {n: round(r["error"]["sqnr_db"], 2) for n, r in rows.items() if not r["kept"]}
    for src, name in ((SAMPLE, "direct.gguf"), (measured, "copied.gguf")):
        out = tmp_path / name
        r = run("export", src, out, "--json")
        assert r.exit_code == 0, r.output
        report = json.loads(r.stdout)
        want = {n: round(e["sqnr_db"], 2) for n, e in report["error"].items()}
        assert want and set(want) == set(from_zarr)
        if src == measured:  # (the conversion's own figures)
            assert want == from_zarr
        doc = inspected(out)
        said = {t["name"]: t["sqnr_db"] for t in doc["tensor_list"] if "sqnr_db" in t}
        assert said == want
        assert doc["summary"]["worst_sqnr_db"] == min(said.values())
        opened = qs.open_quantized(out).tensors
        assert {n: opened[n]["error"]["sqnr_db"] for n in said} == said
        assert all(opened[n]["error"] is None for n in opened if n not in said)
        table = run("inspect", out).stdout
        assert "SQNR dB" in table and f"{min(said.values()):.2f}" in table


def test_an_export_groups_only_a_tensors_own_parameters_with_it(tmp_path):
    from safetensors.numpy import save_file

    rng = np.random.default_rng(2)
    save_file({"rnn.weight_ih_l0": rng.standard_normal((64, 32)).astype(np.float32),
               "rnn.weight_ih_l0_reverse": rng.standard_normal((64, 32)).astype(np.float32),
               "rnn.bias_ih_l0": rng.standard_normal(64).astype(np.float32)},
              str(tmp_path / "rnn.safetensors"))  # fmt: skip
    out = tmp_path / "rnn-q.safetensors"
    r = run("convert", tmp_path / "rnn.safetensors", out, "--format", "qstream",
            "--exclude", "*reverse", "-q")  # fmt: skip
    assert r.exit_code == 0, r.output
    doc = inspected(out)
    entries = {t["name"]: t["bytes"] for t in doc["tensor_list"]}
    assert doc["tensors"] == 3
    want = {
        "rnn.bias_ih_l0": entries["rnn.bias_ih_l0"],
        "rnn.weight_ih_l0": entries["rnn.weight_ih_l0"] + entries["rnn.weight_ih_l0_scale"],
        "rnn.weight_ih_l0_reverse": 64 * 32 * 4,  # (kept: not a parameter of weight_ih_l0)
    }
    assert doc["tensor_bytes"] == want, doc["tensor_bytes"]


def test_a_packed_int4_export_says_each_tensors_target_and_sqnr(tmp_path):
    from safetensors.numpy import save_file

    rng = np.random.default_rng(3)
    names = ("model.layers.0.attn.weight", "model.layers.0.mlp.weight")
    save_file({n: rng.standard_normal((64, 64)).astype(np.float32) for n in names},
              str(tmp_path / "m.safetensors"))  # fmt: skip
    out = tmp_path / "e4" / "model.safetensors"
    r = run("convert", tmp_path / "m.safetensors", out, "--dtype", "int4", "--block-size", "32")
    assert r.exit_code == 0, r.output
    doc = inspected(out)
    firsts = {}
    for t in doc["tensor_list"]:
        firsts.setdefault(t["tensor"], t)
    for n in names:  # (its first entry: the packed codes, saying what the tensor is)
        assert firsts[n]["target"] == "int4 block 32" and firsts[n]["sqnr_db"] > 10
    shown = run("inspect", out)
    assert all(any(n in ln and "int4 block 32" in ln for ln in shown.stdout.splitlines())
               for n in names), shown.stdout  # fmt: skip


def test_dequantize_dry_run_of_a_gguf_shows_each_tensors_stored_type_and_bytes(tmp_path):
    path = tmp_path / "other.gguf"
    w = GGUFWriter(str(path), "foo")
    rng = np.random.default_rng(4)
    x = rng.standard_normal((8, 64)).astype(np.float32)
    w.add_tensor("blk.0.attn_q.weight", gguf_quants.quantize(x, GGMLQuantizationType.Q8_0),
                 raw_dtype=GGMLQuantizationType.Q8_0)  # fmt: skip
    w.add_tensor("token_embd.weight", x.astype(np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    r = run("dequantize", path, tmp_path / "d.zarr", "--dry-run", "--json")
    assert r.exit_code == 0, r.output
    rows = {p["name"]: p for p in json.loads(r.stdout)["plan"]}
    q, f16 = rows["blk.0.attn_q.weight"], rows["token_embd.weight"]
    assert (q["dtype"], q["target"], q["bytes_before"]) == ("Q8_0", "decode/float32", 8 * 68)
    assert (f16["dtype"], f16["target"], f16["bytes_before"]) == ("F16", "keep/float32", 8 * 128)
