"""The ``qstream`` command line: the Typer app, its commands in order, and :func:`main`, the
console script. It parses, shows progress and maps errors to exit codes; all numeric and
storage work is the library's.

One module per command group (:mod:`~cli.quantize`, :mod:`~cli.calibrate`,
:mod:`~cli.inspect`, :mod:`~cli.convert`, :mod:`~cli.export`,
:mod:`~cli.warmup`, :mod:`~cli.about`); :mod:`cli.failures` for how it
fails, :mod:`cli.output` and :mod:`cli.show` for what it prints.

Heavy imports happen inside commands, so ``qstream --help`` stays fast.
"""

from __future__ import annotations

import typer

from .about import info, version
from .calibrate import calibrate
from .convert import convert
from .export import export
from .failures import Group
from .helptext import EXAMPLES, Command
from .inspect import inspect
from .quantize import dequantize, quantize
from .warmup import warm_up

#: the commands, in the order ``qstream --help`` lists them
COMMANDS = (quantize, dequantize, calibrate, inspect, convert, export, warm_up, info, version)


def global_options(
    debug: bool = typer.Option(False, "--debug", help="Show the traceback of an error."),
    version: bool = typer.Option(False, "--version", help="Print the version and exit."),
) -> None:
    """Exact quantization and dequantization of arrays that do not fit in memory."""
    # Both are acted on by Group.main, anywhere on the line; declared here for the help.


def build_app() -> typer.Typer:
    """The ``qstream`` app with :data:`COMMANDS`, each with its examples."""
    app = typer.Typer(
        name="qstream",
        cls=Group,
        help="Exact quantization and dequantization of arrays that do not fit in memory.",
        epilog="Run 'qstream COMMAND --help' for a command's options and examples.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
        context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    )
    app.callback()(global_options)
    for command in COMMANDS:
        app.command(cls=Command, epilog=EXAMPLES[command])(command)
    return app


app = build_app()


def main() -> None:  # pragma: no cover - console entry point
    """Run the command line of ``sys.argv``; ends with ``SystemExit`` (its exit code)."""
    import signal

    from .failures import on_sigterm, quiet_pipe, show_warnings

    signal.signal(signal.SIGTERM, on_sigterm)  # as Ctrl-C: one line, resumable, exit 143
    show_warnings()
    try:
        app()
    except BrokenPipeError:  # output cut short outside a command (help text | head)
        quiet_pipe()
        raise SystemExit(141) from None


def console() -> None:  # pragma: no cover - console entry point
    """The ``qstream`` console script (entered through :func:`cli.launch.console`, which
    imports NumPy first): :func:`main` with Python's cycle collector run rarely,
    freed memory kept for reuse, Numba's probes for BLAS and CFFI skipped and its cached
    kernels loaded without its compiler's set-up (:func:`~cli.process.collect_rarely`,
    :func:`~cli.process.keep_freed_memory`, :func:`~cli.process.skip_numba_probes`,
    :func:`~cli.process.load_kernels_lean`), then the process ends at once, without
    the interpreter's teardown (:func:`~cli.process.leave`)."""
    from .process import (
        collect_rarely,
        keep_freed_memory,
        leave,
        load_kernels_lean,
        skip_numba_probes,
    )

    collect_rarely()
    keep_freed_memory()
    skip_numba_probes()
    load_kernels_lean()
    code: object = 0
    try:
        main()
    except SystemExit as e:
        code = e.code
    leave(code)


if __name__ == "__main__":  # pragma: no cover
    console()
