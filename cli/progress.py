"""Progress of a command's passes on stderr: a Rich bar per pass on a terminal, plain lines
every 10% otherwise (pipes, logs, CI), one line the first time a kernel compiles, and, for a
conversion that resumes, what was done already (:func:`resumed`)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import qstream as qs

from .output import console

if TYPE_CHECKING:
    import rich.progress
    from rich.console import Console


class Progress:
    """The progress reporter handed to the library: the library calls ``stage(name, total,
    done)`` as each pass starts and ``(done, total)`` as blocks land. A bar per pass on a
    terminal; plain lines every 10% otherwise."""

    def __init__(self, label: str, bar: rich.progress.Progress | None = None) -> None:
        self.label = label
        self.bar = bar
        self.task: rich.progress.TaskID | None = None
        self.name = label
        self.unit = "blocks"
        self.last = -1
        self.subject = ""  # the tensor the passes are on, restoring a checkpoint

    def tensor(self, subject: str) -> None:
        """Name the tensor the next passes are on (e.g. ``[3/251] lm_head.weight``)."""
        self.subject = subject
        self.name = self.label
        self.last = -1
        if self.bar is not None and self.task is not None:
            self.bar.remove_task(self.task)  # (thousands of tensors: no pile of hidden bars)
            self.task = None

    def _title(self) -> str:
        """What a bar or line is headed by: the pass, after the tensor if there is one."""
        if not self.subject:
            return self.name
        return f"{self.label} {self.subject}{self.name.removeprefix(self.label)}"

    def stage(self, name: str, total: int, done: int = 0) -> None:
        """A pass ``name`` of ``total`` blocks starts (``done`` of them done already)."""
        self.name = name if name == self.label else f"{self.label}: {name}"
        self.unit = "channels" if name.startswith("search") else "blocks"
        self.last = -1
        if self.bar is not None:
            if self.task is not None:
                self.bar.update(self.task, visible=False)
            self.task = self.bar.add_task(
                self._title(), total=total, completed=done, unit=self.unit
            )
        else:
            self(done, total)

    def __call__(self, done: int, total: int) -> None:
        """``done`` of the pass's ``total`` blocks have landed."""
        if self.bar is not None:
            if self.task is None:
                self.task = self.bar.add_task(self._title(), total=total, unit=self.unit)
            self.bar.update(self.task, completed=done, total=total)
            return
        pct = int(100 * done / max(total, 1))
        if self.last < 0 or pct // 10 != self.last // 10 or done == total:
            self.last = pct
            line = f"{self._title()}: {done}/{total} {self.unit} ({pct}%)"
            print(line, file=sys.stderr, flush=True)


@contextmanager
def progress(label: str, quiet: bool) -> Iterator[Progress | None]:
    """Yields the progress reporter for a command (None when quiet), and says "compiling
    kernels (first run only)" while Numba compiles."""
    if quiet:
        yield None
        return
    err = console(stderr=True)
    with compile_notice(err):
        if not err.is_terminal:
            yield Progress(label)
            return
        from rich.progress import BarColumn, TextColumn, TimeRemainingColumn
        from rich.progress import Progress as Bars

        with Bars(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total} {task.fields[unit]}"),
            TimeRemainingColumn(),
            console=err,
            transient=True,
        ) as bars:
            yield Progress(label, bars)


@contextmanager
def compile_notice(err: Console) -> Iterator[None]:
    """Print one line the first time a kernel compiles in this process."""
    said: list[bool] = []

    def notice(_name: str) -> None:
        if not said:
            said.append(True)
            err.print(
                "compiling kernels (first run only; later runs load them from the cache;"
                " 'qstream warm-up' compiles the common ones at once)"
            )

    remove = qs.on_compile(notice)
    try:
        yield
    finally:
        remove()


@dataclass(frozen=True)
class Resumed:
    """What earlier runs of an interrupted conversion finished: ``done`` of ``total``
    tensors, by ``names``."""

    done: int
    total: int
    names: frozenset[str]

    def line(self) -> str:
        """The line a re-run prints before its progress."""
        return f"resuming: {self.done} of {self.total} tensors already done"

    def to_dict(self) -> dict[str, int]:
        """``resumed`` of a ``--json`` report."""
        return {"done": self.done, "total": self.total}


def resumed(plan: qs.ConversionPlan) -> Resumed | None:
    """What an interrupted conversion into the Zarr group the ``plan`` resumes finished
    already, from the group's own index (None: the plan resumes nothing, or the group
    cannot say)."""
    if plan.action != "resume" or plan.kind != "zarr":
        return None
    try:
        ck = qs.open_quantized(plan.destination, allow_incomplete=True)
    except (qs.QStreamError, OSError, ValueError, KeyError):
        return None
    if not isinstance(ck, qs.QuantizedCheckpoint):
        return None
    total = ck.meta.get("tensors_total")
    if not isinstance(total, int) or isinstance(total, bool):
        total = len(plan.tensors)
    return Resumed(len(ck.tensors), total, frozenset(ck.tensors))
