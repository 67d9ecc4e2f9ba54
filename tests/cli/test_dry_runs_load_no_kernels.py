"""A dry run, and a re-run of a finished conversion, exit without loading Numba (no kernel
runs in a plan): they cost what planning costs (``qstream.engine.jobs.array_jobs`` imports its
kernels at their first call; ``qstream convert`` warms kernels up only for work to do)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import zarr

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SAMPLE = os.path.join(ROOT, "samples", "tiny-transformer.safetensors")
RECIPE = os.path.join(ROOT, "samples", "recipe-int8.toml")

SCRIPT = """
import json, sys
from cli.main import main
sys.argv = ["qstream", *sys.argv[1:]]
try:
    main()
except SystemExit as e:
    code = e.code
print(json.dumps({"code": code, "numba": "numba" in sys.modules}))
"""


def _dry(tmp_path, *args: str) -> tuple[dict, str]:
    r = subprocess.run(
        [sys.executable, "-c", SCRIPT, *args, "--dry-run"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stdout


@pytest.mark.parametrize("command", ["convert", "quantize"])
def test_a_dry_run_plans_without_loading_numba(tmp_path, command):
    if command == "convert":
        args = ("convert", SAMPLE, str(tmp_path / "out.zarr"), "--recipe", RECIPE)
    else:
        z = zarr.create_array(tmp_path / "w.zarr", shape=(64, 32), dtype="float32")
        z[:] = np.ones((64, 32), np.float32)
        args = ("quantize", str(tmp_path / "w.zarr"), str(tmp_path / "q.zarr"), "--dtype", "int8")
    seen, out = _dry(tmp_path, *args)
    assert seen == {"code": 0, "numba": False}
    assert "create" in out  # (the plan: what the run would do with DST)
    assert not os.path.exists(args[2])  # (nothing written)


def test_a_rerun_of_a_finished_conversion_loads_no_kernel(tmp_path):
    out = tmp_path / "out.zarr"
    args = ("convert", SAMPLE, str(out), "--recipe", RECIPE)
    kernels = {**os.environ, "QSTREAM_NUMPY_JOB": "0"}  # (the sample alone runs no kernel)
    first = subprocess.run(
        [sys.executable, "-c", SCRIPT, *args, "-q"],
        capture_output=True,
        text=True,
        timeout=300,
        env=kernels,
    )
    assert json.loads(first.stdout.strip().splitlines()[-1]) == {"code": 0, "numba": True}
    again = subprocess.run(
        [sys.executable, "-c", SCRIPT, *args], capture_output=True, text=True, timeout=300
    )
    assert json.loads(again.stdout.strip().splitlines()[-1]) == {"code": 0, "numba": False}
    assert "already complete" in again.stderr + again.stdout
