"""What every command shares: the two consoles, the one error handler, the output Format, common options."""

from __future__ import annotations

import os
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console, ConsoleDimensions
from rich.markup import escape
from typer.core import TyperCommand, TyperGroup

from ckptbench.errors import CkptbenchError

NO_TERMINAL_WIDTH = 200  # stdout with no terminal anywhere (CI logs, files) and no COLUMNS


def _any_terminal() -> bool:
    for fd in (0, 1, 2):
        try:
            if os.get_terminal_size(fd).columns > 0:
                return True
        except (OSError, ValueError):
            continue
    return False


class _Stdout(Console):
    """stdout: as wide as ``COLUMNS`` says, else as the terminal (also when piped into ``less`` or
    ``head`` from one), else NO_TERMINAL_WIDTH. Read at every print, so tests can set COLUMNS."""

    @property
    def size(self) -> ConsoleDimensions:
        size = super().size
        columns = os.environ.get("COLUMNS", "")
        if self._width is None and not (columns.isdigit() and int(columns) > 0) and not _any_terminal():
            return ConsoleDimensions(NO_TERMINAL_WIDTH, size.height)
        return size

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        self._width, self._height = new_size


# Tables go to stdout (fitted to its width: render/tables.py); progress, warnings and errors to stderr.
out = _Stdout(highlight=False, soft_wrap=False)
err = Console(stderr=True, highlight=False)


def fail(exc: CkptbenchError) -> typer.Exit:
    """Print one red line to stderr and turn the error into its exit code."""
    # The message may quote user input: escape markup, no emoji codes, never wrap it.
    err.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True, markup=True, emoji=False)
    return typer.Exit(exc.exit_code)


def warn(text: str) -> None:
    """One yellow warning line on stderr."""
    err.print(f"[yellow]warning:[/yellow] {escape(text)}", soft_wrap=True)


def _no_flag_types(params: list[Any]) -> list[Any]:
    # typer's rich help prints '<bool>' as the type of every flag (--help included), but a flag takes
    # no value. An empty metavar is shown instead (duck-typed: typer 0.2x vendors its own click).
    for param in params:
        if getattr(param, "is_flag", False) and getattr(param, "metavar", "") is None:
            param.metavar = ""
    return params


class Command(TyperCommand):
    """A command whose --help shows no value type for flags."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _no_flag_types(super().get_params(ctx))


class Group(TyperGroup):
    """The application: --help and --version show no value type either."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _no_flag_types(super().get_params(ctx))


def example(*lines: str) -> dict[str, Any]:
    """Keyword arguments for ``app.command``: the command class and an example shown under --help."""
    text = "\n\n".join(f"  {line}" for line in lines)
    return {"cls": Command, "epilog": f"Example:\n\n{text}"}


class Format(str, Enum):
    """Output formats: a table for people; Markdown, CSV and JSON (complete, unstyled) for files and pipes."""

    table = "table"
    markdown = "markdown"
    csv = "csv"
    json = "json"


ConfigArg = Annotated[
    Path, typer.Argument(metavar="CONFIG", help="Sweep config (YAML), e.g. configs/llama7b.yaml.", show_default=False)
]
RunArg = Annotated[str, typer.Argument(metavar="RUN", help="A run directory, or a run name under --results.")]
FormatOpt = Annotated[Format, typer.Option("--format", help="table (default), markdown, csv or json.")]
ResultsOpt = Annotated[Path, typer.Option("--results", metavar="DIR", help="Where run names are looked up.")]
BudgetOpt = Annotated[
    str | None,
    typer.Option("--budget", metavar="SIZE",
                 help="Memory budget: GiB (80) or with a binary unit (80GiB, 512MiB); GB is refused as ambiguous."),
]
HeadroomOpt = Annotated[
    str, typer.Option("--headroom", metavar="PCT|SIZE",
                      help="Kept free under the budget: a share of it (5%) or a size (2GiB).")
]
SeqLenOpt = Annotated[
    int | None, typer.Option("--seq-len", metavar="N", help="Only consider points of this sequence length.")
]
