"""A point's predicted peak reserved memory: its process as the caching allocator sees it (setup, warm-up steps,
the measured window) and its traced requests replayed through the allocator. The replay itself needs no torch.

The process a sweep runs a point in (measure/runner.py, measure/window.py), fresh or after
``empty_cache`` (which leaves the same segments: the model and the library workspaces):

1. ``train.model.warm_device_libraries``: the cuBLAS workspaces of the main thread and of
   autograd's backward thread, and cuBLASLt's, kept for the life of the process;
2. the model's parameters and buffers, in the order the build allocates them;
3. the batch;
4. the warm-up steps: the first one creates the optimizer state inside its optimizer step; the
   losses the runner keeps are freed when the warm-up ends;
5. ``reset_peak_memory_stats``, then the measured steps: the peaks and the retries counted here.

The allocator state carries over from step to step, as on the GPU. The first request the
allocator cannot serve is the predicted out-of-memory error: which step, which segment of the
step (estimator/trace.py labels), how large a segment it tried to reserve.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Sequence
from dataclasses import dataclass

from ckptbench.config.alloc_conf import AllocatorSettings, axis_to_conf, parse_alloc_conf
from ckptbench.config.grid import Point
from ckptbench.config.schema import SweepConfig
from ckptbench.estimator.allocator import AllocatorOOM, Block, CachingAllocator, DeviceLimit
from ckptbench.estimator.event_assembly import StepEvents, assemble_step, segment_events, traced_step
from ckptbench.estimator.events import ALLOC
from ckptbench.estimator.gpus import CUBLASLT_WORKSPACE, GpuModel
from ckptbench.estimator.trace import StepTrace


@dataclass(frozen=True)
class ProcessModel:
    """What the measuring process allocates around the steps."""

    warmup_steps: int
    measured_steps: int
    workspaces: tuple[int, ...]  # kept from the start (cuBLAS, cuBLASLt)
    build: tuple[int, ...]  # parameters and buffers, in build order
    batch_bytes: int


@dataclass(frozen=True)
class OomPrediction:
    """Where the replayed allocator ran out of memory."""

    phase: str  # 'setup', 'warm-up step 1', 'measured step 2'
    segment: str  # the step segment ('logits@0', 'bwd:3@0', 'opt'), or '' outside a step
    request_bytes: int  # what it tried to reserve ("Tried to allocate" in torch's message)
    allocated_bytes: int
    reserved_bytes: int

    def to_json(self) -> dict[str, object]:
        return {
            "phase": self.phase, "segment": self.segment, "request_bytes": self.request_bytes,
            "allocated_bytes": self.allocated_bytes, "reserved_bytes": self.reserved_bytes,
        }


@dataclass(frozen=True)
class ReplayResult:
    """Peaks over the measured window (as torch.cuda.max_memory_* report them after a reset)."""

    peak_allocated_bytes: int
    peak_reserved_bytes: int
    num_alloc_retries: int  # in the measured window
    oom: OomPrediction | None

    @property
    def fragmentation_bytes(self) -> int:
        """Reserved but never allocated at the peak: peak reserved minus peak allocated."""
        return self.peak_reserved_bytes - self.peak_allocated_bytes


class _Run:
    """One replay: the allocator, the live blocks, where we are."""

    def __init__(self, settings: AllocatorSettings, limit: DeviceLimit) -> None:
        self.allocator = CachingAllocator(settings, limit)
        self.phase = "setup"

    def keep(self, sizes: Sequence[int]) -> list[Block]:
        return [self.allocator.malloc(n) for n in sizes if n > 0]

    def step(self, events: StepEvents) -> tuple[list[Block], list[Block]]:
        """Replay one step; what it leaves allocated: (optimizer state it created, the rest: the loss)."""
        alloc = self.allocator
        malloc = alloc._malloc_fast if alloc._fast else alloc.malloc  # what malloc would call, called directly
        free = alloc.free
        live: dict[int, Block] = {}
        index = 0
        try:
            for index, (op, key, nbytes) in enumerate(events.events):  # noqa: B007 (index: where it failed)
                if op == ALLOC:
                    live[key] = malloc(nbytes, 0)
                else:
                    free(live.pop(key))
        except AllocatorOOM as oom:
            raise _Stopped(self._where(events, index), oom) from None
        state = events.keys_made_in("opt")
        return [b for k, b in live.items() if k in state], [b for k, b in live.items() if k not in state]

    @staticmethod
    def _where(events: StepEvents, index: int) -> str:
        starts = [start for start, _ in events.bounds]
        at = bisect.bisect_right(starts, index) - 1
        return events.bounds[at][1] if at >= 0 else ""


class _Stopped(Exception):
    def __init__(self, segment: str, oom: AllocatorOOM) -> None:
        super().__init__(segment)
        self.segment, self.oom = segment, oom


def replay_point(
    first: StepEvents, steady: StepEvents, process: ProcessModel, settings: AllocatorSettings, limit: DeviceLimit
) -> ReplayResult:
    """Replay a point's process; the measured window's peaks, or where it runs out of memory."""
    run = _Run(settings, limit)
    stats = run.allocator.stats
    try:
        try:
            run.keep(process.workspaces)
            run.keep(process.build)
            run.keep([process.batch_bytes])
        except AllocatorOOM as failed:
            raise _Stopped("", failed) from None
        losses: list[Block] = []
        for i in range(process.warmup_steps):
            run.phase = f"warm-up step {i + 1}"
            _, returned = run.step(first if i == 0 else steady)  # the optimizer state stays
            losses += returned
        for block in losses:  # the warm-up losses, dropped when the warm-up returns
            run.allocator.free(block)
        run.allocator.reset_peak()
        retries = stats.num_alloc_retries
        before = run.allocator.large_pool_state()
        for i in range(process.measured_steps):
            run.phase = f"measured step {i + 1}"
            run.step(steady)
            after = run.allocator.large_pool_state()
            if after == before:
                # A repeat: every later step replays the same blocks in the large pool (the small pool only
                # differs by the 512-byte losses the runner keeps), so its peaks are already reached.
                break
            before = after
    except _Stopped as stop:
        oom = OomPrediction(run.phase, stop.segment, stop.oom.size, stop.oom.allocated, stop.oom.reserved)
        return ReplayResult(stats.peak_allocated, stats.peak_reserved, stats.num_alloc_retries, oom)
    return ReplayResult(stats.peak_allocated, stats.peak_reserved, stats.num_alloc_retries - retries, None)


TOKEN_BYTES = 8  # the batch: int64 token ids (train.step.make_batch)


def optimizer_steps(optim: StepTrace) -> tuple[list[tuple[int, int, int]], list[tuple[int, int, int]]]:
    """The whole model's first optimizer step (creating the state) and a later one, as (op, id, bytes)."""
    return segment_events(optim, "opt_first", exclude=optim.host), segment_events(optim, "opt")


def fast_steps(
    short: StepTrace, short_classes: Sequence[str], full_classes: Sequence[str], micro_batches: int, optim: StepTrace
) -> tuple[StepEvents, StepEvents]:
    """The first warm-up step and a later step of the full model, from a short model's trace."""
    first_opt, opt = optimizer_steps(optim)
    steady = assemble_step(short, short_classes, full_classes, micro_batches, opt)
    return steady.with_optimizer(first_opt), steady


def full_steps(trace: StepTrace, optim: StepTrace) -> tuple[StepEvents, StepEvents]:
    """The same from a trace of the whole model's step."""
    first_opt, _ = optimizer_steps(optim)
    return traced_step(trace, first_opt), traced_step(trace)


def process_model(cfg: SweepConfig, point: Point, optim: StepTrace, gpu: GpuModel) -> ProcessModel:
    """What the measuring process allocates around the steps on this card."""
    cublas = gpu.cublas_workspace_bytes(os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
    return ProcessModel(
        warmup_steps=cfg.warmup_steps,
        measured_steps=cfg.measured_steps,
        # warm_device_libraries: the main thread's and autograd's thread's cuBLAS handles, one cuBLASLt
        workspaces=(cublas, cublas, CUBLASLT_WORKSPACE),
        build=optim.build,
        batch_bytes=point.batch_size * point.seq_len * TOKEN_BYTES,
    )


def device_limit(cfg: SweepConfig, gpu: GpuModel) -> DeviceLimit:
    """The limits of a point's process: a sweep always sets the memory fraction (measure/probes.py
    CudaProbe: the cap over the card, or 1.0), which also switches garbage collection on."""
    fraction = 1.0 if cfg.memory_cap_gib is None else min(1.0, cfg.memory_cap_gib * 2**30 / gpu.total_bytes)
    return DeviceLimit(gpu.total_bytes, fraction, gpu.context_bytes)


def allocator_settings(point: Point) -> AllocatorSettings:
    """The allocator options of a point (its ``allocator`` axis value)."""
    return parse_alloc_conf(axis_to_conf(getattr(point, "allocator", "default")))


def predict_reserved(
    cfg: SweepConfig, point: Point, steps: tuple[StepEvents, StepEvents], optim: StepTrace, gpu: GpuModel
) -> ReplayResult:
    """Replay the point's process on ``gpu``: peaks of the measured window, or where it runs out."""
    first, steady = steps
    return replay_point(
        first, steady, process_model(cfg, point, optim, gpu), allocator_settings(point), device_limit(cfg, gpu)
    )
