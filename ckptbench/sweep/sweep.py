"""A whole sweep: check its options and the machine, build the runner (with the place for points run
apart, or the fan-out that drives it), create (or reopen) the run directory, run the points, record
each, and write how the run ended ('complete', 'failed', 'interrupted') with signals held."""

from __future__ import annotations

import contextlib
import shutil
import signal
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckptbench.config.cluster import ClusterSpec
from ckptbench.config.grid import Point
from ckptbench.config.schema import SweepConfig, check_cpu_compatible
from ckptbench.errors import ConfigError, MachineError, RunFailure
from ckptbench.estimator.gpus import GpuModel
from ckptbench.json_object import JsonObject
from ckptbench.measure import faults
from ckptbench.measure.device import current_gpu_model, make_probe, resolve_device
from ckptbench.measure.environment import collect as collect_environment
from ckptbench.measure.environment import environment_notes
from ckptbench.measure.progress import Progress
from ckptbench.measure.runner import Runner, Search
from ckptbench.processes.executors import STOP_SIGNALS
from ckptbench.processes.fanout import Fanout, attach_pool, make_fanout
from ckptbench.processes.launch import FreshProcesses
from ckptbench.processes.workdirs import remove_stale_workdirs
from ckptbench.results.meta import RunEnvironment, RunOptions, RunTiming
from ckptbench.results.record import PointRecord, Prediction
from ckptbench.results.store import RunWriter
from ckptbench.search.searches import make_searches
from ckptbench.sweep.predictions import BackgroundPredictions, choose_predictions
from ckptbench.sweep.run_dir import check_paths, start_run
from ckptbench.sweep.timing import SweepClock, timing_recorder

Timing = Callable[[list[PointRecord], str], RunTiming]


@dataclass
class SweepOutcome:
    """Where the run was written, how it ended, and what this invocation added to it."""

    run_dir: Path
    records: list[PointRecord]
    status: str
    already_done: int = 0
    warnings: list[str] = field(default_factory=list)
    failure: str | None = None  # why the run failed although every point ran (no point succeeded)
    late_signal: bool = False  # Ctrl-C/SIGTERM/SIGHUP came after the final status was written: nothing was cut
    clock: SweepClock | None = None  # this invocation's clock: record_command_end adds the command's wall time


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C, SIGTERM or SIGHUP stopped the sweep; the finished points are on disk in ``run_dir``."""

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
    predictions: Mapping[str, Prediction | None] | None = None  # by key_id: what each record keeps
    meta: JsonObject = field(default_factory=dict)  # more run.json fields as JSON (e.g. the tune options)


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
    _check_options(out=out, resume=resume, isolate=isolate or fanned, timeout_s=point_timeout_s)
    resume = check_paths(out=out, resume=resume, results_root=results_root)
    runner, fanout, environment = make_runner(cfg, isolate=isolate, timeout_s=point_timeout_s, cluster=cluster)
    points = cfg.points_list() if plan.points is None else plan.points
    options = RunOptions(
        isolate=isolate or fanned, point_timeout_s=point_timeout_s,
        **({"cluster": cluster.model_dump(mode="json")} if fanned else {}),
    )
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
        with _signals_deferred():  # a signal now arrives once the writer exists, inside this try
            writer, done, notes = start_run(
                cfg, out=out, resume=resume, results_root=results_root, environment=environment,
                options=options, num_points=len(points), meta=plan.meta,
            )
        if fanout is not None:
            attach_pool(fanout, writer.run_dir)
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
        clock.note_predictions(predictions_mode="off" if not predict else "background" if bg else "in-process")
        clock.mark("predictions")
        timing = timing_recorder(clock, writer, bg, earlier_points=len(done))
        _run_points(runner, points, done, writer, on_progress, fanout=fanout, searches=searches, records=records,
                    ended=ended, clock=clock, timing=timing)
    except KeyboardInterrupt:
        if writer is None:  # before the run directory existed: nothing to mark
            raise
        if not ended:
            clock.mark("points_end")
            finished = len(done) + len(records)
            _mark_status(writer, "interrupted", finished, timing(records, "interrupted") if timing else None)
            raise SweepInterrupted(writer.run_dir, finished=finished, total=len(points), clock=clock) from None
        # after the last point and the final status: the run is what run.json says (the outcome below)
        return _outcome(writer, records, ended, done=done, notes=notes, clock=clock, late_signal=True)
    except BaseException:
        if writer is not None and not ended:
            _mark_status(writer, "failed", len(done) + len(records), timing(records, "failed") if timing else None)
        raise
    finally:
        if writer is not None:
            writer.close()
        if bg is not None:  # the one started here, or the caller's (closing twice is harmless)
            bg.close()
    notes += bg.notes() if bg is not None else []
    return _outcome(writer, records, ended, done=done, notes=notes, clock=clock)


def _check_options(*, out: Path | None, resume: Path | None, isolate: bool, timeout_s: float | None) -> None:
    """Refuse options that cannot go together, before anything is started."""
    if resume is not None and out is not None:
        raise ConfigError("--resume continues RUN_DIR in place; it cannot be combined with --out")
    if timeout_s is not None and not isolate:
        raise ConfigError("--point-timeout needs --isolate (only a point's own process can be stopped)")
    if timeout_s is not None and not timeout_s > 0:
        raise ConfigError(f"--point-timeout must be a positive number of seconds, got {timeout_s:g}")


def check_model_builds(cfg: SweepConfig) -> None:
    """ConfigError unless transformers builds the model: its own checks of the overrides (a rope_scaling it
    does not know, ...) run here on the meta device, in milliseconds and no memory, before anything runs,
    instead of failing in every point."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from ckptbench.train.model import hf_config

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # transformers' notes on the config: the error, if any, says it
    try:
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            AutoModelForCausalLM.from_config(hf_config(cfg.model))  # the family's own class
    except ConfigError:
        raise
    except Exception as exc:  # transformers raises what it raises: KeyError, AssertionError, ValueError
        why = " ".join(str(exc).split())[:200]
        raise ConfigError(
            f"model.overrides: transformers cannot build this model ({type(exc).__name__}: {why})"
        ) from None
    finally:
        hf_logging.set_verbosity(verbosity)


def make_runner(
    cfg: SweepConfig, *, isolate: bool, timeout_s: float | None, cluster: ClusterSpec | None = None
) -> tuple[Runner, Fanout | None, RunEnvironment]:
    """Check that this machine can run ``cfg`` and build the runner (with the place for the points it runs
    apart), the fan-out that drives it when the sweep fans out, and the environment; nothing is written yet."""
    if cluster is not None and cluster.executor == "slurm" and shutil.which("sbatch") is None:
        raise MachineError(
            "--executor slurm: no Slurm here (sbatch is not on PATH); run the sweep from a Slurm login node, "
            "or use --executor local"
        )
    check_model_builds(cfg)
    remove_stale_workdirs()  # what a killed sweep left in the temporary directory (SIGKILL runs no cleanup)
    if cluster is not None and cluster.executor != "none":
        fanout, environment = make_fanout(cfg, cluster, timeout_s=timeout_s)
        return fanout.runner, fanout, environment
    device = resolve_device(cfg)
    if device.type == "cpu":
        try:
            check_cpu_compatible(cfg)
        except ValueError as exc:
            raise ConfigError(f"{exc} (device {cfg.device!r} runs on the CPU here)") from None
    environment = collect_environment(device.type, cpu_threads=cfg.cpu_threads)
    probe = make_probe(cfg, device)
    hooks = faults.active()  # a run measured with fault hooks says so for good
    environment = environment.model_copy(update={"probe": probe.kind, **({"test_hooks": hooks} if hooks else {})})
    gpu_name = environment.gpu_name
    place = FreshProcesses(cfg, gpu_name, timeout_s=timeout_s)  # a timeout comes with --isolate (_check_options)
    return Runner(cfg, device, probe, gpu_name, place=place, isolate=isolate), None, environment


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
    fanout: Fanout | None,
    searches: list[Search],
    records: list[PointRecord],
    ended: list[str],
    clock: SweepClock,
    timing: Timing,
) -> None:
    """Run the points ``done`` lacks (through ``fanout`` when the sweep fans out), appending each record (to
    the file and to ``records``); then write the final status and put it in ``ended``."""

    def record(event: Progress) -> None:
        if event.record is not None:
            with _signals_deferred():
                try:
                    writer.append(event.record)
                except OSError as exc:
                    why = exc.strerror or exc
                    raise RunFailure(f"{writer.run_dir}: cannot write a point record ({why})") from None
                records.append(event.record)
        if on_progress is not None:
            on_progress(event)

    for rec in done.values():  # loss references, OOM skips and search probes carry over
        if rec.point is not None:  # always: a done record names a point of this version (sweep/resume.py)
            runner.remember(rec.point, rec)
    todo = [p for p in points if p.key_id not in done]
    clock.mark("points_start")
    try:
        outcomes = (fanout.run if fanout is not None else runner.run)(todo, record, searches)
    except RunFailure as exc:
        _mark_status(writer, "failed", len(done) + len(records), timing(records, "failed"))
        raise RunFailure(f"{exc}; finished points are in {writer.run_dir} (finish with --resume)") from None
    clock.mark("points_end")
    held = [*done.values(), *records]
    failure = _no_success(held)
    t = timing(records, "failed" if failure else "complete")
    # sweep_wall_s: the points' wall time over every invocation (timing.points_s), kept for older readers.
    _finish_status(writer, held, ended, failure, searches=outcomes, timing=t.to_json(), sweep_wall_s=t.points_s)


# ---------------------------------------------------------------- how the run ended


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """Hold Ctrl-C/SIGTERM/SIGHUP while a record is appended, so a line is never half-written by us."""
    mask = getattr(signal, "pthread_sigmask", None)
    if mask is None:
        yield
        return
    old = mask(signal.SIG_BLOCK, set(STOP_SIGNALS))
    try:
        yield
    finally:
        mask(signal.SIG_SETMASK, old)


def _mark_status(writer: RunWriter, status: str, finished: int, timing: RunTiming | None) -> None:
    extra = {} if timing is None else {"timing": timing.to_json(), "sweep_wall_s": timing.points_s}
    with contextlib.suppress(OSError):  # best effort: the points themselves are already on disk
        writer.set_status(status, finished_points=finished, **extra)


def _finish_status(
    writer: RunWriter, held: list[PointRecord], ended: list[str], failure: str | None, **extra: Any
) -> None:
    """Write the final status: 'failed' when the run holds no successful point, else 'complete'."""
    status = "failed" if failure else "complete"
    writer.meta.pop("failure", None)  # a resumed run's earlier failure no longer holds
    if failure:
        extra["failure"] = failure
    with _signals_deferred():  # the status and `ended` change together: a signal finds both or neither
        try:
            writer.set_status(status, finished_points=len(held), **extra)
        except OSError as exc:  # even with the space held in reserve: the records are on disk all the same
            raise RunFailure(
                f"{writer.run_dir}: cannot write the run's final status to run.json ({exc.strerror or exc}); "
                f"its {len(held)} records are on disk (free some space and finish with --resume)"
            ) from None
        ended.append(status)


def _no_success(records: list[PointRecord]) -> str | None:
    """Why a run that holds no successful point is a failure ('12 error; the first: ...'), else None."""
    if not records or any(r.ok for r in records):
        return None
    counts: dict[str, int] = {}
    for r in records:
        counts[r.status] = counts.get(r.status, 0) + 1
    first = records[0]
    why = " ".join((first.reason or "no reason recorded").split())
    why = why if len(why) <= 160 else why[:157] + "..."
    tally = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    return f"no point succeeded ({tally}); the first {first.status}: {why}"
