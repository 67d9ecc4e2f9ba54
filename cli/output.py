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


def fmt_g(v: float | str | None, digits: int = 3) -> str:
    """A figure to ``digits`` significant digits ("-": none); JSON's text for a non-finite
    value (``"inf"``, ``"-inf"``, ``"nan"``) reads as that value."""
    return "-" if v is None else f"{float(v):.{digits}g}"


def fmt_compression(text: object) -> str:
    """How chunks are compressed, as a user reads it: ``zstd (level 0: default)`` for the
    option's ``zstd:0``, ``blosc lz4 (level 5)``, ``none (raw)`` (``--json`` keeps the
    option's spelling, which ``--compression`` takes back)."""
    parts = []
    for codec in str(text).split("+"):
        name, *args = codec.split(":")
        if name == "none" and not args:
            parts.append("none (raw)")
        elif name == "zstd" and args == ["0"]:
            parts.append("zstd (level 0: default)")
        elif name in ("zstd", "gzip") and len(args) == 1:
            parts.append(f"{name} (level {args[0]})")
        elif name == "blosc" and len(args) == 2:
            parts.append(f"blosc {args[0]} (level {args[1]})")
        else:
            parts.append(codec)
    return " + ".join(parts)


def fmt_num(v: object) -> str:
    """A float to six significant digits; anything else as it prints."""
    return f"{v:.6g}" if isinstance(v, float) else str(v)


# --------------------------------------------------------------------------- tables


def table(
    title: str | None, columns: list[str], rows: list[list[str]], *, header: bool = True
) -> None:
    """A Rich table on a terminal, every cell whole but the names in the first column, each on
    one line (long ones abbreviated to fit: :func:`abbreviate`); where the other columns
    leave the names less than :data:`NAME_MIN` characters or cut them past
    :func:`readable`, each row on two lines instead (:func:`stacked_table`). Plain aligned lines
    otherwise (never wrapped, full names)."""
    out = console()
    if out.is_terminal:
        from rich.table import Table

        widths = column_widths(out.width, columns, rows)
        if widths is None:
            stacked_table(out, title, columns, rows, header=header)
            return
        t = Table(title=title, show_header=header)
        for c, w in zip(columns, widths, strict=True):
            t.add_column(c, no_wrap=True, overflow="ellipsis", width=w)
        for r in rows:
            t.add_row(abbreviate(r[0], widths[0]), *r[1:])
        out.print(t)
        return
    if title:
        typer.echo(title)
    lines = ([columns] if header else []) + rows
    widths = [max(len(r[i]) for r in lines) for i in range(len(columns))]
    for r in lines:
        typer.echo("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


#: the fewest characters a terminal table's first (name) column is given beside the others;
#: with less room its rows are stacked (name, then the other cells), every cell whole
NAME_MIN = 24
#: the fewest characters a cut part of a name keeps in a side-by-side table (:func:`readable`):
#: names cut more (``m….l….0.m….ex….0.do….weight``) say less than the same rows stacked
PART_KEPT = 4


def column_widths(total: int, columns: list[str], rows: list[list[str]]) -> list[int] | None:
    """The widths of a terminal table's columns, every row on one line within ``total``
    characters: each column as wide as its widest cell where that fits; else every column
    but the first (names) still whole and the first given the rest, when that is at least
    :data:`NAME_MIN` (or its widest name) and its longest name cut to it stays
    :func:`readable`; else None: the table does not fit side by side (:func:`stacked_table`)."""
    widths = [max([len(c), *(len(r[i]) for r in rows)]) for i, c in enumerate(columns)]
    room = total - 3 * len(columns) - 1  # (borders and padding)
    if sum(widths) <= room:
        return widths
    name = room - sum(widths[1:])
    longest = max((r[0] for r in rows), key=len, default="")
    if name >= min(widths[0], NAME_MIN) and readable(abbreviate(longest, name)):
        return [name, *widths[1:]]
    return None


def fit_line(head: str, name: str, forms: list[str], width: int | None) -> str:
    """``head name form`` with the first of ``forms`` (fullest first) that fits in ``width``
    columns (a terminal's; None: not a terminal, the fullest), the name abbreviated
    (:func:`abbreviate`) where even the last does not."""
    for form in forms:
        line = f"{head}{name}{form}"
        if width is None or len(line) <= width:
            return line
    room = (width or 0) - len(head) - len(forms[-1])
    return f"{head}{abbreviate(name, max(room, NAME_MIN))}{forms[-1]}"


def terminal_width() -> int | None:
    """The width of the terminal stdout writes to (None: stdout is not a terminal)."""
    out = console()
    return out.width if out.is_terminal else None


def readable(short: str) -> bool:
    """Whether an :func:`abbreviate`d name still says what it names: every part it cuts
    keeps at least :data:`PART_KEPT` characters (``model.langu….layers.0``, not
    ``m….l….0.m….ex….0.do….weight``), and no middle is left out."""
    parts = short.split(".")
    if any("…" in p[:-1] for p in parts):
        return False
    return all(len(p) - 1 >= PART_KEPT for p in parts if p.endswith("…"))


def stacked_table(
    out: Console, title: str | None, columns: list[str], rows: list[list[str]], *, header: bool
) -> None:
    """A table too wide for the terminal side by side: each row's first cell (a name) on a
    line of its own (abbreviated only if longer than the terminal is wide), its other cells
    on the next line, indented and aligned under one header line; no cell cut but a values
    line wider than the terminal."""
    from rich.text import Text

    def say(text: str, style: str = "") -> None:
        out.print(Text(text, style=style), no_wrap=True, overflow="ellipsis", crop=True)

    heads = columns[1:]
    widths = [
        max([len(h) if header else 0, *(len(r[i + 1]) for r in rows)]) for i, h in enumerate(heads)
    ]

    def values(cells: list[str]) -> str:
        return ("  " + "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True))).rstrip()

    if title:
        out.print(Text(title, style="italic"))  # (wrapped, as a side-by-side table's title)
    if header:
        say(columns[0], "bold")
        say(values(heads), "bold")
    for r in rows:
        say(abbreviate(r[0], out.width))
        say(values(r[1:]))


def abbreviate(name: str, width: int) -> str:
    """``name`` in ``width`` characters: its longest dotted parts cut first, each to a prefix
    and "…", numbers never and the last part last (``model.langu….layers.0.block_sp….experts.0
    .down_proj.weight``); the middle left out where that is not enough."""
    if len(name) <= width:
        return name
    parts = name.split(".")
    keep = [len(p) for p in parts]
    over = len(name) - width

    def shown(i: int) -> int:
        return keep[i] + (keep[i] < len(parts[i]))  # (a cut part ends in "…")

    while over > 0:
        cuttable = [i for i, p in enumerate(parts) if not p.isdigit() and keep[i] > 1]
        if len(cuttable) > 1 and cuttable[-1] == len(parts) - 1:
            cuttable.pop()  # (the last part, weight or bias, last of all)
        if not cuttable:
            break
        i = max(cuttable, key=lambda k: (shown(k), -k))  # longest first; ties: the earlier
        before = shown(i)
        keep[i] -= 1 if keep[i] < len(parts[i]) else 2
        over -= before - shown(i)
    out = ".".join(p if k == len(p) else p[:k] + "…" for p, k in zip(parts, keep, strict=True))
    if len(out) <= width:
        return out
    head = max((width - 1) // 3, 0)
    return (name[:head] + "…" + name[len(name) - (width - 1 - head) :])[:width]


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
            [[str(w[key]), fmt_db(w["sqnr_db"]), fmt_g(w["max_abs"], 4)] for w in listed],
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
