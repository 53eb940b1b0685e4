"""`ckptbench sweep` and `ckptbench layouts`: run a config's points; show what each layout checkpoints."""

from __future__ import annotations

import contextlib
import gc
import signal
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from ckptbench.cli.common import ConfigArg, err, fail, out, warn
from ckptbench.cli.progress import SweepProgress
from ckptbench.errors import CkptbenchError


class _Interrupts:
    """Ctrl-C and SIGTERM raise KeyboardInterrupt once; later ones are ignored while the run is marked."""

    def __enter__(self) -> _Interrupts:
        self.fired = False
        self.previous = {sig: signal.signal(sig, self._handle) for sig in (signal.SIGINT, signal.SIGTERM)}
        return self

    def _handle(self, *_: Any) -> None:
        if not self.fired:
            self.fired = True
            raise KeyboardInterrupt

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


def sweep(
    config: ConfigArg,
    out_dir: Annotated[
        Path | None,
        typer.Option("--out", metavar="RUN_DIR", help="Run directory (default results/<name>-<timestamp>)."),
    ] = None,
    results_root: Annotated[
        Path, typer.Option("--results", metavar="DIR", help="Folder for new run directories.")
    ] = Path(
        "results"
    ),
    resume: Annotated[
        Path | None,
        typer.Option("--resume", help="Finish an interrupted or failed run in RUN_DIR (same config).",
                     metavar="RUN_DIR"),
    ] = None,
    isolate: Annotated[
        bool, typer.Option("--isolate", help="Run each point in a fresh process: a crash fails one point.")
    ] = False,
    point_timeout: Annotated[
        float | None,
        typer.Option("--point-timeout", help="With --isolate: kill a point running longer than this.",
                     metavar="SECONDS"),
    ] = None,
    predict: Annotated[
        bool,
        typer.Option("--predict/--no-predict", help="Record each point's estimated peak next to the measured one."),
    ] = True,
) -> None:
    """Run a sweep: real training steps for every point of CONFIG; writes run.json and points.jsonl."""
    from ckptbench.bench.timing import process_start_monotonic
    from ckptbench.config.load import load_config

    started = process_start_monotonic()  # run.json counts the command from the process's start
    with _Interrupts():
        try:
            cfg = load_config(config)  # before torch is imported: a bad config fails in a blink
            from ckptbench.bench.predictions import start_background

            # Started before torch is imported here: the estimator's imports overlap the sweep's start-up.
            predictor = start_background(cfg, predict=predict)
            from ckptbench.bench.sweep import run_sweep

            with SweepProgress(len(cfg.points_list())) as progress:
                outcome = run_sweep(
                    cfg, out=out_dir, results_root=results_root, on_progress=progress.update,
                    resume=resume, isolate=isolate, point_timeout_s=point_timeout, predict=predict,
                    predictor=predictor, process_start=started,
                )
        except CkptbenchError as exc:
            raise fail(exc) from None
        except KeyboardInterrupt as exc:
            raise _interrupted(exc, config) from None
        for note in outcome.warnings:
            warn(note)
        run = _write_summaries(outcome.run_dir)
    _report(run, outcome, config)
    _finish(outcome.run_dir, outcome.clock)


def _finish(run_dir: Path, clock: Any) -> None:
    """The command's last act: its whole wall time into run.json, and where it went on stderr."""
    from ckptbench.bench.timing import record_command_end
    from ckptbench.render.summary import timing_line

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
    if failed:
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
        err.print("[yellow]interrupted:[/yellow] before the sweep started; no point was run")
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
