"""submitit executors for fanned-out sweeps: which jobs can start now, and starting them.

``local`` (submitit's LocalExecutor) starts each job as a process on this node. It does not spread
jobs over GPUs by itself (every job would see GPU 0), so a pool of free GPU indices is kept here and
each job is pinned to its own through ``visible_gpus`` (submitit then sets CUDA_VISIBLE_DEVICES);
without GPUs a number of CPU slots stands in. ``slurm`` (submitit's SlurmExecutor) submits the jobs
that are ready together as one job array per GPU count, at most ``array_parallelism`` in flight.

Either way a job is ``processes.job.run_point_job``: it runs the point in fresh processes
(processes/launch.py) on its node and returns the record; the sweep's process stays the only writer of
``points.jsonl``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Protocol

from ckptbench.config.cluster import SlurmSpec
from ckptbench.processes import fresh
from ckptbench.processes.outcome import JobResult
from ckptbench.processes.request import PointRequest

if TYPE_CHECKING:  # only a fanned-out sweep imports submitit: a plain sweep runs where it is not installed
    import submitit

JobFunction = Callable[..., JobResult]


@dataclass
class Submitted:
    """A job in flight, and the GPUs (or CPU slots) it holds until it ends."""

    job: submitit.Job[JobResult]
    slots: tuple[int, ...] = ()


@dataclass(frozen=True)
class Request:
    """One point to start: its request for the point process, and how many ranks (GPUs) it needs."""

    request: PointRequest
    world_size: int = 1


class Pool(Protocol):
    """What the fan-out loop asks of an executor."""

    kind: str
    poll_s: float  # how often the fan-out loop looks for finished jobs

    def never_fits(self, world_size: int) -> str | None: ...
    def can_start(self, world_size: int, before: Sequence[int] = ()) -> bool: ...
    def submit(self, fn: JobFunction, batch: list[Request], timeout_s: float | None) -> list[Submitted]: ...
    def release(self, done: Submitted) -> None: ...


# The signals that stop a sweep (cli/runs.py Interrupts): held while a local job starts, acted on after.
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


@contextlib.contextmanager
def _interrupts_not_inherited() -> Iterator[None]:
    """Start submitit's local controller (and through it the job) with Ctrl-C blocked: a terminal's Ctrl-C reaches
    the whole process group, and each controller printed KeyboardInterrupt tracebacks (four for two jobs). The
    sweep handles Ctrl-C alone; its jobs end when it is gone (run_point_job's watch_pid).

    SIGINT is blocked in this thread, not ignored: a blocked signal stays blocked in the processes started now
    (the mask is inherited across fork and exec), while one ignored here was lost to this process too (issue 35:
    a Ctrl-C during a submit left the sweep running to 'complete', exit 0). A stop signal that arrives meanwhile
    is held and raised again once the job has started, so the sweep acts on it after the submit."""
    if threading.current_thread() is not threading.main_thread():  # signal handlers are the main thread's
        yield
        return
    held: list[int] = []

    def hold(signum: int, _frame: FrameType | None) -> None:
        held.append(signum)

    previous = {sig: signal.signal(sig, hold) for sig in STOP_SIGNALS}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        # The handlers first: a SIGINT pending on this thread is delivered when the mask is restored, to them.
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)  # None: set outside Python
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        if held:
            signal.raise_signal(held[0])


@dataclass
class LocalPool:
    """Jobs on this node, each pinned to free GPUs (or, without GPUs, to free CPU slots)."""

    folder: Path
    gpus: list[int]  # GPU indices to spread over; empty: CPU slots instead
    cpu_slots: int = 1
    timeout_min: int = 24 * 60
    kind: str = "local"
    poll_s: float = 0.2
    _free: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        import submitit  # only a fanned-out sweep needs it: a plain sweep runs where it is not installed

        self.executor = submitit.LocalExecutor(folder=self.folder)
        self._free = list(self.gpus) if self.gpus else list(range(self.cpu_slots))
        self._total = len(self._free)

    def _need(self, world_size: int) -> int:
        # CPU ranks share the cores: a sharded CPU point takes all slots at most, never waits forever.
        return world_size if self.gpus else min(world_size, self._total)

    def never_fits(self, world_size: int) -> str | None:
        if self.gpus and world_size > self._total:
            return f"needs {world_size} GPUs; --executor local has {self._total} ({','.join(map(str, self.gpus))})"
        return None

    def can_start(self, world_size: int, before: Sequence[int] = ()) -> bool:
        """Whether a job of ``world_size`` ranks fits now, after jobs of ``before`` ranks are started."""
        return self._need(world_size) + sum(self._need(w) for w in before) <= len(self._free)

    def submit(self, fn: JobFunction, batch: list[Request], timeout_s: float | None) -> list[Submitted]:
        out = []
        for item in batch:
            n = self._need(item.world_size)
            slots, self._free = tuple(self._free[:n]), self._free[n:]
            gpus = slots if self.gpus else ()
            self.executor.update_parameters(
                timeout_min=self.timeout_min, gpus_per_node=len(gpus), visible_gpus=gpus, name="ckptbench"
            )
            # The job ends when this process is gone: a local job must not outlive a killed sweep.
            with _interrupts_not_inherited():
                # The job's point is forked by this sweep's fork server (same machine): no second import of torch.
                request = item.request.model_copy(update={"forkserver": fresh.shared_address(dict(os.environ))})
                out.append(Submitted(self.executor.submit(fn, request, timeout_s, os.getpid()), slots))
        return out

    def release(self, done: Submitted) -> None:
        self._free.extend(done.slots)


def slurm_parameters(spec: SlurmSpec, *, name: str) -> dict[str, Any]:
    """SlurmExecutor parameters of a config's ``cluster.slurm`` (the GPU count is set per array)."""
    params: dict[str, Any] = {
        "job_name": f"ckptbench-{name}",
        "time": spec.time_min,
        "nodes": 1,
        "ntasks_per_node": 1,  # one task: the job starts a point's rank processes itself
        "array_parallelism": spec.array_parallelism,
        "partition": spec.partition,
        "account": spec.account,
        "cpus_per_task": spec.cpus_per_task,
        "mem": f"{spec.mem_gb:g}GB" if spec.mem_gb else None,
        "setup": list(spec.setup) or None,
        "additional_parameters": dict(spec.sbatch) or None,
    }
    return {k: v for k, v in params.items() if v is not None}


@dataclass
class SlurmPool:
    """Jobs on Slurm: the points that are ready go out as one array per GPU count."""

    folder: Path
    spec: SlurmSpec
    name: str
    # None: submitit.SlurmExecutor (a cluster); tests pass submitit's LocalExecutor or DebugExecutor.
    make_executor: Callable[[Path], submitit.Executor] | None = None
    kind: str = "slurm"
    poll_s: float = 5.0  # a finished job's result file is looked for this often (sacct: see fanout)
    _in_flight: int = 0

    def __post_init__(self) -> None:
        if self.make_executor is None:
            import submitit  # only a fanned-out sweep needs it

            self.make_executor = submitit.SlurmExecutor
        self.executor = self.make_executor(self.folder)
        self.parameters = slurm_parameters(self.spec, name=self.name)
        self.executor.update_parameters(**self.parameters)

    def never_fits(self, world_size: int) -> str | None:
        return None  # Slurm says so itself (a job that cannot be scheduled fails)

    def can_start(self, world_size: int, before: Sequence[int] = ()) -> bool:
        return self._in_flight + len(before) < self.spec.array_parallelism

    def submit(self, fn: JobFunction, batch: list[Request], timeout_s: float | None) -> list[Submitted]:
        by_world: dict[int, list[Request]] = {}
        for item in batch:
            by_world.setdefault(item.world_size, []).append(item)
        out = []
        for world, items in by_world.items():
            self.executor.update_parameters(gpus_per_node=world)
            with self.executor.batch():  # one array: '#SBATCH --array=0-N%P'
                jobs = [self.executor.submit(fn, item.request, timeout_s) for item in items]
            out += [Submitted(job) for job in jobs]
        self._in_flight += len(out)
        return out

    def release(self, done: Submitted) -> None:
        self._in_flight -= 1


def cancel(jobs: list[Submitted]) -> None:
    """Cancel jobs in flight (Ctrl-C): Slurm's scancel, or an interrupt to a local job's process."""
    for sub in jobs:
        with contextlib.suppress(Exception):  # best effort: a job may have ended meanwhile
            sub.job.cancel(check=False)
