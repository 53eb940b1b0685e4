"""What every command shares: the two consoles, the one error handler, the output Format, common options."""

from __future__ import annotations

import math
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from ckptbench.errors import EXIT_BAD_INPUT, CkptbenchError, ConfigError

# Tables go to stdout; when it is a pipe or a file, do not squeeze them into 80 columns.
out = Console(highlight=False, soft_wrap=False, width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, highlight=False)


# click's base classes, reached through typer's public BadParameter: typer >= 0.2x vendors its own click.
_MRO = {cls.__name__: cls for cls in typer.BadParameter.__mro__}
UsageError: type[Exception] = _MRO["UsageError"]
ClickException: type[Exception] = _MRO["ClickException"]


def fail(exc: CkptbenchError | Exception) -> typer.Exit:
    """Print one red line to stderr and turn the error into its exit code.

    A CkptbenchError keeps its own code; click's errors (a bad option value, an unknown option, a
    missing argument) become the same one line, exit code 2, instead of a usage box.
    """
    text = usage_line(exc) if isinstance(exc, ClickException) else str(exc)
    code = getattr(exc, "exit_code", EXIT_BAD_INPUT)
    # The message may quote user input: escape markup, no emoji codes, never wrap it.
    err.print(f"[red]error:[/red] {escape(text)}", soft_wrap=True, markup=True, emoji=False)
    return typer.Exit(code if isinstance(code, int) else EXIT_BAD_INPUT)


def usage_line(exc: Exception) -> str:
    """One line from click's error: 'compare: Invalid value for '--format': ... (see ckptbench compare --help)'."""
    message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
    message = " ".join(message.replace("Value error, ", "").split())
    ctx: Any = getattr(exc, "ctx", None)
    command = ctx.info_name if ctx is not None and ctx.parent is not None else ""  # '' for the group itself
    hint = f" (see ckptbench {command} --help)" if command else " (see ckptbench --help)"
    return f"{command}: {message}{hint}" if command else f"{message}{hint}"


def finite(value: float | None) -> float | None:
    """A typer callback: refuse nan and inf in a number option (click's ranges let them through)."""
    if value is not None and not math.isfinite(value):
        raise typer.BadParameter(f"must be a finite number, got {value}")
    return value


def path_option(value: str | None, *, option: str) -> Path | None:
    """A path given on the command line; '' is refused (Path('') would silently mean the current folder)."""
    if value is None:
        return None
    if not value.strip():
        raise ConfigError(f"{option}: an empty path; give a folder, e.g. {option} results/my-run")
    return Path(value)


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
