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

The allocator state carries over from step to step, as on the GPU. Within a step of many micro-batches (a compact
step's, or ``SKIP_FROM`` and more), once the allocator ends a micro-batch where it ended the previous one (or the one
before: double buffers), and the micro-batches left make the same requests, they would repeat it exactly: they are
skipped, their counters added (``MicroPlan``). Any other process, under the default settings, is replayed whole in
C where the C part is built (``_replay_in_c``); allocator.py's objects and general rules are the reference.
The first request the allocator cannot serve is the predicted out-of-memory error: which step, which segment of
the step (estimator/trace.py labels), how large a segment it tried to reserve.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ckptbench.config.alloc_conf import AllocatorSettings, axis_to_conf, parse_alloc_conf
from ckptbench.config.grid import Point
from ckptbench.config.schema import SweepConfig
from ckptbench.estimator import allocator
from ckptbench.estimator.allocator import AllocatorOOM, Block, CachingAllocator, DeviceLimit, default_rules
from ckptbench.estimator.event_assembly import StepEvents, assemble_step, of_trace, segment_events, traced_step
from ckptbench.estimator.events import ALLOC
from ckptbench.estimator.gpus import CUBLASLT_WORKSPACE, GpuModel
from ckptbench.estimator.step_trace import StepTrace


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
        """Allocate ``sizes`` (zero bytes: nothing), in order, for good."""
        live: dict[int, Block] = {}
        self.allocator.serve([(ALLOC, i, n) for i, n in enumerate(sizes) if n > 0], live)
        return list(live.values())

    def step(self, events: StepEvents, plan: MicroPlan | None = None) -> tuple[list[Block], list[Block]]:
        """Replay one step; what it leaves allocated: (optimizer state it created, the rest: the loss).

        With a ``plan`` (the step's micro-batches), micro-batches that would repeat the last replayed one
        exactly are skipped (``MicroPlan``): the allocator ends where the full replay would, with the same
        peaks and counters."""
        live: dict[int, Block] = {}
        position = 0
        if events.extra_micro_batches and (plan is None or not plan.starts):
            raise StreamTooShort("a compact step needs its micro-batch plan")
        if plan is not None and plan.starts:
            position = self._micro_batches(events, plan, live)
        self._replay(events, position, len(events.events), live)
        state = events.keys_made_in("opt")
        return [b for k, b in live.items() if k in state], [b for k, b in live.items() if k not in state]

    def _replay(self, events: StepEvents, begin: int, end: int, live: dict[int, Block]) -> None:
        """Replay events ``begin``..``end`` (exclusive) of a step into ``live``."""
        stream = events.events if begin == 0 and end == len(events.events) else events.events[begin:end]
        try:
            self.allocator.serve(stream, live)
        except AllocatorOOM as oom:
            assert oom.request is not None
            index = begin + stream.index(oom.request)  # an allocation failed: its key is unique in the step
            raise _Stopped(self._where(events, index), oom) from None

    def _micro_batches(self, events: StepEvents, plan: MicroPlan, live: dict[int, Block]) -> int:
        """Replay up to the end of the micro-batches, skipping repeats; the event index reached."""
        starts, n = plan.starts, len(plan.starts) - 1  # starts[n]: where the micro-batches end
        self._replay(events, 0, starts[0], live)
        history: list[tuple[tuple[Any, ...], tuple[int, ...]]] = []  # (state, counters) after each micro-batch
        m, skipped = 0, False
        while m < n:
            self._replay(events, starts[m], starts[m + 1], live)
            if not skipped and m + 1 < n:
                now = (self._state(plan, m, live), _counters(self.allocator))
                for period in (1, 2):  # a state that recurs every micro-batch, or every other (double buffers)
                    if len(history) < period or history[-period][0] != now[0] or plan.periodic_from > m - period + 1:
                        continue
                    # Micro-batch m ended where m - period did (blocks renamed on), and every later micro-batch
                    # makes the same requests: the next ones repeat the last ``period``, so only counters grow.
                    repeats = (n - 1 - m) // period
                    # A compact step (extra micro-batches, an even number) holds fewer of these repeats.
                    _add_counters(self.allocator, now[1], history[-period][1], repeats + plan.extra // period)
                    self._rename(plan, live, repeats * period)
                    m, skipped = m + repeats * period, True
                    break
                history.append(now)
            m += 1
        if plan.extra and not skipped:
            raise StreamTooShort(f"no repeat among the {n} micro-batches held of {n + plan.extra}")
        return starts[n]

    @staticmethod
    def _rename(plan: MicroPlan, live: dict[int, Block], shift: int) -> None:
        """Live blocks a later micro-batch frees, renamed to the keys ``shift`` micro-batches on."""
        moved = {}
        for key, block in live.items():
            made = plan.origin.get(key) if key in plan.freed else None
            if made is None:
                moved[key] = block
            else:
                micro, local = made
                moved[plan.keys[micro + shift][local]] = block
        live.clear()
        live.update(moved)

    def _state(self, plan: MicroPlan, micro: int, live: dict[int, Block]) -> tuple[Any, ...]:
        """The allocator at the end of micro-batch ``micro``: what decides how the next one replays, with the
        live blocks that a later micro-batch frees named by (micro-batches ago, request within it) rather than by
        key (the others, such as the gradients accumulated in place, stay the same blocks to the end)."""
        alloc = self.allocator
        pools = []
        for small in (True, False):
            pool = alloc.pools[small]
            free = tuple(
                (s, b.addr, b.size, b.requested, b.segment.addr, b.segment.size, pool.searches - b.gc_base)
                for s in sorted(pool.free) for b in pool.free[s]
            )
            unmapped = tuple(
                (s, b.addr, b.size, b.segment.addr) for s in sorted(pool.unmapped) for b in pool.unmapped[s]
            )
            pools.append((free, unmapped))
        named = []
        for key, b in live.items():
            made = plan.origin.get(key) if key in plan.freed else None  # a later micro-batch frees it
            name: tuple[int, ...] = (-1, key) if made is None else (micro - made[0], made[1])
            named.append((name, b.addr, b.size, b.requested, b.segment.addr, b.segment.size, b.mapped))
        named.sort()
        stats = alloc.stats
        return (stats.allocated, stats.reserved, alloc._next_addr, len(alloc._addresses), tuple(pools), tuple(named))

    @staticmethod
    def _where(events: StepEvents, index: int) -> str:
        # A compact step's held micro-batches after a skip repeat replayed ones from the same state: no request in
        # them can fail, so a failing request's micro-batch is numbered as in the whole step.
        starts = [start for start, _ in events.bounds]
        at = bisect.bisect_right(starts, index) - 1
        return events.bounds[at][1] if at >= 0 else ""


@dataclass(frozen=True)
class MicroPlan:
    """A step's micro-batches in its request stream, for skipping repeats.

    ``starts[k]``: the first event of micro-batch k (``starts[-1]``: where the last one ends);
    ``keys[k]``: the keys micro-batch k allocates, in order; ``origin``: key -> (micro-batch, position);
    ``freed``: the keys freed inside the micro-batches;
    ``periodic_from``: the first micro-batch from which every micro-batch makes the same requests (sizes,
    and frees of the same position of the same micro-batch back, or of the same key made before them).
    """

    starts: tuple[int, ...]
    keys: tuple[tuple[int, ...], ...]
    origin: dict[int, tuple[int, int]]
    periodic_from: int
    freed: frozenset[int] = frozenset()  # keys some micro-batch frees
    extra: int = 0  # micro-batches the step stands for beyond those it holds (StepEvents.extra_micro_batches)

    @staticmethod
    def starts_of(events: StepEvents) -> tuple[int, ...]:
        """``starts`` of a step: the first event of each micro-batch, then where the last one ends; () without
        micro-batches."""
        starts: list[int] = []
        end = None
        for index, label in events.bounds:
            _, _, micro = label.partition("@")
            if micro:
                if int(micro) == len(starts):
                    starts.append(index)
            elif starts and end is None:
                end = index
        if starts:
            starts.append(end if end is not None else len(events.events))
        return tuple(starts)

    @classmethod
    def of(cls, events: StepEvents) -> MicroPlan:
        starts = cls.starts_of(events)
        if not starts:
            return cls((), (), {}, 0, extra=events.extra_micro_batches)
        native = allocator.NATIVE  # None: not built, or CKPTBENCH_NATIVE=0 (read here: tests switch it off)
        found = native.micro_plan(events.events, starts, ALLOC) if native is not None else None
        keys, origin, freed, periodic = found if found is not None else _micro_plan(events.events, starts)
        return cls(tuple(starts), keys, origin, periodic, freed, events.extra_micro_batches)


def _micro_plan(
    stream: Sequence[tuple[int, int, int]], starts: Sequence[int]
) -> tuple[tuple[tuple[int, ...], ...], dict[int, tuple[int, int]], frozenset[int], int]:
    """``MicroPlan.of``'s loop over the events, in Python: the reference of the C one (``_replay_native.micro_plan``).
    (keys of each micro-batch, origin, the keys freed, the first periodic micro-batch)."""
    origin: dict[int, tuple[int, int]] = {}
    keys: list[tuple[int, ...]] = []
    shapes: list[tuple[Any, ...]] = []
    freed: set[int] = set()
    find, free = origin.get, freed.add  # the loop below runs once per event of the step: locals only
    for m in range(len(starts) - 1):
        made: list[int] = []
        shape: list[Any] = []
        keep, note = made.append, shape.append
        for op, key, nbytes in stream[starts[m] : starts[m + 1]]:
            if op == ALLOC:
                origin[key] = (m, len(made))
                keep(key)
                note(nbytes)
            else:
                free(key)
                at = find(key)
                note(("g", key) if at is None else ("r", m - at[0], at[1]))
        keys.append(tuple(made))
        shapes.append(tuple(shape))
    periodic = len(shapes) - 1
    while periodic > 0 and shapes[periodic - 1] == shapes[-1]:
        periodic -= 1
    return tuple(keys), origin, frozenset(freed), periodic


def _counters(alloc: CachingAllocator) -> tuple[int, int, int, int]:
    stats = alloc.stats
    return stats.num_alloc_retries, stats.num_ooms, stats.num_device_alloc, stats.num_device_free


def _add_counters(alloc: CachingAllocator, now: tuple[int, ...], before: tuple[int, ...], times: int) -> None:
    """Count ``times`` more repeats of what happened between ``before`` and ``now``."""
    stats = alloc.stats
    grow = [(a - b) * times for a, b in zip(now, before, strict=True)]
    stats.num_alloc_retries += grow[0]
    stats.num_ooms += grow[1]
    stats.num_device_alloc += grow[2]
    stats.num_device_free += grow[3]
    # the peaks: a repeat reaches exactly those the repeated micro-batch reached


def _micro_batch_count(events: StepEvents) -> int:
    """How many micro-batches a step's segments are numbered with ('pre@0', 'fwd:3@1', ...)."""
    return len({label.partition("@")[2] for _, label in events.bounds} - {""})


class StreamTooShort(Exception):
    """A compact step's held micro-batches never repeat: replay the whole step instead."""


class _Stopped(Exception):
    def __init__(self, segment: str, oom: AllocatorOOM) -> None:
        super().__init__(segment)
        self.segment, self.oom = segment, oom


# The fewest micro-batches whose repeats a replay skips (a compact step's always are): below it, the whole step
# replayed in C (``_replay_in_c``) costs less than planning the skip (MicroPlan.of over every event, the allocator's
# state after each micro-batch, on allocator.py's objects) and replaying the micro-batches before the repeat. Measured
# on LLaMA-7B, sequence 2048, micro-batches of 1, on a 2-core CPU, ms per point (the step's assembly and its replay),
# skipping / whole in C: 12 micro-batches 51 / 37, 16: 63 / 48, 18: 67 / 58 (held whole), 24: 68 / 78 (16 held).
SKIP_FROM = 18


def replay_point(
    first: StepEvents, steady: StepEvents, process: ProcessModel, settings: AllocatorSettings, limit: DeviceLimit,
    *, skip_repeats: bool = True, skip_from: int = SKIP_FROM, in_c: bool = True,
) -> ReplayResult:
    """Replay a point's process; the measured window's peaks, or where it runs out of memory. ``skip_repeats``:
    skip the repeats of a step of at least ``skip_from`` micro-batches (and of a compact step, always). ``in_c``: a
    process without skips, under the default settings, is replayed in C where it is built (``_replay_in_c``; False:
    through allocator.py's objects, the reference)."""
    run = _Run(settings, limit)
    stats = run.allocator.stats
    plans: dict[int, MicroPlan] = {}
    if not skip_repeats and (first.extra_micro_batches or steady.extra_micro_batches):
        raise StreamTooShort("a compact step is replayed by skipping its repeats")
    if skip_repeats and (steady.extra_micro_batches or _micro_batch_count(steady) >= max(skip_from, 3)):
        plans[id(steady)] = plan = MicroPlan.of(steady)
        # The first step differs only from its optimizer step on (StepEvents.with_optimizer): the same plan where its
        # micro-batches start at the same events and make the same requests.
        end = plan.starts[-1] if plan.starts else 0
        same = (MicroPlan.starts_of(first) == plan.starts and first.extra_micro_batches == plan.extra
                and first.events[:end] == steady.events[:end])
        plans[id(first)] = plan if same else MicroPlan.of(first)
    if not plans and in_c:
        fast = _replay_in_c(first, steady, process, settings, limit)
        if fast is not None:
            return fast
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
            events = first if i == 0 else steady
            _, returned = run.step(events, plans.get(id(events)))  # the optimizer state stays
            losses += returned
        for block in losses:  # the warm-up losses, dropped when the warm-up returns
            run.allocator.free(block)
        run.allocator.reset_peak()
        retries = stats.num_alloc_retries
        before = run.allocator.large_pool_state()
        for i in range(process.measured_steps):
            run.phase = f"measured step {i + 1}"
            run.step(steady, plans.get(id(steady)))
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


def _replay_in_c(
    first: StepEvents, steady: StepEvents, process: ProcessModel, settings: AllocatorSettings, limit: DeviceLimit,
) -> ReplayResult | None:
    """``replay_point``'s process, every micro-batch replayed, in C (``_replay_native.replay``: its blocks and free
    lists as C structs, no Python object per request); None where it is not built, the settings are not the default
    ones, or a step has a request the general rules must answer (they raise for it)."""
    native = allocator.NATIVE
    if native is None or not default_rules(settings, limit):
        return None
    try:
        first_state, steady_state = first.segment_range("opt"), steady.segment_range("opt")
    except KeyError:
        return None
    allowed = limit.allowed_bytes
    found = native.replay(
        _requests(first), first_state, _requests(steady), steady_state, tuple(process.workspaces), tuple(process.build),
        process.batch_bytes, process.warmup_steps, process.measured_steps, -1 if allowed is None else allowed,
        limit.total_bytes - limit.outside_bytes, settings.large_segment_size, ALLOC,
    )
    if found is None:
        return None
    peak_allocated, peak_reserved, retries, before_window, oom = found
    if oom is None:
        return ReplayResult(peak_allocated, peak_reserved, retries - before_window, None)
    phase, index, nbytes, allocated, reserved = oom
    warmup = process.warmup_steps
    if phase == 0:
        where = OomPrediction("setup", "", nbytes, allocated, reserved)
    else:
        name = f"warm-up step {phase}" if phase <= warmup else f"measured step {phase - warmup}"
        events = first if phase == 1 else steady
        where = OomPrediction(name, _Run._where(events, index), nbytes, allocated, reserved)
    return ReplayResult(peak_allocated, peak_reserved, retries, where)


def _requests(step: StepEvents) -> bytes | list[tuple[int, int, int]]:
    """A step's requests as the C replay reads them: packed where the C assembler made them (no tuple made), else the
    list."""
    return step.packed if step.packed is not None else step.events


TOKEN_BYTES = 8  # the batch: int64 token ids (train.step.make_batch)


OptimizerSteps = tuple[tuple[tuple[int, int, int], ...], tuple[tuple[int, int, int], ...]]
_OPTIMIZER_STEPS: dict[int, tuple[StepTrace, OptimizerSteps]] = {}


def optimizer_steps(optim: StepTrace) -> OptimizerSteps:
    """The whole model's first optimizer step (creating the state) and a later one, as (op, id, bytes): read once
    per optimizer trace (the last few are kept), not once per point that replays it."""
    return of_trace(
        _OPTIMIZER_STEPS, id(optim), optim,
        lambda: (tuple(segment_events(optim, "opt_first", exclude=optim.host)), tuple(segment_events(optim, "opt"))),
        kept=8,
    )


def fast_steps(
    short: StepTrace, short_classes: Sequence[str], full_classes: Sequence[str], micro_batches: int, optim: StepTrace,
    *, compact: bool = False,
) -> tuple[StepEvents, StepEvents]:
    """The first warm-up step and a later step of the full model, from a short model's trace.

    ``compact``: hold only ``held_micro_batches(micro_batches)`` micro-batches and stand for the rest
    (``StepEvents.extra_micro_batches``): the replay skips repeats of the micro-batches without their
    requests, or raises StreamTooShort when the held ones never repeat (then replay the whole step)."""
    first_opt, opt = optimizer_steps(optim)
    held = held_micro_batches(micro_batches) if compact else micro_batches
    steady = assemble_step(short, short_classes, full_classes, held, opt)
    steady.extra_micro_batches = micro_batches - held
    return steady.with_optimizer(first_opt), steady


# A compact step: from COMPACT_FROM micro-batches, COMPACT_HELD (or one more) held, enough for an LLaMA step's
# allocator to settle (it repeats from its 3rd micro-batch); a step whose held micro-batches never repeat is assembled
# and replayed whole instead (exact either way, slower then). Measured on LLaMA-7B, sequence 2048, on a 2-core CPU, ms
# per point (the step's assembly and its replay), 16 held / 6 held: 16 micro-batches 46 (whole, in C) / 32, 32: 59 /
# 29, 64: 56 / 40; below 12 the whole step in C is faster (8: 23 / 31). No LLaMA-7B point of 84 (first:k, last:k,
# every:n at 8 to 64 micro-batches) fell back with 6 held; with 4 held, 79 of them did.
COMPACT_FROM = 12
COMPACT_HELD = 6


def held_micro_batches(micro_batches: int) -> int:
    """The micro-batches a compact step holds: all below COMPACT_FROM, else 6 or 7, of the same parity (so the ones
    left out are whole periods of a repeat every micro-batch or every other one)."""
    return micro_batches if micro_batches < COMPACT_FROM else COMPACT_HELD + micro_batches % 2


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
    cfg: SweepConfig, point: Point, steps: tuple[StepEvents, StepEvents], optim: StepTrace, gpu: GpuModel,
    *, skip_repeats: bool = True,
) -> ReplayResult:
    """Replay the point's process on ``gpu``: peaks of the measured window, or where it runs out.
    ``skip_repeats=False`` replays every micro-batch (the reference the skipping is tested against)."""
    first, steady = steps
    return replay_point(
        first, steady, process_model(cfg, point, optim, gpu), allocator_settings(point), device_limit(cfg, gpu),
        skip_repeats=skip_repeats,
    )
