"""``qstream info`` and ``qstream version``: what this qstream offers, and which it is."""

from __future__ import annotations

import typer

import qstream as qs

from .helptext import examples
from .options import JSON
from .output import emit_json, table


@examples("qstream info\nqstream info --json")
def info(as_json: bool = JSON) -> None:
    """List the quantized types, round modes and compatibility profiles."""
    if as_json:
        types = {
            t.name: {"kind": t.kind, "bits": t.bits, "min": number(t.qmin), "max": number(t.qmax)}
            for t in qs.QTYPES.values()
        }
        emit_json(
            {
                "types": types,
                "round_modes": list(qs.ROUND_MODES),
                "profiles": [f"qstream.compat.{p}" for p in qs.compat.PROFILES],
            },
            {"types": len(types), "round_modes": len(qs.ROUND_MODES)},
        )
        return
    table(
        "quantized types",
        ["name", "kind", "bits", "min", "max"],
        [[t.name, t.kind, str(t.bits), bound(t.qmin), bound(t.qmax)] for t in qs.QTYPES.values()],
    )
    typer.echo("round modes: " + ", ".join(qs.ROUND_MODES))
    typer.echo("profiles: " + ", ".join(f"qstream.compat.{p}" for p in qs.compat.PROFILES))


def number(v: float) -> int | float:
    """A type's range bound as a JSON number: an integer where it is one."""
    return int(v) if float(v).is_integer() else float(v)


def bound(v: float) -> str:
    """A type's range bound as written: an integer in full (-2147483648, not -2.14748e+09),
    a float to its significant digits (448, 57344, 6)."""
    return str(int(v)) if float(v).is_integer() else f"{v:g}"


@examples("qstream version\nqstream version --json")
def version(as_json: bool = JSON) -> None:
    """Print the qstream version (also: qstream --version)."""
    if as_json:
        import platform
        from importlib.metadata import PackageNotFoundError
        from importlib.metadata import version as installed

        found: dict[str, str | None] = {}
        for name in ("numpy", "numba", "zarr", "ml_dtypes", "typer", "rich"):
            try:
                found[name] = installed(name)
            except PackageNotFoundError:
                found[name] = None
        emit_json({"python": platform.python_version(), "dependencies": found}, {})
        return
    typer.echo(f"qstream {qs.__version__}")
