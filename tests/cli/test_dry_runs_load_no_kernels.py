"""A dry run, and a re-run of a finished conversion, exit without loading Numba (no kernel
runs in a plan): they cost what planning costs (``qstream.engine.jobs.array_jobs`` imports its
kernels at their first call; ``qstream convert`` warms kernels up only for work to do)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import zarr

from ..support.numba_watch import run_watched

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SAMPLE = os.path.join(ROOT, "samples", "tiny-transformer.safetensors")
RECIPE = os.path.join(ROOT, "samples", "recipe-int8.toml")


def _dry(tmp_path, *args: str) -> tuple[dict, str]:
    seen, p = run_watched(*args, "--dry-run", cwd=tmp_path)
    return seen, p.stdout


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
    first, _ = run_watched(*args, "-q", env=kernels)
    assert first == {"code": 0, "numba": True}
    again, p = run_watched(*args)
    assert again == {"code": 0, "numba": False}
    assert "already complete" in p.stderr + p.stdout
