"""How a command's ``--help`` reads: ``SRC DST`` in the usage line, arguments with their
descriptions, options with their value names and defaults, examples last.

The command modules mark each command with :func:`examples`; :mod:`cli.main` registers
them on the app with :class:`Command` and those examples as the epilog.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import typer.core

if TYPE_CHECKING:  # Typer's own copy of Click: the classes its commands are typed with
    from typer._click import Context, HelpFormatter

F = TypeVar("F", bound=Callable[..., Any])

#: command function -> its examples, one per line (the help's last section)
EXAMPLES: dict[Callable[..., Any], str] = {}


def examples(text: str) -> Callable[[F], F]:
    """Give the command the examples ``text`` (one per line) for its help; the function is
    returned unchanged."""

    def mark(fn: F) -> F:
        EXAMPLES[fn] = text
        return fn

    return mark


class Command(typer.core.TyperCommand):
    """Help that reads like a well-kept CLI: ``SRC DST`` in the usage line, arguments with
    their descriptions, options with their value names and defaults, examples last."""

    def collect_usage_pieces(self, ctx: Context) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for p in self.get_params(ctx):
            if p.param_type_name == "argument":
                name = p.metavar or (p.name or "").upper()
                pieces.append(name if p.required else f"[{name}]")
        return pieces

    def format_options(self, ctx: Context, formatter: HelpFormatter) -> None:
        args = [
            (p.metavar or (p.name or "").upper(), getattr(p, "help", None) or "")  # TyperArgument
            for p in self.get_params(ctx)
            if p.param_type_name == "argument"
        ]
        opts = [
            rec
            for p in self.get_params(ctx)
            if p.param_type_name == "option" and (rec := p.get_help_record(ctx)) is not None
        ]
        if args:
            with formatter.section("Arguments"):
                formatter.write_dl(args)
        with formatter.section("Options"):
            formatter.write_dl(opts)

    def format_epilog(self, ctx: Context, formatter: HelpFormatter) -> None:
        if self.epilog:
            with formatter.section("Examples"):
                for line in self.epilog.strip().splitlines():
                    formatter.write(" " * formatter.current_indent + line.strip() + "\n")
