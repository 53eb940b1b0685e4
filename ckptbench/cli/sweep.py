"""`ckptbench sweep` and `ckptbench layouts`: run a config's points; show what each layout checkpoints."""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import sys
import threading
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from ckptbench.cli.common import ConfigArg, OutDirOpt, ResultsRootOpt, err, fail, finite, out, path_option, warn
from ckptbench.cli.progress import SweepProgress
from ckptbench.errors import CkptbenchError, ResultsError, RunFailure

_CLUSTER = "Fan-out (docs/cluster.md)"


class Executor(str, Enum):
    """Where the points run (the config's cluster.executor when not given)."""

    none = "none"
    local = "local"
    slurm = "slurm"


class _Interrupts:
    """Ctrl-C and SIGTERM raise KeyboardInterrupt once; later ones are ignored while the run is marked.

    Two windows need more than that:

    - A signal handled while a finalizer runs (the garbage collector, a weakref callback) raises
      KeyboardInterrupt where Python can only print and drop it ("Exception ignored in ..."), and later
      signals would be ignored. The unraisable hook catches exactly that, re-arms and sends the signal
      again a moment later, so that it lands in ordinary code.
    - Once the run has its final status (``finishing``), a signal changes nothing on disk: it is noted
      (``late``) and the summary is still written, so status, summary and exit code agree. In the real
      command (``ckptbench sweep``, not a test's CliRunner) the signals are then ignored until the
      process has exited: shutting the interpreter down takes a moment too, and Python would restore the
      default handlers for it (a signal there was exit 130 for a complete run). SIGKILL still ends it.
    """

    keep_after_exit = False  # set by cli.main.main: the process ends right after the command

    def __enter__(self) -> _Interrupts:
        self.fired = self.finishing = self.late = False
        self.signum: int = signal.SIGINT
        self.previous = {sig: signal.signal(sig, self._handle) for sig in (signal.SIGINT, signal.SIGTERM)}
        self.previous_hook = sys.unraisablehook
        sys.unraisablehook = self._unraisable
        return self

    def _handle(self, signum: int, _frame: Any) -> None:
        if self.finishing:
            self.late = True
        elif not self.fired:
            self.fired, self.signum = True, signum
            raise KeyboardInterrupt

    def _unraisable(self, info: Any) -> None:
        dropped = info.exc_type is not None and issubclass(info.exc_type, KeyboardInterrupt)
        if not (dropped and self.fired and not self.finishing):
            self.previous_hook(info)
            return
        # Not from here (we may still be inside the finalizer): from another thread, a moment later.
        self.fired = False
        again = threading.Timer(0.05, os.kill, (os.getpid(), self.signum))
        again.daemon = True
        again.start()

    def __exit__(self, *exc: object) -> None:
        sys.unraisablehook = self.previous_hook
        for sig, handler in self.previous.items():
            # SIG_IGN survives interpreter shutdown (Python resets only its own handlers to the default).
            signal.signal(sig, signal.SIG_IGN if self.finishing and self.keep_after_exit else handler)


def hold_late_signals_until_exit() -> None:
    """For the real command line: after a sweep's final status, signals stay notes until the process ends."""
    _Interrupts.keep_after_exit = True


def _paths(out_dir: str | None, results_root: str, resume: str | None) -> tuple[Path | None, Path, Path | None]:
    return (
        path_option(out_dir, option="--out"),
        path_option(results_root, option="--results") or Path("results"),
        path_option(resume, option="--resume"),
    )


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
) -> None:
    """Run a sweep: real training steps for every point of CONFIG; writes run.json and points.jsonl."""
    from ckptbench.config.cluster import with_overrides
    from ckptbench.config.load import load_config
    from ckptbench.sweep.timing import process_start_monotonic

    started = process_start_monotonic()  # run.json counts the command from the process's start
    with _Interrupts() as interrupts:
        try:
            out, results, resume_dir = _paths(out_dir, results_root, resume)
            cfg = load_config(config)  # before torch is imported: a bad config fails in a blink
            cluster = with_overrides(
                cfg.cluster, executor=executor.value if executor else None, gpus=gpus, jobs=jobs,
                partition=partition, time_min=time_limit, array_parallelism=array_parallelism, account=account,
                sbatch=sbatch,
            )
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
            raise _interrupted(exc, config) from None
        for note in outcome.warnings:
            warn(note)
        try:
            run = _write_summaries(outcome.run_dir)
        except (CkptbenchError, OSError) as exc:  # the records are on disk; only the summary is missing
            raise fail(ResultsError(f"{outcome.run_dir}: cannot write the summary ({exc})")) from None
        _report(run, outcome, config)
        _finish(outcome.run_dir, outcome.clock)
    if outcome.late_signal or interrupts.late:
        err.print("note: the interrupt came after the last point was recorded; the run is whole, nothing was lost",
                  soft_wrap=True)
    if outcome.failure:
        again = f"ckptbench sweep {config} --resume {outcome.run_dir}"
        raise fail(RunFailure(f"{outcome.failure}; the records are in {outcome.run_dir} (retry: {again})"))


def _finish(run_dir: Path, clock: Any) -> None:
    """The command's last act: its whole wall time into run.json, and where it went on stderr."""
    from ckptbench.render.summary import timing_line
    from ckptbench.sweep.timing import record_command_end

    entry = record_command_end(run_dir, clock)
    if entry is not None:
        err.print(timing_line(entry), markup=False, soft_wrap=True)
    # The interpreter's teardown collects every object, more than once: with torch and transformers
    # imported it took 5 s on a busy 2-core machine (load 14), 0.6 s with the objects frozen (they
    # are skipped; modules are still cleared and atexit handlers run), so the process ends soon after
    # the wall time it recorded.
    gc.freeze()


def _report(run: Any, outcome: Any, config: Path) -> None:
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
    if run.meta.get("searches"):
        out.print(search_table(run))
    err.print(f"results: {escape(str(outcome.run_dir))}")


def _interrupted(exc: KeyboardInterrupt, config: Path) -> typer.Exit:
    """Say what is on disk after Ctrl-C/SIGTERM (and write the partial summaries); exit code 130."""
    # A SweepInterrupted once the run directory exists: it says where and how far.
    run_dir, finished, total = (getattr(exc, name, None) for name in ("run_dir", "finished", "total"))
    if run_dir is None:
        err.print("[yellow]interrupted:[/yellow] before the sweep started; no point was run, nothing was written")
        return typer.Exit(130)
    with contextlib.suppress(CkptbenchError, OSError):  # the points themselves are safe already
        _write_summaries(run_dir)
    with contextlib.suppress(Exception):  # the command's wall time is a nicety here
        _finish(run_dir, getattr(exc, "clock", None))
    err.print(
        f"[yellow]interrupted:[/yellow] {finished} of {total} points are on disk in "
        f"{escape(str(run_dir))}; finish with: ckptbench sweep {escape(str(config))} "
        f"--resume {escape(str(run_dir))}",
        soft_wrap=True,
    )
    return typer.Exit(130)


def _write_summaries(run_dir: Path) -> Any:
    """Write summary.csv/summary.md of what is on disk; returns the loaded run."""
    import warnings

    from ckptbench.render.summary import write_summaries
    from ckptbench.results.store import load_run

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a truncated last line was already reported by the sweep
        run = load_run(run_dir)
    write_summaries(run)
    return run


def layouts(config: ConfigArg) -> None:
    """Print exactly which decoder layers (and sub-modules) each layout of CONFIG checkpoints."""
    from ckptbench.config.load import load_config
    from ckptbench.render.layouts import layouts_table

    try:
        cfg = load_config(config)
    except CkptbenchError as exc:
        raise fail(exc) from None
    out.print(layouts_table(cfg))
