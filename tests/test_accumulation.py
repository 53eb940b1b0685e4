"""Gradient accumulation without replaying every micro-batch through the allocator (estimator/replay.py skips the
micro-batches that repeat the last replayed one): byte-identical to the full replay for every count and setting."""

from __future__ import annotations

import dataclasses
import random
import time
from typing import Any

import pytest

from ckptbench.config.alloc_conf import parse_alloc_conf
from ckptbench.config.grid import Point
from ckptbench.config.schema import SweepConfig
from ckptbench.estimator import replay as replay_module
from ckptbench.estimator.allocator import DeviceLimit
from ckptbench.estimator.estimator import Estimator
from ckptbench.estimator.event_assembly import StepEvents
from ckptbench.estimator.events import ALLOC
from ckptbench.estimator.gpus import gpu_model
from ckptbench.estimator.record import Estimate
from ckptbench.estimator.replay import ProcessModel, replay_point
from tests._random_steps import random_step as _random_step
from tests.conftest import tiny_config

COUNTS = [1, 2, 3, 4, 5, 8]
LAYOUTS = ["none", "all", "every:2@attn"]


def _config(device: str, **sweep: Any) -> SweepConfig:
    axes = {"layout": LAYOUTS, "batch_size": [2], "seq_len": [32], "precision": ["bf16"], **sweep}
    return tiny_config(device=device, sweep=axes)


def _with_micro(points: list[Point], count: int) -> list[Point]:
    return [dataclasses.replace(p, micro_batches=count) for p in points]


def _estimates(cfg: SweepConfig, points: list[Point], *, skip: bool, monkeypatch: pytest.MonkeyPatch,
               est: Estimator) -> list[Estimate]:
    """Estimates of ``points`` from ``est`` (its traces run); ``skip=False``: every micro-batch replayed."""
    original = replay_module.replay_point

    def replay(*args: Any, **kwargs: Any) -> Any:
        return original(*args, **{**kwargs, "skip_repeats": skip, "skip_from": 3})  # every count that can skip

    monkeypatch.setattr(replay_module, "replay_point", replay)
    try:
        return [est.estimate(p) for p in points]
    finally:
        monkeypatch.setattr(replay_module, "replay_point", original)


def _traced(cfg: SweepConfig, points: list[Point], *, method: str) -> Estimator:
    est = Estimator(cfg, target="cuda", method=method, gpu=gpu_model("h200"))  # type: ignore[arg-type]
    for _, job in est.jobs(points):
        job()
    return est


def _same(a: list[Estimate], b: list[Estimate]) -> None:
    for x, y in zip(a, b, strict=True):
        assert x == y, (x.point.layout, x.point.micro_batches)


@pytest.mark.parametrize("allocator", ["default", "expandable_segments", "garbage_collection_threshold:0.5"])
def test_replay_skipping_repeated_micro_batches_is_exact(allocator: str, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = _config("cuda", allocator=[allocator])
    if allocator.startswith("garbage"):  # garbage collection needs a memory fraction: a cap
        cfg = cfg.model_copy(update={"memory_cap_gib": 1.0})
    points = [p for count in COUNTS for p in _with_micro(cfg.points_list(), count)]
    est = _traced(cfg, points, method="fast")  # one short trace (2 micro-batches) serves every count
    new = _estimates(cfg, points, skip=True, monkeypatch=monkeypatch, est=est)
    old = _estimates(cfg, points, skip=False, monkeypatch=monkeypatch, est=est)
    _same(new, old)
    assert all(e.reserved is not None and e.reserved.peak_reserved_bytes for e in new)


def test_replay_skipping_on_a_full_trace_is_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole model traced with its micro-batches (the 'full' method: each count traced)."""
    cfg = _config("cuda", layout=["every:2"])
    points = [p for count in (3, 5) for p in _with_micro(cfg.points_list(), count)]
    est = _traced(cfg, points, method="full")
    _same(_estimates(cfg, points, skip=True, monkeypatch=monkeypatch, est=est),
          _estimates(cfg, points, skip=False, monkeypatch=monkeypatch, est=est))


def test_a_large_count_replays_quickly(monkeypatch: pytest.MonkeyPatch) -> None:
    """256 micro-batches: the replay stops at the first repeated micro-batch (the time is printed)."""
    cfg = _config("cuda", layout=["all"])
    points = _with_micro(cfg.points_list(), 256)
    est = _traced(cfg, points, method="fast")
    began = time.perf_counter()
    new = _estimates(cfg, points, skip=True, monkeypatch=monkeypatch, est=est)
    print(f"256 micro-batches: estimate with the replay in {time.perf_counter() - began:.2f} s")
    old = _estimates(cfg, points, skip=False, monkeypatch=monkeypatch, est=est)
    _same(new, old)


@pytest.mark.parametrize("seed", range(40))
def test_skipping_a_synthetic_stream_is_exact(seed: int) -> None:
    """Random periodic streams under a tight limit (retries, fragmentation that settles late), all settings."""
    rng = random.Random(seed)
    count = rng.choice([3, 4, 5, 8, 16])
    step = _random_step(rng, count)
    conf = rng.choice(["", "expandable_segments:True", "garbage_collection_threshold:0.6", "max_split_size_mb:20"])
    process = ProcessModel(warmup_steps=1, measured_steps=3, workspaces=(), build=(3 * 2**20,), batch_bytes=512)
    limit = DeviceLimit(rng.choice([150, 250, 2000]) * 2**20, 1.0, 0)
    settings = parse_alloc_conf(conf)
    runs = [replay_point(step, step, process, settings, limit, skip_repeats=skip, skip_from=3)
            for skip in (True, False)]
    assert runs[0] == runs[1]


@pytest.mark.parametrize(("count", "planned_here"), [(4, False), (17, False), (18, True), (19, True)])
def test_repeats_are_planned_from_eighteen_micro_batches_once_for_both_steps(
    count: int, planned_here: bool, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Below SKIP_FROM (18) micro-batches the replay plans nothing (it replays every micro-batch, in C: planning costs
    more than it skips); from it, one plan serves the first step too, which differs only from its optimizer step on
    (here the later step's optimizer allocates nothing, as fused AdamW's does not: its segment and the next start at
    the same event), and the peaks are those of the whole replay."""
    whole = _random_step(random.Random(count), count)
    at, start, _ = whole._segment_at("opt")
    steady = StepEvents(whole.events, [*whole.bounds[: at + 1], (start, "zero")], next_key=whole.next_key)
    state = [(ALLOC, whole.next_key, 5 * 2**20), (ALLOC, whole.next_key + 1, 2**20)]
    first = StepEvents([*whole.events[:start], *state, *whole.events[start:]],
                       [*whole.bounds[: at + 1], (start + len(state), "zero")], next_key=whole.next_key + 2)
    planned: list[StepEvents] = []
    original = replay_module.MicroPlan.of

    def of(events: StepEvents) -> replay_module.MicroPlan:
        planned.append(events)
        return original(events)

    monkeypatch.setattr(replay_module.MicroPlan, "of", of)
    process = ProcessModel(warmup_steps=2, measured_steps=3, workspaces=(), build=(3 * 2**20,), batch_bytes=512)
    limit, settings = DeviceLimit(2000 * 2**20, 1.0, 0), parse_alloc_conf("")
    got = replay_point(first, steady, process, settings, limit)
    assert planned == ([steady] if planned_here else [])
    assert got == replay_point(first, steady, process, settings, limit, skip_repeats=False)


# -- compact steps: a few micro-batches held, the rest stood for ---------------------------------------------
@pytest.mark.parametrize("seed", range(60))
def test_a_compact_synthetic_step_replays_as_the_whole_step(seed: int) -> None:
    """Held micro-batches and the count they stand for give the whole step's replay, OOM labels included,
    or say that their micro-batches never repeat (the estimator then replays the whole step)."""
    count = random.Random(seed).choice([12, 13, 18, 19, 20, 27, 40, 41, 100])
    whole = _random_step(random.Random(seed), count)
    held = replay_module.held_micro_batches(count)
    compact = _random_step(random.Random(seed), held)
    compact.extra_micro_batches = count - held
    rng = random.Random(seed + 1000)
    conf = rng.choice(["", "expandable_segments:True", "garbage_collection_threshold:0.6", "max_split_size_mb:20"])
    process = ProcessModel(warmup_steps=1, measured_steps=3, workspaces=(), build=(3 * 2**20,), batch_bytes=512)
    limit = DeviceLimit(rng.choice([60, 150, 250, 2000]) * 2**20, 1.0, 0)
    settings = parse_alloc_conf(conf)
    expected = replay_point(whole, whole, process, settings, limit, skip_repeats=False)
    try:
        got = replay_point(compact, compact, process, settings, limit)
    except replay_module.StreamTooShort:
        return  # never repeats within the held micro-batches: the whole step is replayed instead (tested below)
    assert got == expected


def test_the_whole_replay_of_a_compact_step_is_the_exception() -> None:
    """The fallback is the exception: a LLaMA step's held micro-batches (6 or 7) repeat (its allocator settles from
    the 3rd micro-batch), for every layout of the tests' model at long accumulations; of random periodic streams,
    which settle later under tight limits or keep a block of every micro-batch to the end (then they never repeat),
    most do too."""
    cfg = _config("cuda", layout=["none", "all", "every:2@attn", "first:2", "last:3@mlp"])
    points = [p for count in (12, 13, 32, 64) for p in _with_micro(cfg.points_list(), count)]
    est = _traced(cfg, points, method="fast")
    for p in points:
        key, optim = est._short_key(p), est._optim[next(iter(est._optim))]
        steps = replay_module.fast_steps(est._traces[key], key[-1], est.classes(p), p.micro_batches, optim,
                                         compact=True)
        assert steps[1].extra_micro_batches == p.micro_batches - 6 - p.micro_batches % 2
        replay_module.predict_reserved(cfg, p, steps, optim, gpu_model("h200"))  # no StreamTooShort
    fell_back = 0
    for seed in range(60):
        count = random.Random(seed).choice([12, 13, 18, 19, 20, 27, 40, 41, 100])
        held = replay_module.held_micro_batches(count)
        compact = _random_step(random.Random(seed), held)
        compact.extra_micro_batches = count - held
        process = ProcessModel(warmup_steps=1, measured_steps=3, workspaces=(), build=(), batch_bytes=512)
        try:
            replay_point(compact, compact, process, parse_alloc_conf(""), DeviceLimit(2000 * 2**20, 1.0, 0))
        except replay_module.StreamTooShort:
            fell_back += 1
    assert fell_back <= 30


def test_a_compact_step_without_skipping_is_refused() -> None:
    step = _random_step(random.Random(1), 8)
    step.extra_micro_batches = 4
    process = ProcessModel(warmup_steps=1, measured_steps=1, workspaces=(), build=(), batch_bytes=512)
    with pytest.raises(replay_module.StreamTooShort):
        replay_point(step, step, process, parse_alloc_conf(""), DeviceLimit(2**30, 1.0, 0), skip_repeats=False)


@pytest.mark.parametrize("allocator", ["default", "expandable_segments"])
def test_estimates_of_many_micro_batches_equal_the_whole_step(allocator: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The estimator holds 6 or 7 micro-batches of a long accumulation: the same estimates, peak labels and OOM
    included, as assembling and replaying every micro-batch."""
    cfg = _config("cuda", allocator=[allocator])
    points = [p for count in (12, 13, 24, 61) for p in _with_micro(cfg.points_list(), count)]
    est = _traced(cfg, points, method="fast")
    compact = [est.estimate(p) for p in points]
    monkeypatch.setattr(replay_module, "held_micro_batches", lambda count: count)  # hold them all
    whole = [est.estimate(p) for p in points]
    _same(compact, whole)
    capped = cfg.model_copy(update={"memory_cap_gib": 0.004})  # 4 MiB: out of memory in the step
    est_capped = _traced(capped, points[:3], method="fast")
    ooms = [est_capped.estimate(p) for p in points[:3]]
    monkeypatch.undo()
    assert [est_capped.estimate(p) for p in points[:3]] == ooms


def test_a_thousand_micro_batches_hold_six() -> None:
    """micro_batches 1024 is assembled and replayed with 6 of them held (the others stood for)."""
    cfg = _config("cuda", layout=["all"])
    (point,) = _with_micro(cfg.points_list(), 1024)
    est = _traced(cfg, [point], method="fast")
    key = est._short_key(point)
    optim = est._optim[next(iter(est._optim))]
    first, steady = replay_module.fast_steps(est._traces[key], key[-1], est.classes(point), 1024, optim, compact=True)
    assert steady.extra_micro_batches == first.extra_micro_batches == 1018
    assert sum(1 for _, label in steady.bounds if label.startswith("pre@")) == 6
    (estimate,) = [est.estimate(point)]
    assert estimate.reserved is not None and estimate.reserved.peak_reserved_bytes
    assert estimate.peak_at is not None


# -- the byte model's peak over many micro-batches, without walking each ------------------------------------
def _walk_all(costs: Any, optimizer: Any, classes: list[str], micro_batches: int) -> Any:
    """estimator/assembly.py's ``assemble`` as it was: every micro-batch walked (the reference)."""
    from ckptbench.estimator.assembly import Peak, Step
    from ckptbench.estimator.step_trace import add

    named = [("start", costs.begin)]
    for k in range(micro_batches):
        named += costs.micro[min(k, len(costs.micro) - 1)].named_steps(classes, k)
    named += [("opt", Step.of(optimizer.get("opt"))), ("zero", Step.of(optimizer.get("zero")))]
    start = add(costs.start, add(optimizer.static, costs.static, -1))
    level, peak, where = start, start, "start"
    for label, step in named:
        candidate = add(level, step.rise)
        if sum(candidate) > sum(peak):
            peak, where = candidate, label
        level = add(level, step.delta)
    return Peak(peak, where, costs.retained)


@pytest.mark.parametrize("seed", range(30))
def test_the_peak_over_many_micro_batches_is_the_walked_one(seed: int) -> None:
    """Later micro-batches that leave more, the same or less behind: the closed form finds the walk's peak
    and the segment where it is first reached."""
    from ckptbench.estimator.assembly import Step, assemble
    from ckptbench.estimator.step_trace import StepSegment

    rng = random.Random(seed)

    def vec(lo: int, hi: int) -> tuple[int, ...]:
        return tuple(rng.randint(lo, hi) for _ in range(7))

    def step() -> Step:
        start = vec(0, 50)
        end = tuple(s + rng.randint(-8, 10) for s in start)
        peak = tuple(max(s, e) + rng.randint(0, 20) for s, e in zip(start, end, strict=True))
        return Step.of(StepSegment("x", start, peak, end))

    class Micro:
        def __init__(self) -> None:
            self.steps = [step() for _ in range(rng.randint(1, 4))]

        def named_steps(self, classes: list[str], micro: int) -> list[tuple[str, Step]]:
            return [(f"s{i}@{micro}", st) for i, st in enumerate(self.steps)]

    class Costs:
        def __init__(self) -> None:
            self.begin, self.micro = step(), (Micro(), Micro())
            self.start, self.static, self.retained = vec(100, 200), vec(0, 50), vec(0, 3)

    class Optim:
        def __init__(self) -> None:
            self.static, self.segments = vec(0, 50), {"opt": step(), "zero": step()}

        def get(self, label: str) -> Any:
            s = self.segments[label]
            return StepSegment(label, (0,) * 7, s.rise, s.delta)

    costs, optim = Costs(), Optim()
    for count in range(1, 25):
        assert assemble(costs, optim, [], count) == _walk_all(costs, optim, [], count), count  # type: ignore[arg-type]


def _retrying_step(count: int) -> StepEvents:
    """Micro-batches that each free a cached segment and retry, twice (max_split_size_mb:50 keeps a cached
    130 MiB segment from serving 100 MiB and the reverse; 200 MiB hold only one of them)."""
    step = StepEvents()
    step.begin("start")
    for k in range(count):
        step.begin(f"pre@{k}")
        for size in (100 * 2**20, 130 * 2**20):
            step.free(step.alloc(size))
    step.begin("opt")
    step.begin("zero")
    return step


def test_micro_batches_that_retry_never_repeat_and_fall_back_to_the_whole_step() -> None:
    """A retry releases segments and maps new ones (new addresses): the allocator never ends a micro-batch where
    it ended another, so nothing is skipped and a compact step says so (the estimator replays the whole one)."""
    process = ProcessModel(warmup_steps=1, measured_steps=2, workspaces=(), build=(), batch_bytes=512)
    settings, limit = parse_alloc_conf("max_split_size_mb:50"), DeviceLimit(200 * 2**20, 1.0, 0)
    whole = replay_point(_retrying_step(40), _retrying_step(40), process, settings, limit, skip_repeats=False)
    assert whole.num_alloc_retries == 80  # every micro-batch of the measured step retries twice
    assert replay_point(_retrying_step(40), _retrying_step(40), process, settings, limit) == whole
    compact = _retrying_step(16)
    compact.extra_micro_batches = 24
    with pytest.raises(replay_module.StreamTooShort):
        replay_point(compact, compact, process, settings, limit)
