"""The console script's housekeeping (:mod:`cli.process`): it runs the cycle collector
rarely and keeps freed memory for reuse, and ends its process without the interpreter's
teardown, with exit codes, output, ``atexit`` handlers and running threads as a normal exit
leaves them."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from cli.process import exit_code


def _script(tmp_path, body: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``body`` then the console script (``console()``) with ``args``, in a new
    process."""
    code = textwrap.dedent(body) + textwrap.dedent(f"""
        import sys
        sys.argv = ["qstream", *{list(args)!r}]
        from cli.main import console
        console()
        """)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300
    )


@pytest.mark.parametrize(("code", "expected"), [(None, 0), (0, 0), (2, 2), (141, 141), ("boom", 1)])
def test_exit_code_is_that_of_system_exit(code, expected, capsys):
    assert exit_code(code) == expected
    if isinstance(code, str):
        assert capsys.readouterr().err.strip() == "boom"


def test_a_failing_command_keeps_its_exit_code_and_message(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "cli.main", "inspect", str(tmp_path / "absent.zarr")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2  # (a missing input: refused before any work)
    assert "absent.zarr" in r.stderr


def test_piped_output_is_complete_and_atexit_handlers_run(tmp_path):
    from safetensors.numpy import save_file

    x = np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)
    tensors = {f"layer.{i}.weight": x * (i + 1) for i in range(40)}
    save_file(tensors, str(tmp_path / "m.safetensors"))
    ran = tmp_path / "atexit-ran"
    r = _script(
        tmp_path,
        f"""
        import atexit, pathlib
        atexit.register(lambda: pathlib.Path({str(ran)!r}).write_text("yes"))
        """,
        "convert", "m.safetensors", "out.zarr", "--json",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout[r.stdout.index("{") :])  # the whole report, flushed
    assert len(report["tensors"]) == 40
    assert ran.read_text() == "yes"


def test_a_running_thread_is_waited_for_as_python_would(tmp_path):
    done = tmp_path / "thread-done"
    r = _script(
        tmp_path,
        f"""
        import pathlib, threading, time
        def later():
            time.sleep(0.5)
            pathlib.Path({str(done)!r}).write_text("done")
        threading.Thread(target=later).start()
        """,
        "--version",
    )
    assert r.returncode == 0 and r.stdout.startswith("qstream ")
    assert done.read_text() == "done"


def _housekeeping(env: dict[str, str] | None = None) -> dict:
    """What the console script's housekeeping sets, seen in a new process."""
    code = textwrap.dedent("""
        import gc, json
        from cli.process import THRESHOLDS, collect_rarely, keep_freed_memory
        before = gc.get_freeze_count()
        collect_rarely()
        print(json.dumps({
            "thresholds": list(gc.get_threshold()), "expected": list(THRESHOLDS),
            "frozen": gc.get_freeze_count() - before, "malloc": keep_freed_memory(),
        }))
        """)
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_the_console_script_collects_cycles_rarely_and_keeps_freed_memory():
    seen = _housekeeping()
    assert seen["thresholds"] == seen["expected"]
    assert seen["frozen"] > 1000  # the start-up's objects, set aside
    glibc = sys.platform.startswith("linux") and "glibc" in " ".join(platform.libc_ver())
    assert seen["malloc"] is glibc


def test_malloc_tunables_given_by_the_user_are_left_alone():
    env = {**os.environ, "GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1048576"}
    assert _housekeeping(env)["malloc"] is False


@pytest.mark.parametrize(
    ("package", "check"),
    [
        ("scipy.linalg", "scipy.linalg.solve([[2.0]], [4.0]).tolist() == [2.0]"),
        ("cffi", "cffi.FFI().sizeof('int') == 4"),
        ("yaml", "yaml.safe_load('a: 1') == {'a': 1}"),
    ],
)
def test_numbas_probes_are_skipped_without_importing_the_package_which_still_imports(
    tmp_path, package, check
):
    """Numba's probes for BLAS (SciPy), CFFI and PyYAML (with no ``.numba_config.yaml`` to
    read) find nothing in the qstream command; the packages themselves still import and work
    afterwards."""
    pytest.importorskip(package)  # (without it there is no probe to skip)
    code = textwrap.dedent(f"""
        import json, sys
        from cli.process import skip_numba_probes
        first = skip_numba_probes()
        from qstream.kernels.error_stats import columns
        columns(1, 1)  # a kernel's first call: Numba sets up its CPU target
        import numba.np.arraymath as arraymath
        from numba.core.typing import cffi_utils
        from numba.core import config
        seen = {{"first": first, "again": skip_numba_probes(),
                "imported": {package!r} in sys.modules,
                "blas": arraymath._HAVE_BLAS, "cffi": cffi_utils.SUPPORTED,
                "yaml": config._HAVE_YAML,
                "waiting": [p for f in sys.meta_path for p in getattr(f, "waiting", ())]}}
        import {package}
        seen["works"] = {check}
        print(json.dumps(seen))
        """)
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300
    )
    assert r.returncode == 0, r.stderr
    seen = json.loads(r.stdout)
    assert seen["first"] is True and seen["again"] is False
    assert seen["imported"] is False  # the probe did not import the package
    assert (seen["blas"], seen["cffi"], seen["yaml"]) == (False,) * 3  # as without them
    assert package not in seen["waiting"]  # its probe failed once, and no other import will
    assert seen["works"] is True  # the package imports and works afterwards


def test_a_numba_config_file_is_still_read_by_the_qstream_command(tmp_path):
    """Where the current folder holds a ``.numba_config.yaml``, PyYAML is not kept from Numba:
    the file's settings hold in the qstream command as in any Numba program."""
    pytest.importorskip("yaml")
    (tmp_path / ".numba_config.yaml").write_text("disable_performance_warnings: 1\n")
    code = textwrap.dedent("""
        import json, sys
        from cli.process import skip_numba_probes
        skip_numba_probes()
        from numba.core import config
        print(json.dumps([config._HAVE_YAML, config.DISABLE_PERFORMANCE_WARNINGS]))
        """)
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == [True, 1]
