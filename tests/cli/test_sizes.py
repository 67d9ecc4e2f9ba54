"""One definition of sizes: a tensor's "after" is every byte the output holds for it,
uncompressed: its codes and its parameters (scales; zero points unless all 0).
``convert --dry-run``, ``convert``'s table and ``--json``, ``inspect`` and the export of the
output give the same number per tensor and in total, and it is what the output's files hold
(the values, and each parameter array that has chunks on disk, at its stored type's size)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file
from typer.testing import CliRunner

import qstream as qs
from cli.main import app
from cli.output import fmt_bytes

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "samples" / "tiny-transformer.safetensors"
RECIPE = ROOT / "samples" / "recipe-int8.toml"
runner = CliRunner()
SUB_BYTE = {"int4": 4, "uint4": 4, "int2": 2, "uint2": 2, "float4_e2m1fn": 4}


def run_json(*args) -> dict:
    r = runner.invoke(app, [str(a) for a in args])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def held(node: Path) -> int:
    """What an output's node holds: its values (a kept tensor: the plain array; else the
    codes, ``data``) and each parameter array with a chunk on disk (none: all zeros, which
    zarr does not store), at their stored type's size."""
    members = [node] if _is_array(node) else sorted(node.iterdir())
    total = 0
    for m in members:
        if not _is_array(m) or m.name.startswith("_"):
            continue
        doc = json.loads((m / "zarr.json").read_text())
        values = m == node or m.name == "data"
        if not values and not [c for c in m.iterdir() if c.name != "zarr.json"]:
            continue
        n = math.prod(doc["shape"])
        kind = doc["data_type"]
        bits = SUB_BYTE.get(kind) or np.dtype(kind).itemsize * 8
        total += -(-n * bits // 8)
    return total


def _is_array(p: Path) -> bool:
    doc = p / "zarr.json"
    return doc.is_file() and json.loads(doc.read_text()).get("node_type") == "array"


def sizes(checkpoint: Path, dst: Path, *extra) -> dict[str, dict[str, int]]:
    """Each tensor's "after" as dry run, convert --json, inspect --json give it, and what the
    output holds for it (packs: their share), with ``total`` of each."""
    plan = run_json("convert", checkpoint, dst, *extra, "--dry-run", "--json")["plan"]
    report = run_json("convert", checkpoint, dst, *extra, "--json")
    shown = run_json("inspect", dst, "--json")["tensors"]
    out: dict[str, dict[str, int]] = {}
    for row in plan:
        name = row["name"]
        r = shown[name]
        if r.get("pack"):
            pack = dst / "_packs" / r["pack"]
            members = sum(1 for t in shown.values() if t.get("pack") == r["pack"])
            on_disk = held(pack) / members
        else:
            on_disk = held(dst / r["key"])
        out[name] = {
            "dry_run": row["bytes_after"],
            "convert": report["tensors"][name]["bytes_after"],
            "inspect": r["bytes_after"],
            "held": on_disk,
        }
    out["total"] = {k: sum(v[k] for v in out.values()) for k in next(iter(out.values()))}
    assert report["bytes_after"] == out["total"]["convert"]
    return out


def test_the_sample_has_one_after_per_tensor_everywhere_and_it_is_what_the_output_holds(
    tmp_path,
):
    dst = tmp_path / "out.zarr"
    got = sizes(SAMPLE, dst, "--recipe", RECIPE)
    for name, s in got.items():
        assert len(set(s.values())) == 1, (name, s)
    # a per-channel int8 tensor: its codes and a float32 scale per row (symmetric: the zero
    # points are all 0, and not stored)
    up = got["layers.0.mlp.up_proj.weight"]["convert"]
    assert up == 512 * 128 + 512 * 4
    # the export holds the same for each tensor: codes and scales, as entries of their own
    listed = run_json("export", dst, tmp_path / "model.safetensors", "--json")
    assert listed["files"]
    entries = {
        e["name"]: e["bytes"]
        for e in run_json("inspect", tmp_path / "model.safetensors", "--json")["tensor_list"]
    }
    for name, s in got.items():
        if name != "total":
            parts = [entries[name], entries.get(f"{name}_scale", 0)]
            parts.append(entries.get(f"{name}_zero_point", 0))
            assert sum(parts) == s["convert"], name
    # the table and the line under it say the same as --json
    table = runner.invoke(app, ["convert", str(SAMPLE), str(tmp_path / "t.zarr"), "--recipe",
                                str(RECIPE)])  # fmt: skip
    assert table.exit_code == 0, table.output
    assert f"-> {fmt_bytes(got['total']['convert'])} in" in table.output
    dry = runner.invoke(app, ["convert", str(SAMPLE), str(tmp_path / "d.zarr"), "--recipe",
                              str(RECIPE), "--dry-run"])  # fmt: skip
    line = next(ln for ln in dry.output.splitlines() if ln.startswith("layers.0.mlp.up_proj"))
    assert re.search(rf"\s{re.escape(fmt_bytes(up))}\s*$", line), line


RECIPE_KINDS = """
[defaults]
dtype = "int8"

[[rules]]
pattern = "u8.*"
spec = { dtype = "uint8", axis = 0 }

[[rules]]
pattern = "asym.*"
spec = { symmetric = false, axis = 0 }

[[rules]]
pattern = "int4.*"
spec = { dtype = "int4", axis = 1, block_size = 32 }

[[rules]]
pattern = "half.*"
spec = { scale_dtype = "float16", axis = 0 }

[[rules]]
pattern = "fp8.*"
spec = { dtype = "float8_e4m3fn", axis = 0 }
"""


def _kinds(path: Path, copies: int) -> Path:
    rng = np.random.default_rng(2)
    tensors = {}
    for kind in ("u8", "asym", "int4", "half", "fp8"):
        for i in range(copies):
            x = rng.standard_normal((24, 72)) * (1 + i % 3) + (0.5 if kind == "asym" else 0)
            tensors[f"{kind}.{i}.weight"] = x.astype(np.float32)
    tensors["norm.weight"] = rng.standard_normal(72).astype(np.float32)  # (kept)
    save_file(tensors, str(path))
    return path


@pytest.mark.parametrize("packs", ["--no-packs", "--packs"])
def test_every_kind_of_parameters_is_counted_as_the_output_holds_it(tmp_path, packs):
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(RECIPE_KINDS)
    copies = 3 if packs == "--packs" else 1
    got = sizes(_kinds(tmp_path / "k.safetensors", copies), tmp_path / "out.zarr",
                "--recipe", recipe, packs)  # fmt: skip
    for name, s in got.items():
        assert len(set(s.values())) == 1, (name, s)
    n = 24 * 72
    want = {  # codes + per parameter: scale (+ zero point)
        "u8.0.weight": n + 24 * (4 + 1),  # (symmetric uint8: zero points mid-range)
        "asym.0.weight": n + 24 * (4 + 1),
        "int4.0.weight": n // 2 + 24 * 3 * 4,
        "half.0.weight": n + 24 * 2,
        "fp8.0.weight": n + 24 * 4,
        "norm.weight": 72 * 4,
    }
    assert {k: got[k]["convert"] for k in want} == want
    if packs == "--packs":
        shown = run_json("inspect", tmp_path / "out.zarr", "--json")["tensors"]
        assert any(t.get("pack") for t in shown.values())


RECIPE_EXPORTABLE = """
[defaults]
dtype = "int8"
axis = 0

[[rules]]
pattern = "asym.*"
spec = { dtype = "uint8", symmetric = false, axis = 0 }

[[rules]]
pattern = "int4.*"
spec = { dtype = "int4", axis = -1, block_size = 32 }

[[rules]]
pattern = "uint4.*"
spec = { dtype = "uint4", symmetric = false, axis = -1, block_size = 32 }

"""


@pytest.mark.parametrize("fmt", ["compressed-tensors", "qstream"])
def test_a_safetensors_destination_counts_the_files_entries_in_the_plan_the_run_and_inspect(
    tmp_path, fmt
):
    rng = np.random.default_rng(3)
    tensors = {
        f"{kind}.weight": (rng.standard_normal((24, 96)) + (0.5 if "asym" in kind else 0)).astype(
            np.float32
        )
        for kind in ("plain", "asym", "int4", "uint4")
    }
    tensors["model.embed_tokens.weight"] = rng.standard_normal((40, 64)).astype(np.float32)
    tensors["norm.weight"] = rng.standard_normal(96).astype(np.float32)
    save_file(tensors, str(tmp_path / "m.safetensors"))
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(RECIPE_EXPORTABLE)
    dst = tmp_path / "out" / "model.safetensors"
    args = ("convert", tmp_path / "m.safetensors", dst, "--recipe", recipe, "--format", fmt)
    plan = {r["name"]: r["bytes_after"] for r in run_json(*args, "--dry-run", "--json")["plan"]}
    report = run_json(*args, "--json")
    ran = {n: r["bytes_after"] for n, r in report["tensors"].items()}
    header = dst.read_bytes()
    n = int.from_bytes(header[:8], "little")
    entries = {k: v for k, v in json.loads(header[8 : 8 + n]).items() if k != "__metadata__"}
    held = sum(v["data_offsets"][1] - v["data_offsets"][0] for v in entries.values())
    inspected = run_json("inspect", dst, "--json")
    assert plan == ran  # (each tensor, the untied lm_head of a compressed-tensors export too)
    assert ("lm_head.weight" in plan) == (fmt == "compressed-tensors")
    assert sum(plan.values()) == report["bytes_after"] == inspected["bytes"] == held
    assert dst.stat().st_size == held + 8 + n  # (entries and header: no byte counted twice)
    assert report["file_bytes"] == sum(Path(f).stat().st_size for f in report["files"])
    for name, after in ran.items():  # (each tensor: its own entries, parameters included)
        if name != "lm_head.weight" or fmt != "compressed-tensors":
            own = [k for k in entries if k == name or k.startswith(name.removesuffix("weight"))]
            spans = [entries[k]["data_offsets"] for k in own]
            assert after == sum(b - a for a, b in spans), (name, own)
    if fmt == "compressed-tensors":  # (4-bit codes in int32 words a row, and their shape)
        assert {"int4.weight_packed", "int4.weight_shape", "uint4.weight_zero_point"} <= set(
            entries
        )


def test_a_gguf_destination_counts_its_tensors_bytes_not_the_files_size(tmp_path):
    recipe = tmp_path / "q8.toml"
    recipe.write_text(
        '[defaults]\ndtype = "int8"\nblock_size = 32\naxis = -1\nmethod = "dynamic"\n'
        'scale_dtype = "float16"\n'
    )
    dst = tmp_path / "m.gguf"
    plan = run_json("convert", SAMPLE, dst, "--recipe", recipe, "--dry-run", "--json")["plan"]
    report = run_json("convert", SAMPLE, dst, "--recipe", recipe, "--json")
    gguf = pytest.importorskip("gguf")
    held = sum(int(t.n_bytes) for t in gguf.GGUFReader(str(dst)).tensors)
    assert sum(r["bytes_after"] for r in plan) == report["bytes"] == held
    assert report["file_bytes"] == dst.stat().st_size > held
    run_json("convert", SAMPLE, tmp_path / "q8.zarr", "--recipe", recipe, "--json")
    exported = run_json("export", tmp_path / "q8.zarr", tmp_path / "x.gguf", "--json")
    assert (
        exported["bytes"] == held and exported["file_bytes"] == (tmp_path / "x.gguf").stat().st_size
    )


@pytest.mark.parametrize("out", ["e/model.safetensors", "e/model.gguf"])
def test_export_dry_run_plans_the_bytes_the_export_writes_and_writes_nothing(tmp_path, out):
    recipe = tmp_path / "q8.toml"
    recipe.write_text(
        '[defaults]\ndtype = "int8"\nblock_size = 32\naxis = -1\nmethod = "dynamic"\n'
        'scale_dtype = "float16"\n'
    )
    run_json("convert", SAMPLE, tmp_path / "q8.zarr", "--recipe", recipe, "--json")
    planned = run_json("export", tmp_path / "q8.zarr", tmp_path / out, "--dry-run", "--json")
    assert planned["dry_run"] is True and not (tmp_path / "e").exists()
    table = runner.invoke(app, ["export", str(tmp_path / "q8.zarr"), str(tmp_path / out),
                                "--dry-run"])  # fmt: skip
    assert table.exit_code == 0 and "export plan (nothing written)" in table.output
    done = run_json("export", tmp_path / "q8.zarr", tmp_path / out, "--json")
    assert planned["bytes"] == done["bytes"] and planned["tensors"] == done["tensors"]
    r = runner.invoke(app, ["export", str(tmp_path / "q8.zarr"), str(tmp_path / "x" / "m.bin")])
    assert r.exit_code == 2 and not (tmp_path / "x").exists()  # (refused by the plan)


def test_a_gguf_llama_cpp_cannot_load_says_so(tmp_path):
    recipe = tmp_path / "q8.toml"
    recipe.write_text(
        '[defaults]\ndtype = "int8"\nblock_size = 32\naxis = -1\nmethod = "dynamic"\n'
        'scale_dtype = "float16"\n'
    )
    run_json("convert", SAMPLE, tmp_path / "q8.zarr", "--recipe", recipe, "--json")
    r = runner.invoke(app, ["export", str(tmp_path / "q8.zarr"), str(tmp_path / "x.gguf")])
    assert r.exit_code == 0, r.output
    assert "architecture qstream, for gguf-py" in r.stdout  # (no model config beside it)
    assert "note: no model config.json was found" in r.stdout and "llama.cpp does not" in r.stdout


def test_an_export_refused_by_its_plan_exits_2_and_one_failing_while_it_writes_exits_1(tmp_path):
    out = tmp_path / "q.zarr"
    run_json("convert", SAMPLE, out, "--json", "--no-packs")
    (tmp_path / "taken").write_text("a file")
    with pytest.raises(qs.StoreError) as refused:  # (an unwritable place: refused, unwritten)
        qs.export_safetensors(out, tmp_path / "taken" / "x" / "m.safetensors")
    assert getattr(refused.value, "refused", False)
    chunk = next(p for p in (out / "layers.3.mlp.down_proj.weight" / "data").rglob("*")
                 if p.is_file() and p.name != "zarr.json")  # fmt: skip
    chunk.write_bytes(chunk.read_bytes()[:7])  # (a truncated chunk: found while writing)
    r = runner.invoke(app, ["export", str(out), str(tmp_path / "e" / "m.safetensors")])
    assert r.exit_code == 1 and "corrupt chunk" in r.output, r.output
    assert not (tmp_path / "e" / "m.safetensors").exists()
