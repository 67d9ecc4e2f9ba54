"""A library job's progress in a Jupyter cell: one text line, updated in place.

``qs.quantize_store``, ``qs.dequantize_store``, ``qs.calibrate`` and
``qs.convert_checkpoint`` called from a notebook without a ``progress`` of their own show
``quantize: quantize 12/32 blocks (37%), 3.1 s`` under the cell once the job has run
:data:`SHOW_AFTER` seconds (a quick call shows nothing), then ``quantize: done in 4.2 s``.
Outside a running Jupyter kernel (scripts, a terminal IPython, the command line, which has its
own live display) nothing is shown: the library never prints. IPython is never imported here:
only found when the user's process has it already.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ..jupyter import jupyter_cell

#: seconds a job runs before its line appears (a user waiting longer than this sees it)
SHOW_AFTER = 1.0
#: at most this many updates of the line a second
RATE = 5.0


class NotebookProgress:
    """``progress(done, total)`` and ``stage(name, total, done)`` as the engine calls them
    (from any thread), drawn as one line through an ``IPython.display`` handle; ``close()``
    writes the final line."""

    def __init__(self, job: str, display: Callable[..., Any]) -> None:
        self.job = job
        self.display = display
        self.handle: Any = None
        self.name = ""
        self.done = 0
        self.total = 0
        self.t0 = time.perf_counter()
        self.last = 0.0
        self.lock = threading.Lock()

    def text(self) -> str:
        took = time.perf_counter() - self.t0
        where = f"{self.name} " if self.name else ""
        if self.total > 0:
            pct = 100.0 * self.done / self.total
            if self.name == "write":  # (an export: bytes of tensors written)
                count = f"{self.done / 2**20:.1f}/{self.total / 2**20:.1f} MiB"
            else:
                count = f"{self.done}/{self.total} blocks"
            return f"{self.job}: {where}{count} ({pct:.0f}%), {took:.1f} s"
        return f"{self.job}: {where}{took:.1f} s"

    def _draw(self, force: bool = False) -> None:
        now = time.perf_counter()
        if not force and (now - self.t0 < SHOW_AFTER or now - self.last < 1.0 / RATE):
            return
        self.last = now
        data = {"text/plain": self.text()}
        if self.handle is None:
            self.handle = self.display(data, raw=True, display_id=True)
        else:
            self.handle.update(data, raw=True)

    def stage(self, name: str, total: int, done: int = 0) -> None:
        """A pass starts: ``name`` (ranges, histograms, search, quantize, ...) of ``total``
        blocks, ``done`` of them done already (a resumed run)."""
        with self.lock:
            self.name, self.total, self.done = name, int(total), int(done)
            self._draw()

    def __call__(self, done: int, total: int) -> None:
        with self.lock:
            self.done, self.total = int(done), int(total)
            self._draw()

    def close(self, ok: bool = True) -> None:
        """The final line (only if the line was shown): done, or stopped."""
        with self.lock:
            if self.handle is None:
                return
            took = time.perf_counter() - self.t0
            end = f"done in {took:.1f} s" if ok else f"stopped after {took:.1f} s"
            self.handle.update({"text/plain": f"{self.job}: {end}"}, raw=True)


def notebook_progress(job: str) -> NotebookProgress | None:
    """A :class:`NotebookProgress` for ``job`` in a running Jupyter kernel; None elsewhere
    (no IPython imported by the process, a terminal IPython)."""
    cell = jupyter_cell()
    return None if cell is None else NotebookProgress(job, cell[0])


@contextmanager
def reporting(progress: Any, job: str) -> Iterator[Any]:
    """The reporter a library job uses: the caller's ``progress`` when given, else a
    notebook's line (closed as the job ends), else None."""
    if progress is not None:
        yield progress
        return
    shown = notebook_progress(job)
    try:
        yield shown
    except BaseException:
        if shown is not None:
            shown.close(ok=False)
        raise
    if shown is not None:
        shown.close()
