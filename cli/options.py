"""The flags several commands share, and how flag values become the library's arguments
(sizes, chunks, offsets), refused as usage errors (exit 2) when they do not parse."""

from __future__ import annotations

import os
import re
from typing import Any, overload

import typer

import qstream as qs

from .output import fmt_bytes

DTYPES = ", ".join(qs.QTYPES)
METHODS = "minmax, percentile, entropy, mse, l2, dynamic"

# --------------------------------------------------------------------------- shared options

SRC = typer.Argument(..., metavar="SRC", help="Source Zarr array: a path, a .zip or a URL.")
DTYPE = typer.Option("int8", "--dtype", metavar="TYPE", help=f"Quantized type: {DTYPES}.")
AXIS = typer.Option(
    None, "--axis", metavar="N", help="One scale per index along this axis (or per block)."
)
BLOCK_SIZE = typer.Option(
    None, "--block-size", metavar="N", help="Blocks of N elements along --axis (group-wise)."
)
SYMMETRIC = typer.Option(
    True, "--symmetric/--asymmetric", help="Symmetric range with zero point 0, or min/max."
)
METHOD = typer.Option(
    "minmax",
    "--method",
    metavar="NAME",
    help=f"Calibration: {METHODS} (dynamic: one range per block, needs --block-size).",
)
PERCENTILE = typer.Option(
    99.99, "--percentile", metavar="P", help="Percent of values kept by --method percentile."
)
MAX_MEMORY = typer.Option(
    None, "--max-memory", metavar="SIZE", help="Working-memory bound, e.g. 512MiB [default: 1GiB]."
)
JSON = typer.Option(False, "--json", help="Print one strict JSON report on stdout.")
QUIET = typer.Option(
    False, "--quiet", "-q", help="No progress, no tables (with --dry-run: the exit code alone)."
)
SCHEDULER = typer.Option(
    None,
    "--scheduler",
    metavar="ADDRESS",
    help="Run the blocks on a Dask cluster: tcp://host:8786, or local:N for N local worker"
    " processes. Paths must be shared by all workers (or object-store URLs).",
)
STORE = typer.Option(
    "fsspec", "--store", metavar="KIND", help="How URLs are opened: fsspec or obstore."
)


def compression_option(auto: str, note: str = "") -> Any:
    """The ``--compression`` option; ``auto``: what ``auto`` means for the command."""
    return typer.Option(
        "auto",
        "--compression",
        metavar="CODEC",
        help=f"How DST's chunks are compressed: auto ({auto}), none (raw: fastest),"
        f" zstd[:LEVEL], gzip[:LEVEL] or blosc[:CNAME[:LEVEL]]. Values are the same whatever"
        f" it is.{note}",
    )


# --------------------------------------------------------------------------- flag values


def check_percentile(method: str, percentile: float) -> None:
    """Refuse ``--percentile`` given with another ``--method`` than percentile."""
    if percentile != 99.99 and method != "percentile":
        raise typer.BadParameter(
            f"--percentile {percentile:g} applies to --method percentile only, not {method};"
            " drop one of them"
        )


def parse_offset(text: str | None) -> str | float | None:
    """``--offset``: 'range' or a number."""
    if text is None or text == "range":
        return text
    try:
        return float(text)
    except ValueError:
        raise typer.BadParameter(f"--offset takes 'range' or a number, got {text!r}") from None


def parse_chunks(text: str | None) -> tuple[int, ...] | None:
    """``--chunks 90,180``: one integer per axis."""
    if text is None:
        return None
    try:
        return tuple(int(v) for v in text.split(","))
    except ValueError:
        raise typer.BadParameter(
            f"--chunks takes integers separated by commas, got {text!r}"
        ) from None


@overload
def parse_size(text: str, flag: str) -> int: ...
@overload
def parse_size(text: None, flag: str) -> None: ...
@overload
def parse_size(text: str | None, flag: str) -> int | None: ...


def parse_size(text: str | None, flag: str) -> int | None:
    """'512MiB', '2GB', '1e9' -> bytes. A ``--max-memory`` above this machine's memory is
    lowered to half of it, with a warning."""
    if text is None:
        return None
    m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([KMGT]i?B?|B)?\s*", text, re.IGNORECASE)
    if not m:
        raise typer.BadParameter(f"{flag}: not a size: {text!r} (examples: 512MiB, 2GB)")
    unit = (m.group(2) or "B").upper().rstrip("B")
    mult = {
        "": 1,
        "K": 1e3,
        "M": 1e6,
        "G": 1e9,
        "T": 1e12,
        "KI": 2**10,
        "MI": 2**20,
        "GI": 2**30,
        "TI": 2**40,
    }[unit]
    size = int(float(m.group(1)) * mult)
    if flag == "--max-memory":
        physical = physical_memory()
        if physical and size > physical:
            typer.echo(
                f"warning: --max-memory {text} is more than this machine's memory"
                f" ({fmt_bytes(physical)}); using {fmt_bytes(physical // 2)}",
                err=True,
            )
            size = physical // 2
    return size


def physical_memory() -> int | None:
    """This machine's memory in bytes (None where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def require_input(path: str, what: str) -> None:
    """Refuse (exit 2, as every input refused before any work) a local ``path`` that does
    not exist; a URL is the library's to open."""
    import os

    if "://" in path and not path.startswith("file://"):
        return
    local = path.removeprefix("file://")
    if not os.path.lexists(local):
        raise typer.BadParameter(f"{what} {path} does not exist")
