"""A whole sweep: check the machine, create (or reopen) the run directory, run the points, record each."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckptbench.config.cluster import ClusterSpec
from ckptbench.config.grid import Point
from ckptbench.config.schema import SweepConfig
from ckptbench.errors import RunFailure
from ckptbench.estimate.gpus import GpuModel
from ckptbench.measure.device import current_gpu_model
from ckptbench.measure.environment import environment_notes
from ckptbench.measure.progress import Progress
from ckptbench.measure.runner import Runner, Search
from ckptbench.processes.fanout import FanoutRunner, attach_pool
from ckptbench.results.record import PointRecord
from ckptbench.results.store import RunWriter
from ckptbench.search.searches import make_searches
from ckptbench.sweep.predictions import BackgroundPredictions, choose_predictions
from ckptbench.sweep.run_dir import check_paths, start_run
from ckptbench.sweep.setup import check_options
from ckptbench.sweep.setup import make_runner as _make_runner  # the name tests patch
from ckptbench.sweep.status import finish_status, mark_status, no_success, signals_deferred
from ckptbench.sweep.timing import SweepClock, timing_recorder

Timing = Callable[[list[PointRecord], str], dict[str, Any]]


@dataclass
class SweepOutcome:
    """Where the run was written, how it ended, and what this invocation added to it."""

    run_dir: Path
    records: list[PointRecord]
    status: str
    already_done: int = 0
    warnings: list[str] = field(default_factory=list)
    failure: str | None = None  # why the run failed although every point ran (no point succeeded)
    late_signal: bool = False  # Ctrl-C/SIGTERM came after the final status was written: nothing was cut
    clock: SweepClock | None = None  # this invocation's clock: record_command_end adds the command's wall time


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM stopped the sweep; the finished points are on disk in ``run_dir``."""

    def __init__(self, run_dir: Path, *, finished: int, total: int, clock: SweepClock | None = None) -> None:
        super().__init__(f"{run_dir}: {finished} of {total} points finished")
        self.run_dir, self.finished, self.total, self.clock = run_dir, finished, total, clock


@dataclass
class SweepPlan:
    """What a sweep runs: grid points, then searches; predictions recorded next to the measurements.

    ``None`` fields come from the config (its grid, its searches, the estimator's predictions).
    """

    points: list[Point] | None = None
    searches: list[Search] | None = None
    predictions: dict[str, dict[str, Any] | None] | None = None  # by key_id: the fields each record keeps
    meta: dict[str, Any] = field(default_factory=dict)  # more run.json fields (e.g. the tune options)


def run_sweep(
    cfg: SweepConfig,
    *,
    out: Path | None = None,
    results_root: Path = Path("results"),
    on_progress: Callable[[Progress], None] | None = None,
    resume: Path | None = None,
    isolate: bool = False,
    point_timeout_s: float | None = None,
    predict: bool = True,
    cluster: ClusterSpec | None = None,
    predictor: BackgroundPredictions | None = None,
    predict_in_background: bool | None = None,
    process_start: float | None = None,
    plan: SweepPlan | None = None,
) -> SweepOutcome:
    """Run every point of ``cfg`` (or, with ``resume``, those a run lacks); each is on disk as it ends.

    ``cluster`` (default: the config's ``cluster`` section) fans the points out as submitit jobs.
    ``plan``: points, searches and predictions other than the config's (``ckptbench tune``).

    ``predictor``: a background prediction process the caller started early (closed here, used when the
    sweep runs on CUDA); ``predict_in_background``: None decides by device (sweep/predictions.py).
    ``process_start``: time.monotonic() at the command's start, so run.json counts the start-up too.
    """
    clock = SweepClock(process_start if process_start is not None else time.monotonic(), resumed=resume is not None)
    clock.mark("entry")
    try:
        return _sweep(
            cfg, clock, out=out, results_root=results_root, on_progress=on_progress, resume=resume,
            isolate=isolate, point_timeout_s=point_timeout_s, predict=predict, predictor=predictor,
            background=predict_in_background, plan=plan or SweepPlan(), cluster=cluster or cfg.cluster,
        )
    finally:
        if predictor is not None:
            predictor.close()


def _sweep(
    cfg: SweepConfig,
    clock: SweepClock,
    *,
    out: Path | None,
    results_root: Path,
    on_progress: Callable[[Progress], None] | None,
    resume: Path | None,
    isolate: bool,
    point_timeout_s: float | None,
    predict: bool,
    predictor: BackgroundPredictions | None,
    background: bool | None,
    plan: SweepPlan,
    cluster: ClusterSpec,
) -> SweepOutcome:
    """Once the run directory exists, every way out leaves run.json saying how the run ended: 'complete',
    'failed' (no point succeeded, or the sweep could not go on) or 'interrupted' (SweepInterrupted). A
    signal that arrives after the final status is written changes nothing: the outcome says it came late.
    """
    fanned = cluster.executor != "none"
    check_options(out=out, resume=resume, isolate=isolate or fanned, timeout_s=point_timeout_s)
    resume = check_paths(out=out, resume=resume, results_root=results_root)
    runner, environment = _make_runner(cfg, isolate=isolate, timeout_s=point_timeout_s, cluster=cluster)
    points = cfg.points_list() if plan.points is None else plan.points
    options: dict[str, Any] = {"isolate": isolate or fanned, "point_timeout_s": point_timeout_s}
    if fanned:
        options["cluster"] = cluster.model_dump(mode="json")
    writer: RunWriter | None = None
    done: dict[str, PointRecord] = {}
    records: list[PointRecord] = []
    ended: list[str] = []  # the final status, once it is on disk
    notes: list[str] = []
    bg: BackgroundPredictions | None = None
    timing: Timing | None = None
    # On a GPU, predictions (reserved memory) are for this card: its memory and the memory outside the allocator.
    # A fanned-out sweep's jobs choose their device (a Slurm login node has no GPU): the default card's model.
    gpu = current_gpu_model(runner.device) if predict and runner.device.type == "cuda" and not fanned else None
    try:
        with signals_deferred():  # a signal now arrives once the writer exists, inside this try
            writer, done, notes = start_run(
                cfg, out=out, resume=resume, results_root=results_root, environment=environment,
                options=options, num_points=len(points), meta=plan.meta,
            )
        if isinstance(runner, FanoutRunner):
            attach_pool(runner, writer.run_dir)
        # A new list (the loaded run's warnings stay as they are); Slurm's jobs run on other hosts: this one's
        # load says nothing of them.
        notes = [*notes, *(environment_notes(environment) if cluster.executor != "slurm" else [])]
        clock.mark("environment")
        todo = [p for p in points if p.key_id not in done]
        searches: list[Search] = [*make_searches(cfg)] if plan.searches is None else plan.searches
        if predict and plan.predictions is None and cfg.search_templates():  # search probes: each just before it runs
            predicted = _predicted_searches(cfg, runner, gpu)
            searches = predicted if plan.searches is None else searches
        if plan.predictions is not None:  # made by the caller (tune estimates every candidate first)
            runner.predictions = dict(plan.predictions)
        else:
            runner.predictions, bg, why = choose_predictions(
                cfg, todo, target=runner.device.type, predict=predict, background=background, predictor=predictor,
                gpu=gpu,
            )
            notes += why
        clock.extra["predictions_mode"] = "off" if not predict else "background" if bg else "in-process"
        clock.mark("predictions")
        timing = timing_recorder(clock, writer, bg, earlier_points=len(done))
        _run_points(runner, points, done, writer, on_progress, searches=searches, records=records, ended=ended,
                    clock=clock, timing=timing)
    except KeyboardInterrupt:
        if writer is None:  # before the run directory existed: nothing to mark
            raise
        if not ended:
            clock.mark("points_end")
            finished = len(done) + len(records)
            mark_status(writer, "interrupted", finished, timing(records, "interrupted") if timing else None)
            raise SweepInterrupted(writer.run_dir, finished=finished, total=len(points), clock=clock) from None
        # after the last point and the final status: the run is what run.json says (the outcome below)
        return _outcome(writer, records, ended, done=done, notes=notes, clock=clock, late_signal=True)
    except BaseException:
        if writer is not None and not ended:
            mark_status(writer, "failed", len(done) + len(records), timing(records, "failed") if timing else None)
        raise
    finally:
        if writer is not None:
            writer.close()
        if bg is not None:  # the one started here, or the caller's (closing twice is harmless)
            bg.close()
    notes += bg.notes() if bg is not None else []
    return _outcome(writer, records, ended, done=done, notes=notes, clock=clock)


def _outcome(
    writer: RunWriter, records: list[PointRecord], ended: list[str], *, done: dict[str, PointRecord],
    notes: list[str], clock: SweepClock, late_signal: bool = False,
) -> SweepOutcome:
    return SweepOutcome(
        writer.run_dir, records, ended[0], already_done=len(done), warnings=list(notes),
        failure=writer.meta.get("failure"), late_signal=late_signal, clock=clock,
    )


def _predicted_searches(cfg: SweepConfig, runner: Runner, gpu: GpuModel | None) -> list[Search]:
    """Searches whose probes carry predictions (one estimator for the sweep: a shape traced for one probe
    serves the next); on a GPU they also start from the predicted boundary."""
    from ckptbench.search.predict import SearchPredictor

    predictor = SearchPredictor(cfg, gpu)
    runner.predict = predictor.record
    return [*make_searches(cfg, predict=predictor if gpu is not None else None)]


def _run_points(
    runner: Runner,
    points: list[Point],
    done: dict[str, PointRecord],
    writer: RunWriter,
    on_progress: Callable[[Progress], None] | None,
    *,
    searches: list[Search],
    records: list[PointRecord],
    ended: list[str],
    clock: SweepClock,
    timing: Timing,
) -> None:
    """Run the points ``done`` lacks, appending each record (to the file and to ``records``); then write
    the final status and put it in ``ended``."""

    def record(event: Progress) -> None:
        if event.record is not None:
            with signals_deferred():
                try:
                    writer.append(event.record)
                except OSError as exc:
                    why = exc.strerror or exc
                    raise RunFailure(f"{writer.run_dir}: cannot write a point record ({why})") from None
                records.append(event.record)
        if on_progress is not None:
            on_progress(event)

    for rec in done.values():  # loss references, OOM skips and search probes carry over
        runner.remember(Point.from_key(rec.key), rec)
    todo = [p for p in points if p.key_id not in done]
    clock.mark("points_start")
    try:
        outcomes = runner.run(todo, record, searches)
    except RunFailure as exc:
        mark_status(writer, "failed", len(done) + len(records), timing(records, "failed"))
        raise RunFailure(f"{exc}; finished points are in {writer.run_dir} (finish with --resume)") from None
    clock.mark("points_end")
    held = [*done.values(), *records]
    failure = no_success(held)
    t = timing(records, "failed" if failure else "complete")
    # sweep_wall_s: the points' wall time over every invocation (timing.points_s), kept for older readers.
    finish_status(writer, held, ended, failure, searches=outcomes, timing=t, sweep_wall_s=t["points_s"])
