"""``qstream quantize --dry-run`` (``qs.plan_quantize``): it decides what the run does with
DST, sizes the output as every size of qstream is defined (codes and parameters), refuses
what the run refuses with the same message and exit code, reads no value and writes
nothing."""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import pytest
import zarr
from typer.testing import CliRunner

import qstream as qs
from cli.main import app


def cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def tree(root) -> dict[str, str]:
    """Every file under ``root`` and a hash of its bytes."""
    out = {}
    for folder, _, files in os.walk(root):
        for f in files:
            path = os.path.join(folder, f)
            with open(path, "rb") as fh:
                out[os.path.relpath(path, root)] = hashlib.sha256(fh.read()).hexdigest()
    return out


@pytest.fixture
def src(tmp_path):
    z = zarr.create_array(tmp_path / "src.zarr", shape=(300, 200), chunks=(100, 200),
                          dtype="float32")  # fmt: skip
    z[:] = np.random.default_rng(0).standard_normal((300, 200)).astype(np.float32)
    return tmp_path / "src.zarr"


@pytest.mark.parametrize(
    "args, after",
    [
        (["--axis", "0"], 300 * 200 + 300 * 4),  # int8 codes, a float32 scale a row
        (["--dtype", "int4", "--axis", "0", "--block-size", "32"], 300 * 200 // 2 + 10 * 200 * 4),
        (["--dtype", "uint8", "--asymmetric"], 300 * 200 + 4 + 1),  # one scale, one zero point
    ],
)
def test_the_dry_run_plans_the_run_and_writes_nothing(src, tmp_path, args, after):
    dst = tmp_path / "new" / "q.zarr"
    before = tree(tmp_path)
    r = cli("quantize", src, dst, *args, "--dry-run", "--json")
    assert r.exit_code == 0, r.output
    plan = json.loads(r.output)
    assert plan["action"] == "create" and plan["creates"] == [str(tmp_path / "new")]
    (row,) = plan["plan"]
    assert row["shape"] == [300, 200] and row["dtype"] == "float32"
    assert row["bytes_before"] == 300 * 200 * 4 and row["bytes_after"] == after
    assert tree(tmp_path) == before and not (tmp_path / "new").exists()
    text = cli("quantize", src, dst, *args, "--dry-run")
    assert text.exit_code == 0 and "quantization plan (nothing written)" in text.output
    assert "create; creates" in text.output
    # the run then does what the plan said, under the target the plan named
    assert cli("quantize", src, dst, *args, "-q").exit_code == 0
    stored = qs.open_quantized(dst).spec
    assert row["target"].startswith(f"{stored.dtype}/")
    done = json.loads(cli("quantize", src, dst, *args, "--dry-run", "--json").output)
    assert done["action"] == "complete"


def _foreign(tmp_path):
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    return tmp_path / "other"


@pytest.mark.parametrize(
    "case",
    ["missing source", "axis out of range", "percentile blocks", "foreign folder",
     "inside the source", "another job's output"],
)  # fmt: skip
def test_the_dry_run_refuses_what_the_run_refuses_with_its_message_and_exit_code(
    src, tmp_path, case
):
    dst, args = tmp_path / "q.zarr", ["--axis", "0"]
    source = src
    if case == "missing source":
        source = tmp_path / "nope.zarr"
    elif case == "axis out of range":
        args = ["--axis", "5"]
    elif case == "percentile blocks":
        args = ["--axis", "0", "--block-size", "32", "--method", "percentile"]
    elif case == "foreign folder":
        dst = _foreign(tmp_path)
    elif case == "inside the source":
        dst = src / "q"
    else:
        assert cli("quantize", src, dst, "--axis", "1", "-q").exit_code == 0
    before = tree(tmp_path)
    dry = cli("quantize", source, dst, *args, "--dry-run")
    assert dry.exit_code != 0 and tree(tmp_path) == before
    run = cli("quantize", source, dst, *args, "-q")
    assert (dry.exit_code, dry.output) == (run.exit_code, run.output)
    assert dry.output.startswith("error: ")


def test_plan_quantize_in_python_is_the_cli_plan(src, tmp_path):
    plan = qs.plan_quantize(str(src), tmp_path / "q.zarr", qs.QuantSpec(axis=0))
    assert plan.action == "create" and plan.tensors[0]["bytes_after"] == 300 * 200 + 300 * 4
    assert qs.ConversionPlan.from_dict(plan.to_dict()) == plan
    assert not (tmp_path / "q.zarr").exists()
