"""``qstream warm-up``: compile the common jobs' kernels into Numba's cache once per machine
or image."""

from __future__ import annotations

import os

import typer

import qstream as qs

from .failures import library_errors
from .helptext import examples
from .options import JSON, QUIET
from .output import emit_json
from .progress import progress


@examples(
    """
    qstream warm-up
    RUN qstream warm-up        (a Dockerfile line: the image starts with compiled kernels)
    """
)
def warm_up(
    processes: int | None = typer.Option(
        None, "--processes", metavar="N", help="Compile in N processes [default: the cores]."
    ),
    as_json: bool = JSON,
    quiet: bool = QUIET,
) -> None:
    """Compile the kernels of the common jobs (int8 per tensor / per channel / percentile,
    int4 and int8 groups, asymmetric uint8 and uint4, float8; their dequantize) into Numba's
    cache once, and qstream's modules into bytecode, so that no later run on this machine or
    image waits for a compiler."""
    with library_errors():
        if not (quiet or as_json):
            typer.echo("compiling the kernels of the common jobs (once per machine) ...", err=True)
        with progress("warm-up", quiet or as_json) as cb:  # (a build of a spec at a time)
            result = qs.warm_common(processes, progress=cb)
        import compileall  # (this command only: not loaded by every other)

        compileall.compile_dir(os.path.dirname(os.path.abspath(__file__)), quiet=2)
        if as_json:
            emit_json(result)
        elif not quiet:
            typer.echo(
                f"kernels of {len(result['specs'])} job kinds ready in {result['seconds']:.1f} s"
            )
