"""Start one point's process(es) and collect what they wrote: the runner's place for points measured
apart (``--isolate``, sharded points, a search's boundary, a point with its own allocator settings) and
what a fanned-out job runs.

A point runs in a process of its own that does what ``python -m ckptbench.processes.point_process
REQUEST.json`` does (see that module), forked from a fork server that has the imports done
(processes/fresh.py). The launcher writes the request, starts the process in its own session (a
terminal's Ctrl-C reaches the sweep only, which then ends the child), waits for it, enforces the
start and ``--point-timeout`` deadlines, and turns a process that dies, hangs or exits without a
record into a failure description with the tail of its stderr.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ckptbench.config.alloc_conf import axis_to_conf
from ckptbench.config.grid import Point
from ckptbench.config.parallel import parse_parallel
from ckptbench.config.schema import SweepConfig
from ckptbench.measure.environment import available_cpus, with_host_state
from ckptbench.processes import fresh
from ckptbench.processes.fresh import Child
from ckptbench.processes.outcome import Outcome, ProcessFailure
from ckptbench.processes.ranks import merge_ranks
from ckptbench.processes.request import PointRequest
from ckptbench.processes.workdirs import workdir
from ckptbench.results.record import PREDICTION_FIELDS, PointRecord

# Allowance for a point process to start (imports, CUDA context) before --point-timeout applies.
START_TIMEOUT_S = 300.0
STDERR_TAIL_CHARS = 4000
# After one rank of a sharded point exits, how long the others may take to finish before they are killed.
RANKS_GRACE_S = 60.0
_POLL_S = 0.1


@dataclass(frozen=True)
class FreshProcesses:
    """The runner's place for points measured apart (measure/runner.py ``Place``): each point in a fresh
    process on this machine, one per rank of a sharded point."""

    cfg: SweepConfig
    gpu_name: str | None = None
    timeout_s: float | None = None  # --point-timeout: from when the point's process is ready

    def measure(self, point: Point, base: PointRecord, *, known: Sequence[PointRecord]) -> PointRecord:
        """Run a point in a fresh process: its record (an error record if it failed)."""
        request = point_request(self.cfg, point, gpu_name=self.gpu_name, known=known)
        with workdir("point") as tmp:
            outcome = run_child(request, workdir=Path(tmp), timeout_s=self.timeout_s)
        return child_record(base, outcome)


def point_request(
    cfg: SweepConfig, point: Point, *, gpu_name: str | None, known: Sequence[PointRecord]
) -> PointRequest:
    """What a point's own process needs: the config, the point, and the records it learns from (loss
    references, OOMs) of the points before it."""
    return PointRequest(
        config=cfg.model_dump(mode="json"), key=point.key, gpu_name=gpu_name, done=list(known), parent_pid=os.getpid()
    )


# What only the sweep's process knows of a point: the predictions made before the run, whether a search
# proposed it. A child's record carries them over from the base record.
PARENT_FIELDS = (*PREDICTION_FIELDS, "search")
ALLOC_CONF_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


def child_record(base: PointRecord, outcome: Outcome) -> PointRecord:
    """A point's record from what its process left (its record, or a failure on top of ``base``), with this
    process's predictions, marked as measured in a fresh process."""
    if isinstance(outcome, ProcessFailure):
        record = base.updated(**outcome.fields(), status="error")
    else:
        given = base.given()
        record = outcome.updated(**{k: given[k] for k in PARENT_FIELDS if given.get(k) is not None})
    # Not fatal: the next point gets a fresh process and CUDA context.
    return record.without("fatal").updated(
        process="fresh", points_before=0, allocator_conf=base.allocator_conf, isolated=True
    )


def run_child(request: PointRequest, *, workdir: Path, timeout_s: float | None) -> Outcome:
    """Run one point in a child process, or in one process per rank for a sharded point: its record
    (ranks merged), or why it has none.

    The point's ``allocator`` setting configures the caching allocator in its processes: torch reads it
    once, when CUDA starts, so it can only be set for a new process (torch 2.9+ reads PYTORCH_ALLOC_CONF
    first, older ones PYTORCH_CUDA_ALLOC_CONF: both are set).
    """
    ranks = _ranks(request)
    request_path = workdir / "request.json"
    request.model_copy(update={"result": str(workdir / "result.json"), "ready": str(workdir / "ready")}).write(
        request_path
    )
    env = dict(os.environ)
    alloc_conf = axis_to_conf(str(request.key.get("allocator", "default")))
    if alloc_conf:
        env.update(dict.fromkeys(ALLOC_CONF_VARS, alloc_conf))
    env["PYTHONPATH"] = fresh.python_path(env)
    port = _free_port() if ranks != [None] else 0
    procs: list[Child] = []
    try:
        for rank in ranks:
            env_rank = {**env, **_rank_env(rank, len(ranks), port)}
            procs.append(fresh.start(request_path, env=env_rank, stderr_path=_stderr_path(workdir, rank),
                                     via=request.forkserver))
        problem = _wait(procs, ready=workdir / "ready", timeout_s=timeout_s)
    finally:
        for proc in procs:
            _kill(proc)
    results = [_collect(workdir, rank, proc, problem) for rank, proc in zip(ranks, procs, strict=False)]
    if ranks == [None]:
        return _judge_host(results[0])
    return _judge_host(merge_ranks(results)) if results else ProcessFailure("no rank process could be started")


def _judge_host(outcome: Outcome) -> Outcome:
    """The host's load and warnings as the point ends, judged here, where its processes ran: the ranks'
    own judgments are replaced (the spread warning belongs to the point's merged step times)."""
    if isinstance(outcome, ProcessFailure):
        return outcome
    return with_host_state(outcome.without("warnings", "load_average_1m"), cpus=available_cpus())


def result_path(base: str | Path, rank: int | None) -> Path:
    """Where a point process writes its record: ``result.json``, or ``result.rank<R>.json`` for a rank."""
    path = Path(base)
    return path if rank is None else path.with_name(f"{path.stem}.rank{rank}{path.suffix}")


def _ranks(request: PointRequest) -> list[int | None]:
    """[None] for a single-device point; the ranks 0..N-1 of a sharded one (even a world of one)."""
    spec = parse_parallel(str(request.key.get("parallel", "none")))
    return list(range(spec.world_size)) if spec.distributed else [None]


def _rank_env(rank: int | None, world: int, port: int) -> dict[str, str]:
    """torchrun's environment for the env:// rendezvous (one node: local rank = rank)."""
    if rank is None:
        return {}
    return {
        "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world),
        "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
    }


def _free_port() -> int:
    """A TCP port nobody listens on now (rank 0 opens the rendezvous store on it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _stderr_path(workdir: Path, rank: int | None) -> Path:
    return workdir / ("stderr.txt" if rank is None else f"stderr.rank{rank}.txt")


def _collect(workdir: Path, rank: int | None, proc: Child, problem: str | None) -> Outcome:
    """A process's record, or why it has none (with the tail of its stderr)."""
    path = result_path(workdir / "result.json", rank)
    if path.exists():  # written atomically: complete whenever it exists
        return PointRecord.model_validate_json(path.read_bytes())  # as this ckptbench wrote it: checked as such
    tail = _tail(_stderr_path(workdir, rank))
    what = problem or _exit_text(proc.returncode)
    last = " | ".join(line.strip() for line in tail.splitlines()[-3:] if line.strip())
    reason = f"{what}; stderr: {last[-300:]}" if last else f"{what}; no stderr output"
    return ProcessFailure(reason, stderr_tail=tail, exit_code=proc.returncode)


def _wait(procs: list[Child], *, ready: Path, timeout_s: float | None) -> str | None:
    """Wait for the point's processes; a text saying why they were stopped, or None when all exited.

    Once one rank has exited, the others get RANKS_GRACE_S to follow: a rank that died leaves the
    rest waiting in a collective, as torchrun would not wait for them either.
    """
    start_deadline = time.monotonic() + START_TIMEOUT_S
    deadline: float | None = None
    first_exit: float | None = None
    while True:
        time.sleep(_POLL_S)
        codes = [proc.poll() for proc in procs]
        if all(code is not None for code in codes):
            return None
        now = time.monotonic()
        if first_exit is None and any(code is not None for code in codes):
            first_exit = now
        if first_exit is not None and now > first_exit + RANKS_GRACE_S:
            return f"another rank exited and this one was stopped {RANKS_GRACE_S:g} s later"
        if deadline is None and ready.exists():
            deadline = now + timeout_s if timeout_s is not None else float("inf")
        if deadline is None and now > start_deadline:
            return f"the point process did not start within {START_TIMEOUT_S:g} s and was killed"
        if deadline is not None and now > deadline:
            return f"timed out after {timeout_s:g} s (--point-timeout) and was killed"


def _kill(proc: Child) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: also ends anything it started
        with contextlib.suppress(ProcessLookupError):
            # A forked child may not have made its session yet (processes/fresh.py): the group above is then
            # not its own, so end the process itself too.
            os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def _exit_text(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"the point process was killed by {name}"
    if code == 0:
        return "the point process exited without writing a result"
    return f"the point process exited with code {code}"


def _tail(path: Path) -> str:
    try:
        data = path.read_bytes()[-STDERR_TAIL_CHARS:]
    except OSError:
        return ""
    return data.decode("utf-8", errors="replace").strip()
