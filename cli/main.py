"""The ``qstream`` command line. Parses and presents; numeric work lives in the library.

Heavy imports (NumPy kernels, Numba) happen inside commands, so ``qstream --help`` stays fast.
"""

from __future__ import annotations

import typer

app = typer.Typer(
    name="qstream",
    help="Exact quantization and dequantization of arrays, out of core.",
    no_args_is_help=True,
    add_completion=False,
)


@app.command()
def info() -> None:
    """List the quantized types, round modes and compatibility profiles."""
    from rich.console import Console
    from rich.table import Table

    from qstream.compat import _PROFILES
    from qstream.qtypes import QTYPES
    from qstream.rounding import ROUND_MODES

    table = Table(title="quantized types")
    for col in ("name", "kind", "bits", "min", "max"):
        table.add_column(col)
    for t in QTYPES.values():
        table.add_row(t.name, t.kind, str(t.bits), f"{t.qmin:g}", f"{t.qmax:g}")
    console = Console()
    console.print(table)
    console.print("round modes: " + ", ".join(ROUND_MODES))
    console.print("profiles: " + ", ".join(f"qstream.compat.{p}" for p in _PROFILES))


@app.command()
def version() -> None:
    """Print the qstream version."""
    import qstream

    typer.echo(qstream.__version__)


def main() -> None:  # pragma: no cover - console entry point
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
