"""No import in worker threads (issue 44): a conversion that kept a bf16 tensor while another
worker wrote int4 codes crashed in one run in two with ``_DeadlockError`` on zarr's module
locks. Each command below runs in a fresh process under the watch of
``tests/support/worker_imports.py``, which sees every module a qstream worker thread loads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from ..support import worker_imports
from ..support.llama_folder import write_llama

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SAMPLES = os.path.join(ROOT, "samples")
CRASHED = ("--dtype", "int4", "--block-size", "128", "--exclude", "model.embed_tokens*")


def watched(*args: str, cwd: str) -> tuple[int, list, str]:
    """``qstream ARGS`` in a fresh process under the watch: (exit code, worker imports,
    stderr)."""
    env = {**os.environ, "PYTHONPATH": ROOT}
    p = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tests", "support", "worker_imports.py"), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=300,
    )
    line = [x for x in p.stdout.splitlines() if x.startswith("WORKER-IMPORTS ")]
    assert line, p.stdout + p.stderr
    return p.returncode, json.loads(line[-1].split(" ", 1)[1]), p.stderr


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return write_llama(str(tmp_path_factory.mktemp("llama") / "model"))


def test_the_watch_sees_a_module_first_loaded_by_a_qstream_worker_thread():
    sys.modules.pop("colorsys", None)

    def work():
        exec("import colorsys", {"__name__": "qstream.somewhere"})

    worker_imports.taken()
    with ThreadPoolExecutor(1, thread_name_prefix="qstream-worker") as pool:
        pool.submit(work).result()
    got = worker_imports.taken()
    assert [g[0] for g in got] == ["colorsys"]
    assert got[0][1].startswith("qstream-worker") and got[0][2].startswith("qstream.somewhere")
    # another thread's imports, and a qstream thread's import of a loaded module, are not seen
    sys.modules.pop("colorsys", None)
    t = threading.Thread(target=work, name="other")
    t.start()
    t.join()
    assert worker_imports.taken() == []


CATALOG = {
    "convert-int4-kept-bf16": ("convert", "{llama}", "{out}/a.zarr", *CRASHED),
    "convert-int8": ("convert", "{llama}", "{out}/b.zarr"),
    "convert-safetensors": ("convert", "{llama}", "{out}/c/model.safetensors"),
    "convert-gguf": ("convert", "{llama}", "{out}/d.gguf"),
    "convert-sample": ("convert", "{samples}/tiny-transformer.safetensors", "{out}/e.zarr"),
    "quantize-percentile": (
        "quantize", "{samples}/activations.zarr", "{out}/f.zarr", "--method", "percentile",
    ),
    "quantize-int4-dynamic": (
        "quantize", "{samples}/activations.zarr", "{out}/g.zarr", "--dtype", "int4",
        "--axis", "1", "--block-size", "32", "--method", "dynamic",
    ),
    "calibrate": ("calibrate", "{samples}/activations.zarr", "--method", "mse", "--json"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(CATALOG))
def test_no_command_imports_in_its_worker_threads(case, llama, tmp_path):
    fill = {"llama": llama, "out": str(tmp_path), "samples": SAMPLES}
    args = [a.format(**fill) for a in CATALOG[case]]
    code, imports, err = watched(*args, "-q", cwd=str(tmp_path))
    assert code == 0, err
    assert imports == []


def test_dequantize_of_int4_codes_imports_nothing_in_its_worker_threads(tmp_path):
    out = str(tmp_path / "q.zarr")
    code, imports, err = watched(
        "quantize", f"{SAMPLES}/activations.zarr", out, "--dtype", "int4", "--axis", "1",
        "--block-size", "32", "--method", "dynamic", "-q", cwd=str(tmp_path),
    )  # fmt: skip
    assert code == 0, err
    code, imports, err = watched(
        "dequantize", out, str(tmp_path / "r.zarr"), "--dtype", "bfloat16", "-q",
        cwd=str(tmp_path),
    )  # fmt: skip
    assert code == 0, err
    assert imports == []


def test_a_small_arrays_quantize_and_dequantize_import_nothing_in_their_worker_threads(tmp_path):
    """(Both run the NumPy twins, whose modules are imported before the workers start; four
    blocks each, on the workers.)"""
    out = str(tmp_path / "q.zarr")
    code, imports, err = watched(
        "quantize", f"{SAMPLES}/activations.zarr", out, "--axis", "1", "--chunks", "128,-1",
        "-q", cwd=str(tmp_path),
    )  # fmt: skip
    assert code == 0, err
    assert imports == []
    code, imports, err = watched(
        "dequantize", out, str(tmp_path / "r.zarr"), "--dtype", "float16", "-q",
        cwd=str(tmp_path),
    )  # fmt: skip
    assert code == 0, err
    assert imports == []


def _convert_many(llama: str, out: str, runs: int) -> list[str]:
    """The conversion that crashed, ``runs`` times, each in a fresh process (two at once)."""

    def one(i: int) -> str | None:
        p = subprocess.run(
            [sys.executable, "-m", "cli.main", "convert", llama, f"{out}/{i}.zarr",
             *CRASHED, "-q"],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        return None if p.returncode == 0 else f"exit {p.returncode}: {p.stderr.strip()}"

    with ThreadPoolExecutor(2) as pool:
        return [r for r in pool.map(one, range(runs)) if r is not None]


def test_the_conversion_that_deadlocked_succeeds_10_times_in_fresh_processes(llama, tmp_path):
    """(It deadlocked in one run of two; 100 runs with ``pytest -m slow``.)"""
    assert _convert_many(llama, str(tmp_path), 10) == []


@pytest.mark.slow
def test_the_conversion_that_deadlocked_succeeds_100_times_in_fresh_processes(llama, tmp_path):
    assert _convert_many(llama, str(tmp_path), 100) == []
