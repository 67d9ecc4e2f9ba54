"""``qstream info`` and ``qstream version``: what this qstream offers, and which it is."""

from __future__ import annotations

import typer

import qstream as qs

from .helptext import examples
from .output import table


@examples("qstream info")
def info() -> None:
    """List the quantized types, round modes and compatibility profiles."""
    table(
        "quantized types",
        ["name", "kind", "bits", "min", "max"],
        [[t.name, t.kind, str(t.bits), bound(t.qmin), bound(t.qmax)] for t in qs.QTYPES.values()],
    )
    typer.echo("round modes: " + ", ".join(qs.ROUND_MODES))
    typer.echo("profiles: " + ", ".join(f"qstream.compat.{p}" for p in qs.compat.PROFILES))


def bound(v: float) -> str:
    """A type's range bound as written: an integer in full (-2147483648, not -2.14748e+09),
    a float to its significant digits (448, 57344, 6)."""
    return str(int(v)) if float(v).is_integer() else f"{v:g}"


@examples("qstream version")
def version() -> None:
    """Print the qstream version (also: qstream --version)."""
    typer.echo(f"qstream {qs.__version__}")
