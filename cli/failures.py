"""How the command line fails: one line on stderr, an exit code, and the flags a user types
instead of the library's argument names.

Exit codes: 0 success (or already complete), 1 failure while working (bad data, a corrupt
chunk, I/O), 2 bad usage or refused input (unknown option or value, missing argument, bad axis,
bad scale, whatever a command's plan refuses before any work...), 75 another qstream process
holds DST (temporary: run again
later), 130 interrupted (Ctrl-C), 143
terminated (SIGTERM: a scheduler's timeout, ``kill``), 141 a closed pipe (``| head``: quiet).
``--debug`` (anywhere on the line) shows the traceback instead.

With ``--json`` a failure also prints one JSON object on stdout, where the report would have
been: ``{"error": {"kind", "type", "message", "exit_code", "time"}, "qstream_version"}``
(``kind``: usage, invalid, refused, busy, failed, io, internal, interrupted, terminated;
``type``: the exception's class; ``time``: when it failed, ISO 8601 in UTC). A report has a
``summary``; an error object never has.
"""

from __future__ import annotations

import re
import sys
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import FrameType
from typing import TYPE_CHECKING, Any, NoReturn

import typer
import typer.core

import qstream as qs

if TYPE_CHECKING:  # Typer's own copy of Click: the classes its commands are typed with
    from typer._click import Context
    from typer._click.exceptions import ClickException
else:
    # Recent Typer releases carry their own copy of Click; take its classes from Typer's
    # exports.
    ClickException = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")

state = {"debug": False, "json": False}

BUSY = 75  # EX_TEMPFAIL: another qstream process holds DST; the same command succeeds later


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread as Ctrl-C is: work stops as it does for Ctrl-C
    (what finished stays, the same command resumes)."""


def on_sigterm(signum: int, frame: FrameType | None) -> None:
    """The SIGTERM handler: raise :class:`Terminated` in the main thread."""
    raise Terminated()


def quiet_pipe() -> None:
    """stdout's reader is gone (``qstream inspect ... | head``): send what is left to
    /dev/null, so that exiting does not fail on it too."""
    import os

    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), sys.stdout.fileno())


# library wording -> command-line wording, applied in order
_FLAGS = (
    (re.compile(r"\boverwrite=True\b"), "--overwrite"),
    (re.compile(r"\bresume=False\b"), "--overwrite"),
    (re.compile(r"\bunknown method '"), "unknown --method '"),
    (re.compile(r"\bmethod '(\w+)' needs\b"), r"--method \1 needs"),
    (re.compile(r"\bzero_point is given without scale\b"), "--zero-point needs --scale"),
    (re.compile(r"\bzero_point (-?\d+) is outside\b"), r"--zero-point \1 is outside"),
    (re.compile(r"\bunknown quantized type '"), "unknown --dtype '"),
    (re.compile(r"\baxis (-?\d+) is out of range\b"), r"--axis \1 is out of range"),
    (re.compile(r"^scale must be finite and > 0, got"), "--scale must be finite and > 0, got"),
    (
        re.compile(r"\b(block_size|round_mode|nan_policy|max_memory|max_shard_size|scale_dtype)\b"),
        None,
    ),
    (
        re.compile(r", or pass allow_incomplete=True to read the finished tensors"),
        " (qstream inspect lists the tensors it finished)",
    ),
    (re.compile(r"\bqstream\.convert_checkpoint\b"), "`qstream convert`"),
    (re.compile(r"\bqstream\.dequantize_store\b"), "`qstream dequantize`"),
    (re.compile(r"\bqstream\.quantize_store\b"), "`qstream quantize`"),
    (re.compile(r"\bqstream\.export_safetensors\b"), "`qstream export`"),
)


def show_warnings() -> None:
    """qstream's warnings as one ``warning:`` line each on stderr (not Python's
    ``file:line: Category`` form)."""
    import warnings

    default = warnings.showwarning

    def show(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: Any = None,
        line: str | None = None,
    ) -> None:
        if issubclass(category, qs.QStreamWarning):
            typer.echo(f"warning: {message}", err=True)
        else:
            default(message, category, filename, lineno, file, line)

    warnings.showwarning = show


# arguments no recipe has: mapped in every message (a recipe's keep their names)
_ARGUMENT_FLAGS = (
    (re.compile(r"\bnan_policy='(\w+)'"), r"--nan-policy \1", "--nan-policy"),
    # (convert: a spec's NaN policy is a recipe's)
    (
        re.compile(r"\bUse nan_policy='(\w+)' or nan_policy='(\w+)'"),
        r'Set nan_policy = "\1" (or "\2") in a --recipe spec',
        "--recipe",
    ),
    (re.compile(r"^percentile must be\b"), "--percentile must be", "--percentile"),
    (re.compile(r"\s*\(type='[\w.]+'\)"), "", "--gguf-type"),  # (beside the flag it names)
    (re.compile(r"\btype='([\w.]+)'"), r"--gguf-type \1", "--gguf-type"),
    (re.compile(r"\bformat='([\w-]+)'"), r"--format \1", "--format"),
    (re.compile(r"\bconfig="), "--config", "--config"),
    (re.compile(r"\bmax_memory\b"), "--max-memory", "--max-memory"),
    (re.compile(r"\bmax_shard_size\b"), "--max-shard-size", "--max-shard-size"),
)


def command_flags() -> set[str] | None:
    """The options of the command being run (None outside one)."""
    import importlib

    for module in ("typer._click.globals", "click"):  # (Typer's own copy of Click, or Click)
        try:
            current = importlib.import_module(module).get_current_context
        except (ImportError, AttributeError):
            continue
        ctx = current(silent=True)
        if ctx is not None:
            return {o for p in ctx.command.params for o in [*p.opts, *p.secondary_opts]}
    return None


def cli_terms(message: str, flags: set[str] | None = None) -> str:
    """``message`` with library argument names replaced by the flags that set them, where
    the command has that flag (``flags``: its options; None: every flag); a recipe's
    messages keep their names (a recipe's own keys)."""

    def has(flag: str) -> bool:
        return flags is None or flag in flags

    for pattern, sub, needs in _ARGUMENT_FLAGS:
        if has(needs):
            message = pattern.sub(sub, message)
    if "recipe" in message:
        return message
    for pattern, repl in _FLAGS:
        if repl is None:

            def flagged(m: re.Match[str]) -> str:
                flag = "--" + m.group(1).replace("_", "-")
                return flag if has(flag) else m.group(0)

            message = pattern.sub(flagged, message)
        else:
            message = pattern.sub(repl, message)
    return message


def fail(message: str, code: int, kind: str = "failed", error: str | None = None) -> NoReturn:
    """Print ``error: message`` (one line, in command-line terms) and exit with ``code``;
    with ``--json`` the same as a JSON error object on stdout too (:func:`json_error`)."""
    message = cli_terms(message, command_flags())
    typer.echo(f"error: {message}", err=True)
    json_error(kind, message, code, error)
    raise typer.Exit(code)


def json_error(kind: str, message: str, code: int, error: str | None = None) -> None:
    """With ``--json`` on the line: the failure as one JSON object on stdout (``kind`` of
    failure, the exception's class ``error``, the message, the exit code, the time)."""
    if not state["json"]:
        return
    import json
    from datetime import UTC, datetime

    when = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    body: dict[str, Any] = {"kind": kind, "type": error or kind, "message": message}
    body.update(exit_code=code, time=when)
    typer.echo(json.dumps({"error": body, "qstream_version": qs.__version__}))


@contextmanager
def library_errors(refusals: bool = False) -> Iterator[None]:
    """Map library errors to one line and an exit code; ``refusals``: around a plan, whose
    every error (but :class:`~qstream.DestinationBusyError`) is a refused input (exit 2)."""
    try:
        yield
    except typer.Exit:
        raise
    except typer.BadParameter as e:
        fail(str(e), 2, "usage", "BadParameter")
    except Terminated:
        fail("terminated (SIGTERM); run the same command again to resume", 143, "terminated")
    except KeyboardInterrupt:
        fail("interrupted; run the same command again to resume", 130, "interrupted")
    except BrokenPipeError:
        quiet_pipe()
        raise typer.Exit(141) from None
    except Exception as e:
        if state["debug"]:
            traceback.print_exc()
        name = e.__class__.__name__
        if isinstance(e, (qs.InvalidParameterError, qs.InvalidDTypeError)):
            fail(str(e), 2, "invalid", name)
        if isinstance(e, qs.DestinationBusyError):
            fail(str(e), BUSY, "busy", name)
        if isinstance(e, qs.QStreamError) and (refusals or getattr(e, "refused", False)):
            fail(str(e), 2, "refused", name)  # (a plan's refusal: before any work)
        if isinstance(e, qs.QStreamError):
            fail(str(e), 1, "failed", name)
        if isinstance(e, OSError):
            fail(f"{name}: {e}", 1, "io", name)
        fail(f"internal error: {name}: {e} (re-run with --debug for details)", 1, "internal", name)


def _usage_line(e: Any) -> str:
    """A usage error as one line, with where to look next."""
    message = e.format_message().replace("\n", " ").rstrip(".")
    message = re.sub(
        r"Input should be a valid integer, unable to parse string as an integer",
        "not an integer",
        message,
    )
    message = re.sub(r"Input should be a valid number.*", "not a number", message)
    # (Typer before 0.29 words them as Click does)
    message = re.sub(r"'[^']*' is not a valid int(eger)?\b.*", "not an integer", message)
    message = re.sub(r"'[^']*' is not a valid float\b.*", "not a number", message)
    ctx = getattr(e, "ctx", None)
    where = ctx.command_path if ctx is not None else "qstream"
    return f"error: {message[:1].lower()}{message[1:]} (see '{where} --help')"


class Group(typer.core.TyperGroup):
    """The ``qstream`` group: usage errors as one line (exit 2), ``--debug`` and
    ``--version`` anywhere on the line, commands listed in definition order."""

    def list_commands(self, ctx: Context) -> list[str]:
        """The commands in the order they were added (``qstream --help`` lists them so)."""
        return list(self.commands)

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> int:
        """Run the command line ``args`` (default: ``sys.argv[1:]``); returns the exit code
        when not ``standalone_mode`` (else exits with it)."""
        argv = list(sys.argv[1:] if args is None else args)
        cut = argv.index("--") if "--" in argv else len(argv)
        state["debug"] = "--debug" in argv[:cut]
        state["json"] = "--json" in argv[:cut]
        if "--version" in argv[:cut]:
            typer.echo(f"qstream {qs.__version__}")
            return _end_with(0, standalone_mode)
        argv = [a for a in argv[:cut] if a != "--debug"] + argv[cut:]
        try:
            rv = super().main(
                argv,
                prog_name or "qstream",
                complete_var,
                standalone_mode=False,
                windows_expand_args=windows_expand_args,
                **extra,
            )
        except ClickException as e:
            ctx = getattr(e, "ctx", None)  # a usage error's
            if type(e).__name__ == "NoArgsIsHelpError" and ctx is not None:  # bare ``qstream``
                typer.echo(ctx.get_help())
            else:
                line = _usage_line(e)
                typer.echo(line, err=True)
                json_error("usage", line.removeprefix("error: "), e.exit_code, type(e).__name__)
            return _end_with(e.exit_code, standalone_mode)
        except typer.Abort:
            typer.echo("error: interrupted", err=True)
            json_error("interrupted", "interrupted", 130)
            return _end_with(130, standalone_mode)
        return _end_with(rv if isinstance(rv, int) else 0, standalone_mode)


def _end_with(code: int, standalone: bool) -> int:
    if standalone:
        sys.exit(code)
    return code
