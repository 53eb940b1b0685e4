"""What every command shares: the two consoles, the one error handler, the output Format, common options."""

from __future__ import annotations

import os
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console, ConsoleDimensions
from rich.markup import escape

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


class Format(str, Enum):
    """Output formats: a table for people; Markdown, CSV and JSON (complete, unstyled) for files and pipes."""

    table = "table"
    markdown = "markdown"
    csv = "csv"
    json = "json"


ConfigArg = Annotated[Path, typer.Argument(help="Sweep config (YAML), e.g. configs/llama7b.yaml.")]
RunArg = Annotated[str, typer.Argument(help="A run directory, or a run name under --results.")]
FormatOpt = Annotated[Format, typer.Option("--format", help="table (default), markdown, csv or json.")]
ResultsOpt = Annotated[Path, typer.Option("--results", help="Where run names are looked up.")]
BudgetOpt = Annotated[
    str | None, typer.Option("--budget", help="Memory budget: GiB (80) or with a unit (80GiB, 512MiB).")
]
HeadroomOpt = Annotated[
    str, typer.Option("--headroom", help="Kept free under the budget: a share of it (5%) or a size (2GiB).")
]
SeqLenOpt = Annotated[int | None, typer.Option("--seq-len", help="Only consider points of this sequence length.")]
