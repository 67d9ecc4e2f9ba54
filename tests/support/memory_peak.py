"""A child process's own peak memory, for tests that hold qstream to its memory bound.

The peak is VmHWM of the child's memory map (``/proc/<pid>/status``). ``getrusage``'s
``ru_maxrss`` is not the child's own: Linux keeps it across exec, so a CLI forked from a
pytest worker that had loaded torch and TensorFlow reported the worker's size (821 MB for a
13 MB child), whether read with ``RUSAGE_CHILDREN`` in the parent or ``RUSAGE_SELF`` in the
child.

A child's code starts with :data:`PREAMBLE` (it defines ``vm_hwm()`` and reports the peak on
stderr when the interpreter exits, a ``SystemExit`` included); :func:`run_child` runs it and
returns the exit code, the rest of stderr and the peak. Code that wants the figure itself
(a base and a peak) calls ``vm_hwm()`` (:data:`HWM`).
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# defines vm_hwm(): this process's own peak resident memory in bytes
HWM = (
    "def vm_hwm():\n"
    "    with open('/proc/self/status') as f:\n"
    "        return next(int(x.split()[1]) for x in f if x.startswith('VmHWM:')) << 10\n"
)
# the checkout under test, which children import whatever their working folder
ROOT = str(Path(__file__).resolve().parents[2])
MARK = "peak_rss_kib="
# a child's first lines: its peak on stderr (MARK + KiB) when it exits
PREAMBLE = (
    "import atexit, sys\n"
    + HWM
    + f"atexit.register(lambda: sys.stderr.write('{MARK}%d\\n' % (vm_hwm() >> 10)))\n"
)
# the qstream command line, its arguments those given to run_child
CLI = PREAMBLE + "from cli.main import main\nsys.argv[0] = 'qstream'\nmain()\n"


@dataclass(frozen=True)
class Measured:
    """A finished child: its exit code, stdout, stderr (without the peak line) and peak
    resident memory in bytes (0 when it died before reporting it)."""

    returncode: int
    stdout: str
    stderr: str
    peak: int


def split_peak(stderr: str) -> tuple[int, str]:
    """``(peak bytes, the other lines)`` of a child's stderr (peak 0 if none was written)."""
    lines = stderr.splitlines()
    peak = next((int(x[len(MARK) :]) << 10 for x in lines if x.startswith(MARK)), 0)
    return peak, "\n".join(x for x in lines if not x.startswith(MARK))


def run_child(
    args: Sequence[Any],
    *,
    code: str = CLI,
    cwd: Path | str | None = None,
    env: dict[str, str] | None = None,
    address_space: int | None = None,
    timeout: float = 600,
) -> Measured:
    """Run ``python -c code args...`` (``code`` starting with :data:`PREAMBLE`; default: the
    command line) and measure its own peak; the child imports this checkout's qstream.
    ``env``: added to this process's environment; ``address_space``: a hard ``RLIMIT_AS``
    for the child, so that a regression fails the test instead of eating the machine."""

    def cap() -> None:
        if address_space is not None:
            resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))

    path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    r = subprocess.run(
        [sys.executable, "-c", code, *map(str, args)],
        capture_output=True,
        text=True,
        preexec_fn=cap,
        env={**os.environ, "MALLOC_ARENA_MAX": "2", "PYTHONPATH": path, **(env or {})},
        cwd=cwd,
        timeout=timeout,
    )
    peak, err = split_peak(r.stderr)
    shown = " ".join(map(str, args))[:100]
    print(f"{shown}: exit {r.returncode}, peak RSS {peak >> 20} MiB")
    return Measured(r.returncode, r.stdout, err, peak)
