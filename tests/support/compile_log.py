"""A record of the kernels each test process compiles (a tool for the suite's time, off by
default): with ``QSTREAM_COMPILE_LOG=DIR`` every pytest process appends one JSON line per
top-level Numba compilation to ``DIR/<pid>.jsonl`` (kernel, signature, seconds, test), so
the kernels several workers compile each, and the tests that pay for first compiles, can be
read off after a run from an empty cache."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Iterator

_depth = threading.local()
# The test that is running, kept on ``sys``: one per process, whichever copy of this module
# (conftest's, or the one the subprocess hook loads) installed the log.
_TEST = "_qstream_compile_log_test"


def name_test(test: str) -> None:
    """Label this process's next compilations (and, with the log on, the subprocesses it
    starts) with ``test``."""
    setattr(sys, _TEST, test)
    if os.environ.get("QSTREAM_COMPILE_LOG"):
        os.environ["QSTREAM_LOG_TEST"] = test


@contextlib.contextmanager
def timed(test: str) -> Iterator[None]:
    """With the log on, the test's start and end (``DIR/tests-<pid>.jsonl``): the workers'
    timelines, to see how long one waits for the other at the end of a run, with the CPU
    seconds the test process and its finished children spent (a test that waits costs the
    run less than its wall time)."""
    folder = os.environ.get("QSTREAM_COMPILE_LOG")
    t0, c0 = time.time(), os.times()
    yield
    if folder:
        c1 = os.times()
        line = {"test": test, "start": t0, "end": time.time(),
                "cpu": round(c1.user + c1.system - c0.user - c0.system, 3),
                "children_cpu": round(c1.children_user + c1.children_system
                                      - c0.children_user - c0.children_system, 3),
                "worker": os.environ.get("PYTEST_XDIST_WORKER", "")}  # fmt: skip
        with open(os.path.join(folder, f"tests-{os.getpid()}.jsonl"), "a") as f:
            f.write(json.dumps(line) + "\n")


def install(label: str = "") -> None:
    """Start the log in this process (once: the test workers inherit the subprocess hook's
    PYTHONPATH too); ``label`` names its compilations until :func:`name_test` does."""
    folder = os.environ.get("QSTREAM_COMPILE_LOG")
    if not folder or hasattr(sys, _TEST):
        return
    setattr(sys, _TEST, label)
    import numba.core.event as ev

    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{os.getpid()}.jsonl")

    class Log(ev.Listener):
        def on_start(self, event: ev.Event) -> None:
            stack = getattr(_depth, "stack", None)
            if stack is None:
                stack = _depth.stack = []
            stack.append(time.perf_counter())

        def on_end(self, event: ev.Event) -> None:
            t0 = _depth.stack.pop()
            if _depth.stack:
                return
            d = event.data["dispatcher"]
            line = {
                "kernel": f"{d.py_func.__module__}.{d.py_func.__qualname__}",
                "sig": str(event.data.get("args")),
                "seconds": round(time.perf_counter() - t0, 3),
                "test": getattr(sys, _TEST, ""),
                "worker": os.environ.get("PYTEST_XDIST_WORKER", ""),
                "at": time.time(),
            }
            with open(path, "a") as f:
                f.write(json.dumps(line) + "\n")

    ev.register("numba:compile", Log())
