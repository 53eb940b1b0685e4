"""`ckptbench sweep` and `ckptbench layouts`: run a config's points; show what each layout checkpoints."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from ckptbench.cli.common import ConfigArg, OutDirOpt, ResultsRootOpt, err, fail, finite, out, warn
from ckptbench.cli.progress import SweepProgress
from ckptbench.cli.runs import Interrupts, finish, interrupted, run_paths, summarize_run
from ckptbench.errors import CkptbenchError, ConfigError, RunFailure

if TYPE_CHECKING:  # the sweep imports torch; the CLI stays fast to start
    from ckptbench.config.schema import SweepConfig
    from ckptbench.results.store import Run
    from ckptbench.sweep.sweep import SweepOutcome

_CLUSTER = "Fan-out (docs/cluster.md)"


class Executor(str, Enum):
    """Where the points run (the config's cluster.executor when not given)."""

    none = "none"
    local = "local"
    slurm = "slurm"


def _hook_notes() -> None:
    """Say so when a test-only fault hook is set: active (the switch is on) or ignored."""
    from ckptbench.measure import faults

    for name, spec in faults.active().items():
        warn(f"test hook {name}={spec} is active ({faults.ENABLE_VAR}=1): points it selects fail on purpose")
    for name in faults.ignored():
        warn(f"{name} is set but ignored: test hooks are off (they need {faults.ENABLE_VAR}=1)")


def sweep(
    config: ConfigArg,
    out_dir: OutDirOpt = None,
    results_root: ResultsRootOpt = "results",
    resume: Annotated[
        str | None,
        typer.Option("--resume", help="Finish an interrupted or failed run in RUN_DIR (same config).",
                     metavar="RUN_DIR"),
    ] = None,
    isolate: Annotated[
        bool, typer.Option("--isolate", help="Run each point in a fresh process: a crash fails one point.")
    ] = False,
    point_timeout: Annotated[
        float | None,
        typer.Option("--point-timeout", help="With --isolate: kill a point running longer than this.",
                     metavar="SECONDS", callback=finite),
    ] = None,
    predict: Annotated[
        bool,
        typer.Option("--predict/--no-predict", help="Record each point's estimated peak next to the measured one."),
    ] = True,
    executor: Annotated[
        Executor | None,
        typer.Option("--executor", help="Run each point as a submitit job: on this node's GPUs (local) or on "
                     "Slurm (slurm). Default: the config's cluster.executor (none: in this process).",
                     rich_help_panel=_CLUSTER),
    ] = None,
    gpus: Annotated[str | None, typer.Option("--gpus", help="local: GPU indices to spread points over (0,1,2,3).",
                                             rich_help_panel=_CLUSTER)] = None,
    jobs: Annotated[int | None, typer.Option("--jobs", help="local without GPUs: points at once.",
                                             rich_help_panel=_CLUSTER)] = None,
    partition: Annotated[str | None, typer.Option("--partition", help="slurm: partition.",
                                                  rich_help_panel=_CLUSTER)] = None,
    time_limit: Annotated[int | None, typer.Option("--time-limit", help="slurm: minutes per job (one point).",
                                                   metavar="MIN", rich_help_panel=_CLUSTER)] = None,
    array_parallelism: Annotated[int | None, typer.Option(
        "--array-parallelism", help="slurm: jobs running at once.", rich_help_panel=_CLUSTER)] = None,
    account: Annotated[str | None, typer.Option("--account", help="slurm: account.", rich_help_panel=_CLUSTER)] = None,
    sbatch: Annotated[list[str] | None, typer.Option(
        "--sbatch", help="slurm: extra sbatch option KEY=VALUE or FLAG (repeatable): --sbatch qos=high.",
        rich_help_panel=_CLUSTER)] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Run on a CPU even when the sweep would take hours (a 7B model).")
    ] = False,
) -> None:
    """Run a sweep: real training steps for every point of CONFIG; writes run.json and points.jsonl."""
    from ckptbench.config.cluster import with_overrides
    from ckptbench.config.load import load_config
    from ckptbench.sweep.timing import process_start_monotonic

    started = process_start_monotonic()  # run.json counts the command from the process's start
    with Interrupts() as interrupts:
        try:
            out, results, resume_dir = run_paths(out_dir, results_root, resume)
            cfg = load_config(config)  # before torch is imported: a bad config fails in a blink
            cluster = with_overrides(
                cfg.cluster, executor=executor.value if executor else None, gpus=gpus, jobs=jobs,
                partition=partition, time_min=time_limit, array_parallelism=array_parallelism, account=account,
                sbatch=sbatch,
            )
            if not force and cluster.executor != "slurm":
                _refuse_long_cpu_sweep(cfg, config)
            _hook_notes()
            from ckptbench.sweep.predictions import start_background

            # Started before torch is imported here: the estimator's imports overlap the sweep's start-up.
            predictor = start_background(cfg, predict=predict)
            from ckptbench.sweep.sweep import run_sweep

            with SweepProgress(len(cfg.points_list())) as progress:
                outcome = run_sweep(
                    cfg, out=out, results_root=results, on_progress=progress.update,
                    resume=resume_dir, isolate=isolate, point_timeout_s=point_timeout, predict=predict,
                    cluster=cluster, predictor=predictor, process_start=started,
                )
                interrupts.finishing = True  # the final status is on disk: a signal from now on is a note
        except CkptbenchError as exc:
            raise fail(exc) from None
        except KeyboardInterrupt as exc:
            raise interrupted(exc, config, signum=interrupts.signum) from None
        except (MemoryError, RuntimeError) as exc:
            # A process out of memory or threads (cpu_threads: 1024 under `ulimit -v` with --force): the machine
            # failed, not the input; run_sweep has marked the run failed, its records stay as they are.
            if isinstance(exc, RuntimeError) and "can't start new thread" not in str(exc):
                raise
            why = "ran out of memory" if isinstance(exc, MemoryError) else "could not start one more thread"
            raise fail(RunFailure(f"{config}: the sweep stopped: this process {why}; the points recorded so far "
                                  "stay on disk (fewer cpu_threads, or more memory, lets it run)")) from None
        for note in outcome.warnings:
            warn(note)
        try:
            run = summarize_run(outcome.run_dir)
        except (CkptbenchError, OSError) as exc:  # the records are on disk; only the summary is missing
            # exit 1, a run failure (a full disk), not bad input
            raise fail(RunFailure(f"{outcome.run_dir}: cannot write the summary ({_why(exc)}); the run is complete "
                                  f"on disk: ckptbench report {outcome.run_dir} once there is space")) from None
        _report(run, outcome, config)
        finish(outcome.run_dir, outcome.clock)
    if outcome.late_signal or interrupts.late:
        err.print("note: the interrupt came after the last point was recorded; the run is whole, nothing was lost",
                  soft_wrap=True)
    if outcome.failure:
        again = f"ckptbench sweep {config} --resume {outcome.run_dir}"
        raise fail(RunFailure(f"{outcome.failure}; the records are in {outcome.run_dir} (retry: {again})"))


def _refuse_long_cpu_sweep(cfg: SweepConfig, config: Path) -> None:
    """A sweep that would train for hours on this CPU (a 7B model) is refused before it starts."""
    from ckptbench.sweep.cpu_guard import REFUSE_ABOVE_S, cpu_cost

    if cfg.device == "cuda" or (cfg.device == "auto" and _cuda_available()):
        return
    cost = cpu_cost(cfg)
    if cost.seconds <= REFUSE_ABOVE_S:
        return
    raise ConfigError(
        f"{config}: {cost.points} point(s) of {cfg.model.name} on a CPU would train for at least "
        f"{_duration(cost.seconds)} (6N FLOPs per token at this host's measured {cost.rate_flops_per_s / 1e9:.0f} "
        f"GFLOP/s); `ckptbench estimate {config}` predicts its memory without a GPU in minutes; --force runs it anyway"
    )


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _duration(seconds: float) -> str:
    """'3.2 hours', '41 days'."""
    hours = seconds / 3600
    return f"{hours:.1f} hours" if hours < 48 else f"{hours / 24:,.0f} days"


def _next_steps(run: Run) -> str:
    """What to run after a sweep: the report and a recommendation under the card's memory."""
    total = run.environment.gpu_total_memory_bytes
    budget = f"{total / 2**30:.0f}" if total else "SIZE"
    where = escape(str(run.path))
    return (f"next: ckptbench report {where} --budget {budget} (report.md and plots); "
            f"ckptbench recommend {where} --budget {budget} (the fastest point that fits)")
def _why(exc: Exception) -> str:
    return (exc.strerror or str(exc)) if isinstance(exc, OSError) else str(exc)


def _report(run: Run, outcome: SweepOutcome, config: Path) -> None:
    """After a sweep: failures and resume notes on stderr, the summary table on stdout."""
    from ckptbench.render.summary import run_header, search_table, summary_table

    again = f"ckptbench sweep {escape(str(config))} --resume {escape(str(outcome.run_dir))}"
    failed = sum(1 for r in outcome.records if r.status == "error")
    if failed and not outcome.failure:  # when nothing succeeded, the error line at the end says it all
        err.print(f"[yellow]warning:[/yellow] {failed} point(s) failed (status error); retry: {again}")
    if outcome.already_done:
        err.print(f"resumed: {outcome.already_done} points were already done; {len(outcome.records)} ran now")
    warned = [r for r in outcome.records if r.warnings]
    if warned:
        kinds = ", ".join(sorted({k for r in warned for k in r.warning_kinds}))
        warn(f"{len(warned)} point(s) have timing warnings ({kinds}): their step times may mislead "
             "(the status column says which; points.jsonl has the details)")
    err.print(run_header(run), markup=False)
    out.print(summary_table(run))
    if run.meta.searches:
        out.print(search_table(run))
    err.print(f"results: {escape(str(outcome.run_dir))}")
    err.print(_next_steps(run), soft_wrap=True)


def layouts(config: ConfigArg) -> None:
    """Print exactly which decoder layers (and sub-modules) each layout of CONFIG checkpoints."""
    from ckptbench.config.load import load_config
    from ckptbench.render.layouts import layouts_table

    try:
        cfg = load_config(config)
    except CkptbenchError as exc:
        raise fail(exc) from None
    out.print(layouts_table(cfg))
