"""Progress of a command's passes on stderr: a Rich bar per pass on a terminal (from the first
second: a "starting" line that becomes "compiling kernels (first run only)" while Numba
compiles), plain lines every 10% otherwise (pipes, logs, CI), one line the first time a kernel
compiles, and, for a conversion that resumes, what was done already (:func:`resumed`).

Ctrl-C acts within a second (:func:`prompt_interrupt`), even while Numba compiles: LLVM's
optimizer runs in one C call of up to several seconds, during which Python's own handler
cannot run."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import qstream as qs

from .output import console, fmt_bytes

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
        self._lock = threading.Lock()  # (the compile line: kernels compile in worker threads)

    def tensor(self, subject: str) -> None:
        """Name the tensor the next passes are on (e.g. ``[3/251] lm_head.weight``)."""
        self.subject = subject
        self.name = self.label
        self.last = -1
        if self.bar is not None and self.task is not None:
            self.bar.remove_task(self.task)  # (thousands of tensors: no pile of hidden bars)
            self.task = None

    overall: rich.progress.TaskID | None = None  # a checkpoint's tensors, finished of all

    def tensors(self, done: int, total: int) -> None:
        """``done`` of a checkpoint's ``total`` tensors are finished: a bar of their own on a
        terminal, under which each big tensor's passes show (nothing otherwise: each tensor
        prints its line)."""
        if self.bar is None:
            return
        self.started()
        count = f"{done}/{total} tensors"
        if self.overall is None:
            self.overall = self.bar.add_task(
                f"{self.label}: tensors", total=total, completed=done, count=count
            )
        else:
            self.bar.update(self.overall, completed=done, total=total, count=count)

    def _title(self) -> str:
        """What a bar or line is headed by: the pass, after the tensor if there is one."""
        if not self.subject:
            return self.name
        return f"{self.label} {self.subject}{self.name.removeprefix(self.label)}"

    def stage(self, name: str, total: int, done: int = 0) -> None:
        """A pass ``name`` of ``total`` blocks starts (``done`` of them done already)."""
        self.started()
        self.name = name if name == self.label else f"{self.label}: {name}"
        self.unit = "channels" if name.startswith("search") else "blocks"
        if name.endswith("builds"):  # (warm-up: kernel builds)
            self.unit = "builds"
        if name == "write":  # (an export's files: bytes of tensors written)
            self.unit = "bytes"
        self.last = -1
        if self.bar is not None:
            if self.task is not None:
                self.bar.update(self.task, visible=False)
            self.task = self.bar.add_task(
                self._title(), total=total, completed=done, count=self._count(done, total)
            )
        else:
            self(done, total)

    def _count(self, done: int, total: int) -> str:
        if self.unit == "bytes":
            return f"{fmt_bytes(done)} of {fmt_bytes(total)}"
        return f"{done}/{total} {self.unit}"

    # the "starting" line, until a pass starts or its blocks land; the "compiling kernels"
    # line while Numba compiles, whenever it does (a later pass's kernels compile after the
    # bar of the one before has finished)
    waiting: rich.progress.TaskID | None = None

    def started(self) -> None:
        """A pass has started, or its blocks land: the "starting" / "compiling kernels" line
        goes."""
        if self.bar is not None and self.waiting is not None:
            with self._lock:
                if self.waiting is not None:
                    self.bar.remove_task(self.waiting)
                    self.waiting = None

    def compiling(self) -> None:
        """Numba starts compiling a kernel: a live line says so, with the seconds spent, until
        the next blocks land (a pass's bar stays)."""
        if self.bar is None:
            return
        with self._lock:
            description = f"{self.label}: {COMPILING}"
            if self.waiting is None:
                self.waiting = self.bar.add_task(description, total=None, count="")
            else:
                self.bar.update(self.waiting, description=description)

    def __call__(self, done: int, total: int) -> None:
        """``done`` of the pass's ``total`` blocks have landed."""
        self.started()
        if self.bar is not None:
            if self.task is None:
                self.task = self.bar.add_task(self._title(), total=total)
            self.bar.update(self.task, completed=done, total=total, count=self._count(done, total))
            return
        pct = int(100 * done / max(total, 1))
        if self.last < 0 or pct // 10 != self.last // 10 or done == total:
            self.last = pct
            line = f"{self._title()}: {self._count(done, total)} ({pct}%)"
            print(line, file=sys.stderr, flush=True)


COMPILING = "compiling kernels (first run only)"


@contextmanager
def progress(label: str, quiet: bool) -> Iterator[Progress | None]:
    """Yields the progress reporter for a command (None when quiet), and says "compiling
    kernels (first run only)" while Numba compiles (listening loads no Numba: a job that
    loads no kernel hears nothing). On a terminal a live line shows from the
    start ("LABEL: starting", then "LABEL: compiling kernels (first run only)", with the
    seconds spent), replaced by a bar per pass. Ctrl-C acts within a second either way."""
    with prompt_interrupt():
        if quiet:
            yield None
            return
        err = console(stderr=True)
        if not err.is_terminal:
            with compile_notice(err):
                yield Progress(label)
            return
        from rich.progress import BarColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
        from rich.progress import Progress as Bars
        from rich.progress import TimeRemainingColumn as Remaining

        with Bars(
            SpinnerColumn(finished_text=" "),
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[count]}"),
            TimeElapsedColumn(),
            Remaining(),
            console=err,
            transient=True,
            refresh_per_second=8,
        ) as bars:
            reporter = Progress(label, bars)
            reporter.waiting = bars.add_task(f"{label}: starting", total=None, count="")
            with compile_notice(err, reporter.compiling):
                yield reporter


@contextmanager
def compile_notice(err: Console, also: Callable[[], None] | None = None) -> Iterator[None]:
    """Print one line the first time a kernel compiles in this process (and call ``also``
    each time one starts compiling)."""
    said: list[bool] = []

    def notice(_name: str) -> None:
        if not said:
            said.append(True)
            err.print(
                "compiling kernels (first run only; later runs load them from the cache;"
                " 'qstream warm-up' compiles the common ones at once)"
            )
        if also is not None:
            also()

    remove = qs.on_compile(notice)
    try:
        yield
    finally:
        remove()


#: seconds from Ctrl-C to the end of the process, at most
GRACE = 0.8
_leaving = threading.Lock()  # (held by whichever ends the command: the main thread or the watcher)


@contextmanager
def prompt_interrupt() -> Iterator[None]:
    """Make Ctrl-C (and SIGTERM) end the command within a second while the body runs, even
    while Numba compiles.

    Python raises KeyboardInterrupt in the main thread between bytecodes, but a job's kernels
    compile in its worker threads (LLVM's optimizer: C calls of seconds), and the main thread,
    unwinding, waits for them: 5-20 s on a first run. A watcher thread learns of the signal at
    once (:func:`signal.set_wakeup_fd`); if the body has not ended :data:`GRACE` seconds
    later, the watcher prints the line Ctrl-C prints (``error: interrupted; ...``, and the
    JSON error with ``--json``), runs the exit handlers (which end a background warm-up
    process) for a moment at most and ends the process with exit code 130. What was written
    stays resumable, as after a kill: outputs are written by renames and the write lock goes
    with the process. Outside the main thread, or where a wakeup fd is in use already, the
    body runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    r, w = os.pipe()
    os.set_blocking(w, False)
    try:
        previous = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    except ValueError:
        previous = None
    if previous != -1:  # (not possible here, or someone else's: theirs stays)
        if previous is not None:
            signal.set_wakeup_fd(previous)
        os.close(r)
        os.close(w)
        yield
        return
    done = threading.Event()

    def watch() -> None:
        while True:
            try:
                got = os.read(r, 64)
            except OSError:
                return
            if not got or done.is_set():
                return
            stop = signal.SIGINT in got or signal.SIGTERM in got
            if stop and not done.wait(GRACE) and _leaving.acquire(False):
                _leave_interrupted(signal.SIGTERM in got and signal.SIGINT not in got)

    watcher = threading.Thread(target=watch, name="qstream-ctrl-c", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        with _leaving:  # (the watcher may be ending the process: then this waits for it)
            done.set()
        signal.set_wakeup_fd(-1)
        os.close(w)  # (the watcher reads EOF and ends)
        watcher.join(1.0)
        os.close(r)


def _leave_interrupted(terminated: bool = False) -> None:
    """End the process as Ctrl-C (or, ``terminated``, SIGTERM) does, from the watcher thread
    (written to the file descriptors: a live display holds ``sys.stderr`` and its lock)."""
    from .failures import json_error

    if terminated:
        kind, code = "terminated", 143
        message = "terminated (SIGTERM); run the same command again to resume"
    else:
        kind, code = "interrupted", 130
        message = "interrupted; run the same command again to resume"
    try:
        cursor = "\x1b[?25h\n" if os.isatty(2) else ""  # (a live display hid the cursor)
        os.write(2, f"{cursor}error: {message}\n".encode())
        json_error(kind, message, code)  # (as library_errors words it; --json: no display)
        sys.stdout.flush()
    except (OSError, ValueError):
        pass
    import atexit

    handlers = getattr(atexit, "_run_exitfuncs", None)  # (CPython)
    if handlers is not None:  # (one may wait on the main thread's locks: a moment only)
        t = threading.Thread(target=handlers, daemon=True)
        t.start()
        t.join(0.3)
    os._exit(code)


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
    """What an interrupted conversion into the Zarr group the ``plan`` resumes (its
    destination, or a safetensors export's working group) finished
    already, from the group's own index (None: the plan resumes nothing, or the group
    cannot say)."""
    if plan.action != "resume" or plan.group is None:
        return None
    try:
        ck = qs.open_quantized(plan.group, allow_incomplete=True)
    except (qs.QStreamError, OSError, ValueError, KeyError):
        return None
    if not isinstance(ck, qs.QuantizedCheckpoint):
        return None
    total = ck.meta.get("tensors_total")
    if not isinstance(total, int) or isinstance(total, bool):
        total = len(plan.tensors)
    # (and those a kill left finished but not listed yet: the run reuses them)
    done = frozenset(ck.tensors) | ck.finished_unlisted(r["name"] for r in plan.tensors)
    return Resumed(len(done), total, done)
