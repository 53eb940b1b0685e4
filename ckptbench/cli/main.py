"""The typer application: one command per core entry point, registered here; ``main`` runs it, ``run`` runs it as
the ``ckptbench`` process (cli/process_end.py)."""

from __future__ import annotations

import gc
import sys
from typing import Annotated, NoReturn

import typer
from rich.markup import escape

from ckptbench import __version__
from ckptbench.cli.advise import AdviseCommand, advise_cmd
from ckptbench.cli.answers import answers_cmd
from ckptbench.cli.cache import cache_cmd
from ckptbench.cli.common import Group, err, example, out
from ckptbench.cli.compare import compare
from ckptbench.cli.estimate import estimate
from ckptbench.cli.gpus import gpus_cmd
from ckptbench.cli.process_end import end_process
from ckptbench.cli.recommend import recommend_cmd, report_cmd
from ckptbench.cli.runs import hold_late_signals_until_exit
from ckptbench.cli.sweep import layouts, sweep
from ckptbench.cli.trace import trace_allocator
from ckptbench.cli.tune import tune
from ckptbench.errors import CkptbenchError
from ckptbench.estimator.collector import freeze_imports

app = typer.Typer(
    name="ckptbench",
    help="Measure what activation checkpointing costs and saves when training LLaMA-class models.",
    no_args_is_help=True,
    cls=Group,
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


app.command(**example("ckptbench sweep configs/tiny.yaml --out results/tiny"))(sweep)
app.command(**example("ckptbench layouts configs/llama7b.yaml"))(layouts)
app.command(**example("ckptbench compare results/base results/new --fail-memory 1 --fail-time 5"))(compare)
app.command("recommend", **example("ckptbench recommend results/h200-gpu-check-2/check --budget 80"))(recommend_cmd)
app.command("report", **example("ckptbench report results/h200-gpu-check-2/check --budget 80"))(report_cmd)
app.command(**example("ckptbench estimate configs/llama7b.yaml --budget 80"))(estimate)
ANSWERS_EXAMPLE = (
    "ckptbench answers results/h200-gpu-check-2/check results/h200-gpu-check-1/axes results/h200-gpu-check-1/check "
    "--out docs/answers.md"
)
app.command("answers", **example(ANSWERS_EXAMPLE))(answers_cmd)
TRACE_EXAMPLE = "ckptbench trace-allocator configs/allocator-traces.yaml --out traces"
app.command("trace-allocator", **example(TRACE_EXAMPLE))(trace_allocator)
app.command(**example("ckptbench tune configs/llama7b-tune.yaml --budget 80 --max-points 25"))(tune)
ADVISE_EXAMPLE = "ckptbench advise --model llama-7b --gpu a100-80gb --batch 2 8 --seq 2048"
app.command("advise", **{**example(ADVISE_EXAMPLE), "cls": AdviseCommand})(advise_cmd)
app.command("gpus", **example("ckptbench gpus --format markdown"))(gpus_cmd)
app.command("cache", **example("ckptbench cache clear"))(cache_cmd)


def main() -> None:
    """Entry point for ``python -m ckptbench`` and the ``ckptbench`` script."""
    hold_late_signals_until_exit()  # this process ends with the command
    freeze_imports()  # ... so what tracing imports is kept out of the collector's walks (estimator/collector.py)
    try:
        app()
    except CkptbenchError as exc:  # safety net: commands convert their own errors
        err.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True)
        sys.exit(exc.exit_code)
    finally:
        # The process ends with the command: the interpreter's teardown then collects every object, more than once,
        # which with torch, transformers and the traces loaded took 0.9 s of the thread question's 8.3 s (one core,
        # after the answer was printed). Frozen, they are skipped (modules are still cleared and atexit handlers
        # run), as a sweep's ``finish`` does. (``run``, the command line's entry, skips the teardown altogether.)
        gc.freeze()


def run() -> NoReturn:
    """The ``ckptbench`` script's and ``python -m ckptbench``'s entry: ``main``, then the process ends without the
    interpreter's teardown (cli/process_end.py). An exception other than ``SystemExit`` takes Python's own exit."""
    try:
        main()
    except SystemExit as exc:
        end_process(exc.code)
    end_process(0)
