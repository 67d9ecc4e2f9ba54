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
        [[t.name, t.kind, str(t.bits), f"{t.qmin:g}", f"{t.qmax:g}"] for t in qs.QTYPES.values()],
    )
    typer.echo("round modes: " + ", ".join(qs.ROUND_MODES))
    typer.echo("profiles: " + ", ".join(f"qstream.compat.{p}" for p in qs.compat.PROFILES))


@examples("qstream version")
def version() -> None:
    """Print the qstream version (also: qstream --version)."""
    typer.echo(f"qstream {qs.__version__}")
