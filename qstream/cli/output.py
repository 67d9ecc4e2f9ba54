"""What the command line prints: progress per pass, tables, strict JSON.

On a terminal: Rich progress bars and tables. Otherwise (pipes, logs, CI): plain lines, one
row per line, nothing wrapped. ``--json``: one strict JSON document on stdout (non-finite
numbers become ``null``; an ``sqnr_db`` of ``null`` means no error at all).
"""

from __future__ import annotations

import json
import math
import sys
from contextlib import contextmanager

import typer


def console(stderr: bool = False):
    from rich.console import Console

    return Console(stderr=stderr)


# --------------------------------------------------------------------------- JSON

_NONFINITE = ("inf", "-inf", "nan")


def strict(value):
    """``value`` with every non-finite number (the library writes them as "inf"/"nan"
    strings in its metadata) replaced by None, so the JSON is strict."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return None if value in _NONFINITE else value
    if isinstance(value, dict):
        return {k: strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(v) for v in value]
    return value


def emit_json(value) -> None:
    """Print ``value`` as one strict JSON document, written piece by piece (a per-channel
    calibration of millions of channels is never held as one string)."""
    _emit(value, sys.stdout.write)
    sys.stdout.write("\n")
    sys.stdout.flush()


_SLAB = 1 << 16  # list items encoded at once


def _small(value, budget: int = _SLAB) -> bool:
    """Whether ``value`` holds at most ``budget`` values (then it is encoded in one call:
    a checkpoint of 100,000 tensors lists 100,000 small objects)."""
    stack, n = [value], 0
    while stack:
        v = stack.pop()
        n += 1
        if n > budget:
            return False
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            if len(v) > budget:
                return False
            stack.extend(v)
    return True


def _emit(value, write) -> None:
    if isinstance(value, (dict, list, tuple)) and _small(value, 256):
        write(json.dumps(strict(value), allow_nan=False))
    elif isinstance(value, dict):
        write("{")
        for i, (k, v) in enumerate(value.items()):
            write(("," if i else "") + json.dumps(str(k)) + ":")
            _emit(v, write)
        write("}")
    elif isinstance(value, (list, tuple)) and len(value) > _SLAB:
        write("[")
        for i in range(0, len(value), _SLAB):
            part = json.dumps(strict(list(value[i : i + _SLAB])), allow_nan=False)
            write(("," if i else "") + part[1:-1])
        write("]")
    else:
        write(json.dumps(strict(value), allow_nan=False))


# --------------------------------------------------------------------------- numbers


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def fmt_db(v) -> str:
    if v is None:
        return "-"
    v = float(v)
    return "inf" if v == math.inf else f"{v:.2f}"


def fmt_num(v) -> str:
    return f"{v:.6g}" if isinstance(v, float) else str(v)


# --------------------------------------------------------------------------- tables


def table(title: str | None, columns: list[str], rows: list[list[str]], *, header=True) -> None:
    """A Rich table on a terminal; plain aligned lines otherwise (never wrapped)."""
    out = console()
    if out.is_terminal:
        from rich.table import Table

        t = Table(title=title, show_header=header)
        for i, c in enumerate(columns):
            t.add_column(c, overflow="fold" if i == 0 else "ellipsis")
        for r in rows:
            t.add_row(*r)
        out.print(t)
        return
    if title:
        typer.echo(title)
    lines = ([columns] if header else []) + rows
    widths = [max(len(r[i]) for r in lines) for i in range(len(columns))]
    for r in lines:
        typer.echo("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


def error_table(title: str, error: dict | None, *, worst: bool = True) -> None:
    """The error summary of a report, and (``worst``) its worst channels."""
    if not error:
        return
    rows = []
    for k in (
        "sqnr_db",
        "mse",
        "max_abs",
        "cosine",
        "clip_fraction",
        "nonfinite",
        "nan",
        "posinf",
        "neginf",
        "count",
    ):
        if k in error:
            v = error[k]
            rows.append([k, fmt_db(v) if k == "sqnr_db" else fmt_num(v)])
    table(title, ["", ""], rows, header=False)
    worst = worst and (error.get("worst_channels") or error.get("worst_groups"))
    if worst:
        key = "channel" if "worst_channels" in error else "group"
        table(
            f"worst {key}s",
            [key, "sqnr_db", "max_abs"],
            [[str(w[key]), fmt_db(w["sqnr_db"]), f"{w['max_abs']:.4g}"] for w in worst],
        )


# --------------------------------------------------------------------------- progress


class Progress:
    """The progress reporter handed to the library: the library calls ``stage(name, total,
    done)`` as each pass starts and ``(done, total)`` as blocks land. A bar per pass on a
    terminal; plain lines every 10% otherwise."""

    def __init__(self, label: str, bar=None):
        self.label = label
        self.bar = bar
        self.task = None
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
def progress(label: str, quiet: bool):
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
def compile_notice(err):
    """Print one line the first time a kernel compiles in this process."""
    import qstream

    said = []

    def notice(_name: str) -> None:
        if not said:
            said.append(True)
            err.print(
                "compiling kernels (first run only; later runs load them from the cache;"
                " 'qstream warm-up' compiles the common ones at once)"
            )

    remove = qstream.on_compile(notice)
    try:
        yield
    finally:
        remove()
