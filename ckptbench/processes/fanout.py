"""``sweep --executor local|slurm``: every point as its own submitit job; this process writes the records.

The sweep's runner (measure/runner.py) keeps everything a sweep in one process keeps (skips after an
out-of-memory point, loss references, predictions, the record of every finished point) and measures
nothing; the fan-out drives it, deciding as points finish which points may start (processes/schedule.py).
Each job runs ``processes.job.run_point_job`` on its node, which starts the point's processes exactly
as ``--isolate`` does and returns the record; the record is appended here as soon as it arrives.
Ctrl-C cancels the jobs in flight; finished points stay.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ckptbench.config.cluster import ClusterSpec
from ckptbench.config.grid import Point
from ckptbench.config.schema import SweepConfig, check_cpu_compatible
from ckptbench.errors import ConfigError
from ckptbench.measure.environment import collect as collect_environment
from ckptbench.measure.probes import ElsewhereProbe
from ckptbench.measure.progress import PROBES_GUESS, Progress, ProgressCounter
from ckptbench.measure.runner import Runner, Search
from ckptbench.processes.executors import LocalPool, Pool, Request, SlurmPool, Submitted, cancel
from ckptbench.processes.job import run_point_job
from ckptbench.processes.launch import child_record, point_request
from ckptbench.processes.outcome import JobResult, ProcessFailure
from ckptbench.processes.schedule import prerequisites, ready
from ckptbench.results.meta import RunEnvironment
from ckptbench.results.record import PointRecord

if TYPE_CHECKING:  # only a fanned-out sweep imports submitit
    import submitit

_FORCE_CHECK_S = 60.0
_TAIL_CHARS = 4000


@dataclass
class _Flight:
    """A point whose job runs: the job, the point, its base record and its progress index."""

    sub: Submitted
    point: Point
    base: PointRecord
    index: int


@dataclass
class Fanout:
    """Runs a sweep's points as submitit jobs, as many at once as the pool allows, through the sweep's runner."""

    runner: Runner  # its bookkeeping decides each point's base record, skips and loss references
    cluster: ClusterSpec = field(default_factory=ClusterSpec)
    timeout_s: float | None = None  # --point-timeout, enforced in each job
    pool: Pool | None = None  # attach_pool creates it once the run directory exists
    _flights: dict[str, _Flight] = field(default_factory=dict)
    _forced: float = 0.0  # when Slurm's accounting was last asked (see _collect)

    def run(
        self, points: list[Point], on_record: Callable[[Progress], None], searches: Sequence[Search] = ()
    ) -> list[dict[str, Any]]:
        """Run the grid (independent points in parallel, see processes/schedule.py), then the searches."""
        self._on_record = on_record
        self._counter = ProgressCounter(total=len(points) + PROBES_GUESS * len(searches))
        try:
            self._grid(points)
            return self._searches(searches)
        except BaseException:
            cancel([f.sub for f in self._flights.values()])
            raise
        finally:
            self.runner.close()

    def _grid(self, points: list[Point]) -> None:
        done = [r.point for r in self.runner.done.values() if r.point is not None]
        waits = prerequisites(points, done, skip_after_oom=self.runner.cfg.skip_after_oom,
                              reference_cells=self.runner.losses.reference_cells)
        by_id = {p.key_id: p for p in points}
        started: set[str] = set()
        while len(started) < len(points) or self._flights:
            finished = {k for k in started if k not in self._flights}
            todo = [by_id[k] for k in ready(waits, finished, started)]
            now = self._start(todo, search=False)
            if not now and not self._flights and len(started) < len(points):
                raise RuntimeError("fan-out: no point can start and none is running (a cycle in the waits)")
            started.update(p.key_id for p in now)
            self._collect()

    def _searches(self, searches: Sequence[Search]) -> list[dict[str, Any]]:
        """Each search one probe at a time (a probe follows from the answers before it), in parallel."""
        budget = self.runner.budget_bytes
        done = self.runner.done
        probing: dict[int, Point] = {}
        finished: set[int] = set()
        while len(finished) < len(searches):
            for i, search in enumerate(searches):
                while i not in probing and i not in finished:
                    probe = search.next_point(budget)
                    if probe is None:
                        finished.add(i)
                    elif probe.key_id in done:  # measured already (a grid point): reuse it
                        search.observe(probe, done[probe.key_id], budget)
                    elif probe.key_id in self._flights:
                        break  # another search's probe, running now
                    else:
                        self.runner.predict_probe(probe)
                        if not self._start([probe], search=True):
                            break  # no free slot now
                        probing[i] = probe
            for i, probe in list(probing.items()):
                if probe.key_id in done:
                    searches[i].observe(probe, done[probe.key_id], budget)
                    del probing[i]
            if len(finished) < len(searches):
                self._collect()
        return [s.outcome() for s in searches]

    def _start(self, points: list[Point], *, search: bool) -> list[Point]:
        """Start the points the pool has room for, in order; those started (or recorded at once)."""
        assert self.pool is not None
        started: list[Point] = []
        batch: list[Request] = []
        flights: list[tuple[Point, PointRecord, int]] = []
        for point in points:
            start = self.runner.start_point(point, allow_skip=not search, search=search)
            why = self.pool.never_fits(point.world_size)
            runs = start.skipped is None and why is None
            if runs and not self.pool.can_start(point.world_size, [r.world_size for r in batch]):
                break
            index = self._counter.next()
            self._on_record(Progress(index, self._counter.total, point))
            started.append(point)
            if start.skipped is not None or why is not None:
                record = start.skipped or self.runner.finish_point(
                    point, start.base.updated(status="skipped", reason=why)
                )
                self._record(point, index, record)
                continue
            request = point_request(self.runner.cfg, point, gpu_name=self.runner.gpu_name, known=self.runner.history)
            batch.append(Request(request, point.world_size))
            flights.append((point, start.base, index))
        for sub, (point, base, index) in zip(self.pool.submit(run_point_job, batch, self.timeout_s),
                                             flights, strict=True):
            self._flights[point.key_id] = _Flight(sub, point, base, index)
        return started

    def _collect(self) -> None:
        """Wait a moment, then record every point whose job has ended."""
        assert self.pool is not None
        time.sleep(self.pool.poll_s)
        # A job that wrote its result is seen at once; one that died without a result only through
        # Slurm's accounting, which submitit asks every 10 minutes unless forced: force it each minute.
        force = time.monotonic() - self._forced > _FORCE_CHECK_S
        if force:
            self._forced = time.monotonic()
        for key, flight in list(self._flights.items()):
            if not flight.sub.job.done(force_check=force):
                continue
            force = False  # one forced query refreshes every job's state
            del self._flights[key]
            self.pool.release(flight.sub)
            result = _job_result(flight.sub.job, local=self.pool.kind == "local")
            record = child_record(flight.base, result.outcome).updated(
                executor=self.pool.kind, job_id=result.job_id or str(flight.sub.job.job_id)
            )
            self._record(flight.point, flight.index, self.runner.finish_point(flight.point, record))

    def _record(self, point: Point, index: int, record: PointRecord) -> None:
        self.runner.done[point.key_id] = record
        self._on_record(Progress(index, self._counter.total, point, record))


def make_fanout(
    cfg: SweepConfig, cluster: ClusterSpec, *, timeout_s: float | None
) -> tuple[Fanout, RunEnvironment]:
    """The fan-out of a sweep and the environment to store (nothing is started yet).

    This process measures nothing: the jobs choose their device (a Slurm login node has no GPU), so
    the device type is the one the jobs will use and each record says where its point ran.
    """
    device_type = _planned_device(cfg, cluster.executor)
    if device_type == "cpu":
        try:
            check_cpu_compatible(cfg)
        except ValueError as exc:
            raise ConfigError(f"{exc} (the jobs run on the CPU)") from None
    probe = ElsewhereProbe("cuda" if device_type == "cuda" else "cpu-tracker")
    environment = collect_environment(device_type, cpu_threads=cfg.cpu_threads).model_copy(
        update={"probe": probe.kind, "executor": cluster.executor}
    )
    runner = Runner(cfg, torch.device(device_type), probe, environment.gpu_name)
    return Fanout(runner, cluster, timeout_s), environment


def attach_pool(
    fanout: Fanout, run_dir: Path, *, make_executor: Callable[[Path], submitit.Executor] | None = None
) -> None:
    """Create the executor, with its job files (pickles, logs) under RUN_DIR/jobs. ``make_executor``
    replaces submitit's SlurmExecutor (tests run the Slurm path on submitit's local or debug executor)."""
    cluster = fanout.cluster
    folder = run_dir / "jobs"
    if cluster.executor == "slurm":
        fanout.pool = SlurmPool(folder, cluster.slurm, fanout.runner.cfg.name, make_executor)
        return
    gpus = cluster.local.gpus
    if gpus is None and fanout.runner.device.type == "cuda":
        gpus = list(range(torch.cuda.device_count()))
    fanout.pool = LocalPool(folder, gpus or [], cpu_slots=cluster.local.jobs, timeout_min=cluster.local.timeout_min)


def _planned_device(cfg: SweepConfig, executor: str) -> str:
    if cfg.device != "auto":
        return cfg.device
    if executor == "slurm":
        return "cuda"  # every job asks Slurm for its GPU(s)
    return "cuda" if torch.cuda.is_available() else "cpu"


def _job_result(job: submitit.Job[JobResult], *, local: bool) -> JobResult:
    """What the job returned, or why it returned nothing (it died, was killed or cancelled)."""
    try:
        if local and not job.paths.result_pickle.exists():
            # A local job's process has ended without a result: no shared file system to wait for
            # (submitit's result() would wait 15 s for the file first).
            raise RuntimeError(f"job {job.job_id} ended without a result (state {job.state})")
        result: JobResult = job.result()
        return result
    except Exception as exc:  # submitit: UncompletedJobError (no result), FailedJobError (it raised)
        first = next((line for line in str(exc).splitlines() if line.strip()), exc.__class__.__name__)
        try:
            tail = (job.stderr() or "")[-_TAIL_CHARS:]
        except Exception:
            tail = ""
        last = " | ".join(line.strip() for line in tail.splitlines()[-3:] if line.strip())
        reason = f"the job ended without a record ({first.strip()[:200]})"
        return JobResult(ProcessFailure(f"{reason}; stderr: {last[-300:]}" if last else reason, stderr_tail=tail))
