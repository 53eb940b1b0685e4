"""The typer application: one command per core entry point, registered here; ``main`` runs it."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from ckptbench import __version__
from ckptbench.cli.common import err, out
from ckptbench.cli.compare import compare
from ckptbench.cli.estimate import estimate
from ckptbench.cli.recommend import recommend_cmd, report_cmd
from ckptbench.cli.sweep import layouts, sweep
from ckptbench.cli.trace import trace_allocator
from ckptbench.errors import CkptbenchError

app = typer.Typer(
    name="ckptbench",
    help="Measure what activation checkpointing costs and saves when training LLaMA-class models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        out.print(f"ckptbench {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Measure what activation checkpointing costs and saves when training LLaMA-class models."""


app.command()(sweep)
app.command()(layouts)
app.command()(compare)
app.command("recommend")(recommend_cmd)
app.command("report")(report_cmd)
app.command()(estimate)
app.command("trace-allocator")(trace_allocator)


def main() -> None:
    """Entry point for ``python -m ckptbench`` and the ``ckptbench`` script."""
    try:
        app()
    except CkptbenchError as exc:  # safety net: commands convert their own errors
        err.print(f"[red]error:[/red] {exc}")
        sys.exit(exc.exit_code)
