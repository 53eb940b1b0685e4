"""Facts about the machine and software a run was measured on (stored in run.json), and the host's
state while it measures: intra-op threads, load, spread of step times (warnings kept in each point)."""

from __future__ import annotations

import contextlib
import os
import platform
import socket
import statistics
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import ckptbench
from ckptbench.results.meta import RunEnvironment
from ckptbench.results.record import PointRecord

if TYPE_CHECKING:  # torch is imported only where it is used: the CLI collects facts before it loads torch
    import torch

# A point's step times are unsteady when their inter-quartile range exceeds this share of the median.
# Quiet CPU points (tiny model, one thread) spread 1-4%, GPU points under 1%; a busy 2-core machine
# gave 18-140%. Beyond 10% the median is not a number to compare at a 5% gate.
SPREAD_WARN_RATIO = 0.10


def git_sha(cwd: Path | None = None) -> str | None:
    """The ckptbench checkout's commit, or None outside a git checkout."""
    here = cwd or Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _driver_version() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


@dataclass(frozen=True)
class Placement:
    """Where a point runs: the host, and on CUDA the GPU's model and its index on the host (None on CPU)."""

    host: str
    gpu_name: str | None = None
    gpu_index: int | None = None


def placement(device: torch.device) -> Placement:
    """Where a point runs on ``device`` (the GPU's physical index: CUDA_VISIBLE_DEVICES, which pins a fanned-out
    job, is resolved)."""
    host = socket.gethostname()
    if device.type != "cuda":
        return Placement(host)
    import torch

    if not torch.cuda.is_available():  # a Slurm login node plans GPU jobs without one
        return Placement(host)
    index = device.index if device.index is not None else torch.cuda.current_device()
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    physical = visible[index] if index < len(visible) else str(index)
    # A GPU UUID in CUDA_VISIBLE_DEVICES leaves the index unknown.
    return Placement(host, torch.cuda.get_device_name(index), int(physical) if physical.isdigit() else None)


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask, which containers and taskset narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def load_average() -> float | None:
    """The host's 1-minute load average (runnable threads, ours included), or None where unknown."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def busy_warning(load: float | None, cpus: int) -> str | None:
    """A warning when more threads want to run than there are CPUs: measured times are then inflated."""
    if load is None or load <= cpus:
        return None
    return f"busy: load average {load:.1f} above the {cpus} CPUs available; step times may be inflated"


def spread_warning(step_times_s: Sequence[float]) -> str | None:
    """A warning when the measured steps' inter-quartile range is a large share of their median."""
    if len(step_times_s) < 2:
        return None
    q1, _, q3 = statistics.quantiles(step_times_s, n=4, method="inclusive")  # as PointRecord.step_time_iqr_s
    median = statistics.median(step_times_s)
    if not median or (q3 - q1) / median <= SPREAD_WARN_RATIO:
        return None
    return (
        f"spread: step times' inter-quartile range is {(q3 - q1) / median:.0%} of the median "
        f"(above {SPREAD_WARN_RATIO:.0%}); the median is unsteady"
    )


def with_host_state(record: PointRecord, *, cpus: int) -> PointRecord:
    """``record`` with the host's state as the point ended: its load, and warnings when its step times may
    mislead (none when all is well: a record carries them only when they say something)."""
    load = load_average()
    warnings = [w for w in (busy_warning(load, cpus), spread_warning(record.step_times_s)) if w]
    state = {"load_average_1m": load} if load is not None else {}
    return record.updated(**state, **({"warnings": warnings} if warnings else {}))


def environment_notes(environment: RunEnvironment) -> list[str]:
    """Warnings about the host as a sweep starts: already busy, or more threads than CPUs."""
    cpus = int(environment.cpus_available or 1)
    notes = []
    busy = busy_warning(environment.load_average_1m, cpus)
    if busy is not None:
        notes.append(f"the machine was {busy} (at the start; each point records its own)")
    threads = environment.torch_num_threads
    if environment.device_type == "cpu" and threads is not None and threads > cpus:
        notes.append(f"cpu_threads {threads} is more than the {cpus} CPUs available: threads will wait for each other")
    return notes


@contextlib.contextmanager
def intra_op_threads(device_type: str, threads: int) -> Iterator[None]:
    """Run a CPU sweep's points with ``threads`` intra-op threads (config cpu_threads), then restore."""
    import torch

    if device_type != "cpu":  # on CUDA the host only launches kernels: leave torch's default
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def collect(device_type: str, *, cpu_threads: int = 1) -> RunEnvironment:
    """Versions, host (CPUs, load, threads) and (on CUDA) GPU name, memory, driver and CUDA version."""
    import torch
    import transformers

    sha = git_sha()
    load = load_average()  # at the start of the sweep, before CUDA starts
    # Every fact is written, null where it is unknown here; the GPU's capability only where there is one.
    gpu = torch.cuda.get_device_properties(0) if device_type == "cuda" and torch.cuda.is_available() else None
    environment = RunEnvironment(
        ckptbench_version=ckptbench.__version__,
        git_sha=sha,
        hostname=socket.gethostname(),
        platform=platform.platform(),
        python=platform.python_version(),
        torch=torch.__version__,
        transformers=transformers.__version__,
        device_type=device_type,
        cpu_count=os.cpu_count(),
        cpus_available=available_cpus(),
        # The intra-op threads the points ran with: the config's cpu_threads on CPU, torch's default on CUDA.
        torch_num_threads=cpu_threads if device_type == "cpu" else torch.get_num_threads(),
        load_average_1m=load,
        gpu_name=gpu.name if gpu is not None else None,
        gpu_total_memory_bytes=int(gpu.total_memory) if gpu is not None else None,
        cuda_version=torch.version.cuda,
        driver_version=_driver_version() if gpu is not None else None,
    )
    if gpu is None:  # on CPU; or a Slurm login node, which plans GPU jobs without a GPU
        return environment
    return environment.model_copy(update={"gpu_capability": f"{gpu.major}.{gpu.minor}"})
