"""The console script's entry (:mod:`cli.launch`): NumPy imported without OpenBLAS's thread
pool, the environment left as the user had it, and ``python -m cli`` running the command."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PROBE = """
import json, os, sys
from cli.launch import import_numpy_without_blas_pool
off = import_numpy_without_blas_pool()
imported = "numpy" in sys.modules
import numpy  # (as cli.main then does)
print(json.dumps({
    "off": off,
    "imported": imported,
    "threads": len(os.listdir("/proc/self/task")),
    "env": os.environ.get("OPENBLAS_NUM_THREADS"),
}))
"""

needs_proc = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="no /proc")


def _probe(**env: str) -> dict:
    environ = {k: v for k, v in os.environ.items() if not k.endswith("NUM_THREADS")}
    r = subprocess.run(
        [sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        env={**environ, **env},
        timeout=120,
        check=True,
    )
    return json.loads(r.stdout)


@needs_proc
def test_numpy_is_imported_without_a_blas_thread_pool_and_the_environment_is_restored():
    seen = _probe()
    assert seen == {"off": True, "imported": True, "threads": 1, "env": None}


@needs_proc
def test_an_empty_variable_of_the_user_is_left_as_it_was():
    seen = _probe(OPENBLAS_NUM_THREADS="")
    assert seen == {"off": True, "imported": True, "threads": 1, "env": ""}


@needs_proc
def test_a_pool_size_the_user_sets_is_kept():
    seen = _probe(OPENBLAS_NUM_THREADS="2")
    assert seen["off"] is False and seen["imported"] is False and seen["env"] == "2"
    if (os.cpu_count() or 1) > 1:
        assert seen["threads"] > 1  # (OpenBLAS's own pool: what the user asked for)


def test_python_dash_m_cli_runs_the_command_line(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "cli", "inspect", str(tmp_path / "absent.zarr")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2
    assert "absent.zarr" in r.stderr
