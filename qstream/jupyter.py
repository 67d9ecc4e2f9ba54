"""The running Jupyter kernel a process is in, if any: where qstream draws its one-line
notices (kernel compilations, a library job's progress) in a notebook cell. IPython is never
imported here: only found when the process has imported it already."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any


def jupyter_cell() -> tuple[Callable[..., Any], Any] | None:
    """``IPython.display.display`` and the shell, in a running Jupyter kernel (IPython
    imported, its shell attached to a kernel); None elsewhere: no IPython, or a terminal
    IPython (a line there would be noise in the scrollback)."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return None
    try:
        shell = ipython.get_ipython()
        from IPython.display import display
    except Exception:  # (an IPython too old or half-imported: no line)
        return None
    if shell is None or getattr(shell, "kernel", None) is None:
        return None
    return display, shell


class NotebookNotice:
    """The line a notebook cell shows while qstream's kernels compile: "compiling kernels
    (first run only): N so far, S s", updated in place through an ``IPython.display``
    handle (the first compile of each cell's run displays it)."""

    def __init__(self, display: Any, shell: Any) -> None:
        self.display = display
        self.shell = shell
        self.handle: Any = None
        self.cell: Any = None  # (the execution count of the cell the line is in)
        self.count = 0
        self.t0 = 0.0
        self.lock = threading.Lock()

    def text(self) -> str:
        took = time.perf_counter() - self.t0  # (since the first began: none for the first)
        return (
            f"compiling kernels (first run only; later runs load them from the cache):"
            f" {self.count} so far" + (f", {took:.1f} s" if self.count > 1 else "")
        )

    def __call__(self, name: str) -> None:
        with self.lock:
            cell = getattr(self.shell, "execution_count", None)
            if self.handle is None or cell != self.cell:
                self.t0, self.count, self.cell = time.perf_counter(), 1, cell
                self.handle = self.display({"text/plain": self.text()}, raw=True, display_id=True)
                return
            self.count += 1
            self.handle.update({"text/plain": self.text()}, raw=True)


def notebook_notice() -> Callable[[], None] | None:
    """In a running Jupyter kernel (IPython imported already, its shell attached to a
    kernel), show qstream's kernel compilations as one line updated in place in the cell's
    output; elsewhere nothing (None). Returns the function that stops it. Called when this
    module's kernels are loaded (:mod:`qstream.kernels.runtime`); IPython is never imported
    here."""
    from .compile_events import on_compile

    cell = jupyter_cell()
    return None if cell is None else on_compile(NotebookNotice(*cell))
