"""The typer application: one command per core entry point, registered here; ``main`` runs it."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from ckptbench import __version__
from ckptbench.cli.common import ClickException, err, fail, out
from ckptbench.cli.compare import compare
from ckptbench.cli.estimate import estimate
from ckptbench.cli.recommend import recommend_cmd, report_cmd
from ckptbench.cli.sweep import hold_late_signals_until_exit, layouts, sweep
from ckptbench.errors import CkptbenchError


class _OneLineErrors(TyperGroup):
    """typer's command group, except that click's errors go through the one error handler (``fail``):
    one line and exit code 2 for a bad option value, an unknown option or a missing argument."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("standalone_mode", True) is False:
            return super().main(*args, **kwargs)
        try:
            # Not standalone: click hands us its errors and exit codes instead of printing and exiting.
            code = super().main(*args, **{**kwargs, "standalone_mode": False})
        except ClickException as exc:
            if type(exc).__name__ == "NoArgsIsHelpError":  # no command given: the help was the answer
                sys.exit(getattr(exc, "exit_code", 2))
            code = fail(exc).exit_code
        sys.exit(code if isinstance(code, int) else 0)


app = typer.Typer(
    cls=_OneLineErrors,
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


def main() -> None:
    """Entry point for ``python -m ckptbench`` and the ``ckptbench`` script."""
    hold_late_signals_until_exit()  # this process ends with the command
    try:
        app()
    except CkptbenchError as exc:  # safety net: commands convert their own errors
        err.print(f"[red]error:[/red] {exc}")
        sys.exit(exc.exit_code)
