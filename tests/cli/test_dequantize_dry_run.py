"""``qstream dequantize --dry-run`` (``qs.plan_dequantize``): for every kind of source it
decides what the run does with DST and refuses what the run refuses, with the same message
and exit code, and writes nothing."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from typer.testing import CliRunner

import qstream as qs
from cli.main import app
from tests.support.llama_folder import write_llama


def cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("deq_plan")
    model = write_llama(str(root / "model"), hidden=64, intermediate=128)
    assert cli("convert", model, root / "ck.zarr", "-q").exit_code == 0
    x = np.random.default_rng(0).standard_normal((64, 96)).astype(np.float32)
    qs.quantize_store(x, root / "one.zarr", qs.QuantSpec(axis=0))
    r = cli("convert", model, root / "m.gguf", "--gguf-type", "Q8_0", "-q")
    assert r.exit_code == 0, r.output
    return {"checkpoint": root / "ck.zarr", "array": root / "one.zarr", "model": model,
            "gguf": root / "m.gguf"}  # fmt: skip


CASES = [
    ("checkpoint", "out.zarr"),
    ("checkpoint", "out/model.safetensors"),
    ("array", "out.zarr"),
    ("model", "out/model.safetensors"),
    ("gguf", "out/model.safetensors"),
]


@pytest.mark.parametrize(("kind", "dst"), CASES)
def test_the_dry_run_plans_the_run_and_writes_nothing(sources, tmp_path, kind, dst):
    out = tmp_path / "new" / dst
    r = cli("dequantize", sources[kind], out, "--dry-run", "--json")
    assert r.exit_code == 0, r.output
    plan = json.loads(r.output)
    assert plan["action"] == "create" and plan["plan"]
    assert not (tmp_path / "new").exists()  # (not even the folders it would make)
    assert str(tmp_path / "new") in plan["creates"][0]
    r = cli("dequantize", sources[kind], out, "--json")
    assert r.exit_code == 0, r.output
    report = json.loads(r.output)
    names = {row["name"] for row in plan["plan"]}
    if "tensors" in report and isinstance(report["tensors"], dict):
        assert names == set(report["tensors"])  # (the tensors the run wrote)
    r = cli("dequantize", sources[kind], out, "--dry-run", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["action"] == "complete"


@pytest.mark.parametrize(("kind", "dst"), CASES)
def test_a_foreign_destination_is_refused_alike_by_the_dry_run_and_the_run(
    sources, tmp_path, kind, dst
):
    out = tmp_path / dst
    target = out if kind in ("checkpoint", "array") and dst.endswith(".zarr") else out.parent
    target.mkdir(parents=True, exist_ok=True)
    # a file qstream did not write where the run writes (the folder, or the config beside it)
    if dst.endswith(".zarr"):
        (out / "notes.txt").write_text("mine")
    else:
        (out.parent / "config.json").write_text('{"mine": true}')
        (out.parent / "model.safetensors").write_text("mine")
    before = sorted(os.listdir(target))
    dry = cli("dequantize", sources[kind], out, "--dry-run")
    run = cli("dequantize", sources[kind], out)
    # (exit 2: every refusal of the plan, as convert's)
    assert dry.exit_code == run.exit_code == 2, (
        dry.output,
        run.output,
    )
    assert dry.output.strip().splitlines()[-1] == run.output.strip().splitlines()[-1]
    assert sorted(os.listdir(target)) == before


def test_a_bad_dtype_is_refused_before_the_plan(sources, tmp_path):
    r = cli("dequantize", sources["array"], tmp_path / "x.zarr", "--dtype", "int8", "--dry-run")
    assert r.exit_code == 2 and "--dtype" in r.output
