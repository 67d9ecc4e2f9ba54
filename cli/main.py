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

import sys
from typing import Any

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


def build_app(only: str | None = None) -> typer.Typer:
    """The ``qstream`` app with :data:`COMMANDS`, each with its examples (``only``: with the
    command of that name alone, see :func:`app_for`)."""
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
        if only is None or command_name(command) == only:
            app.command(cls=Command, epilog=EXAMPLES[command])(command)
    return app


def command_name(command: Any) -> str:
    """The name the command line calls ``command`` by (``warm_up`` -> ``warm-up``)."""
    return typer.main.get_command_name(command.__name__)


def app_for(argv: list[str]) -> typer.Typer:
    """The app that runs the command line ``argv``: when it names a command (its first word
    that is not an option: the group's options take no value), an app with that command
    alone, whose help, parsing and errors are the whole app's for it; else :data:`app`.
    Typer turns every command of an app into a Click command each run (inspecting its
    signature and annotations): ~5 ms for the nine, 1.5 ms for one."""
    word = next((a for a in argv if not a.startswith("-")), None)
    if word in {command_name(c) for c in COMMANDS} and "--" not in argv[: argv.index(word)]:
        return build_app(only=word)
    return app


app = build_app()


def main() -> None:  # pragma: no cover - console entry point
    """Run the command line of ``sys.argv``; ends with ``SystemExit`` (its exit code)."""
    import signal

    from .failures import on_sigterm, quiet_pipe, show_warnings

    signal.signal(signal.SIGTERM, on_sigterm)  # as Ctrl-C: one line, resumable, exit 143
    show_warnings()
    try:
        app_for(sys.argv[1:])()
    except BrokenPipeError:  # output cut short outside a command (help text | head)
        quiet_pipe()
        raise SystemExit(141) from None


def console() -> None:  # pragma: no cover - console entry point
    """The ``qstream`` console script (entered through :func:`cli.launch.console`, which
    imports NumPy first): :func:`main` with Python's cycle collector run rarely,
    freed memory kept for reuse and Numba's probes for BLAS and CFFI skipped
    (:func:`~cli.process.collect_rarely`, :func:`~cli.process.keep_freed_memory`,
    :func:`~cli.process.skip_numba_probes`), then the process ends at once, without
    the interpreter's teardown (:func:`~cli.process.leave`)."""
    from .process import (
        collect_rarely,
        keep_freed_memory,
        leave,
        skip_numba_probes,
    )

    collect_rarely()
    keep_freed_memory()
    skip_numba_probes()
    code: object = 0
    try:
        main()
    except SystemExit as e:
        code = e.code
    leave(code)


if __name__ == "__main__":  # pragma: no cover
    console()
