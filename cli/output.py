"""What the command line prints: tables, numbers, strict JSON (progress:
:mod:`cli.progress`).

On a terminal: Rich tables. Otherwise (pipes, logs, CI): plain lines, one
row per line, nothing wrapped. ``--json``: one strict JSON document on stdout (non-finite
numbers become ``null``; an ``sqnr_db`` of ``null`` means no error at all), every command's
in one style: an object whose first keys are ``qstream_version`` and ``summary``
(:mod:`cli.report_summary`), then the report, written with ``", "`` and ``": "`` between
items however large it is. A failure with ``--json`` prints ``{"error": {...}, ...}``
instead (:func:`cli.failures.fail`).
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import typer

import qstream as qs

from .report_summary import summarize

if TYPE_CHECKING:
    from rich.console import Console


def console(stderr: bool = False) -> Console:
    """A Rich console on stdout (or stderr)."""
    from rich.console import Console

    return Console(stderr=stderr)


# --------------------------------------------------------------------------- JSON

_NONFINITE = ("inf", "-inf", "nan")


def strict(value: object) -> object:
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


def emit_json(value: object, summary: dict[str, Any] | None = None) -> None:
    """Print ``value`` as one strict JSON document, written piece by piece (a per-channel
    calibration of millions of channels is never held as one string). A report (a dict)
    comes after ``qstream_version`` and its ``summary`` (default: :func:`summarize`'s)."""
    if isinstance(value, dict):
        if summary is None:
            summary = summarize(value)
        head = {"qstream_version": qs.__version__, "summary": summary}
        value = {**head, **{k: v for k, v in value.items() if k not in head}}
    _emit(value, sys.stdout.write)
    sys.stdout.write("\n")
    sys.stdout.flush()


_SLAB = 1 << 16  # list items encoded at once


def _small(value: object, budget: int = _SLAB) -> bool:
    """Whether ``value`` holds at most ``budget`` values (then it is encoded in one call:
    a checkpoint of 100,000 tensors lists 100,000 small objects)."""
    stack: list[object] = [value]
    n = 0
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


def _emit(value: object, write: Callable[[str], object]) -> None:
    """Write ``value`` as JSON in pieces, with json.dumps's own separators (``", "``,
    ``": "``) between the pieces too: one style whatever the report's size."""
    if isinstance(value, (dict, list, tuple)) and _small(value, 256):
        write(json.dumps(strict(value), allow_nan=False))
    elif isinstance(value, dict):
        write("{")
        for i, (k, v) in enumerate(value.items()):
            write((", " if i else "") + json.dumps(str(k)) + ": ")
            _emit(v, write)
        write("}")
    elif isinstance(value, (list, tuple)) and len(value) > _SLAB:
        write("[")
        for i in range(0, len(value), _SLAB):
            part = json.dumps(strict(list(value[i : i + _SLAB])), allow_nan=False)
            write((", " if i else "") + part[1:-1])
        write("]")
    else:
        write(json.dumps(strict(value), allow_nan=False))


# --------------------------------------------------------------------------- numbers


def fmt_bytes(n: float) -> str:
    """``n`` bytes in B, KiB, MiB, GiB or TiB."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def fmt_db(v: float | str | None) -> str:
    """A decibel value to two decimals ("-": none, "inf": no error at all)."""
    if v is None:
        return "-"
    db = float(v)
    return "inf" if db == math.inf else f"{db:.2f}"


def fmt_num(v: object) -> str:
    """A float to six significant digits; anything else as it prints."""
    return f"{v:.6g}" if isinstance(v, float) else str(v)


# --------------------------------------------------------------------------- tables


def table(
    title: str | None, columns: list[str], rows: list[list[str]], *, header: bool = True
) -> None:
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


def error_table(title: str, error: dict[str, Any] | None, *, worst: bool = True) -> None:
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
    listed = worst and (error.get("worst_channels") or error.get("worst_groups"))
    if listed:
        key = "channel" if "worst_channels" in error else "group"
        table(
            f"worst {key}s",
            [key, "sqnr_db", "max_abs"],
            [[str(w[key]), fmt_db(w["sqnr_db"]), f"{w['max_abs']:.4g}"] for w in listed],
        )


def done_already(dst: str, report: dict[str, Any], as_json: bool, quiet: bool) -> bool:
    """Say "already complete" for a re-run of a finished job (True if it was one)."""
    if not report.get("already_complete"):
        return False
    if as_json:
        emit_json({**report, "already_complete": True})
    elif not quiet:
        typer.echo(f"{dst}: already complete (same job); nothing to do")
    return True
