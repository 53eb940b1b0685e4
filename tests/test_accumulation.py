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
from ckptbench.estimator.api import Estimator
from ckptbench.estimator.event_assembly import StepEvents
from ckptbench.estimator.gpus import gpu_model
from ckptbench.estimator.record import Estimate
from ckptbench.estimator.replay import ProcessModel, replay_point
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
        return original(*args, **{**kwargs, "skip_repeats": skip})

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


def _random_step(rng: random.Random, count: int) -> StepEvents:
    """A step of ``count`` micro-batches making the same requests: some of its blocks freed in the same
    micro-batch, some by the next one, some kept to the end (freed by the optimizer step's segment)."""
    sizes = [rng.choice([1, 3, 5, 9, 17]) * 2**20 + rng.randrange(0, 2**20) for _ in range(rng.randint(3, 9))]
    fate = [rng.choice(["self", "next", "next", "end"]) for _ in sizes]
    first_only = rng.random() < 0.9  # the first micro-batch allocates what later ones accumulate into
    step = StepEvents()
    step.begin("start")
    previous: list[int] = []
    kept: list[int] = []
    for k in range(count):
        step.begin(f"pre@{k}")
        made = []
        for size, what in zip(sizes, fate, strict=True):
            key = step.alloc(size)
            made.append(key)
            if what == "self":
                step.free(key)
            elif what == "end" and (k == 0 or not first_only):
                kept.append(key)
            elif what == "end":
                step.free(key)
        for key, what in zip(previous, fate, strict=False):  # none before the first
            if what == "next":
                step.free(key)
        previous = made
    step.begin("opt")
    for key, what in zip(previous, fate, strict=False):  # none before the first
        if what == "next":
            step.free(key)
    for key in kept:
        step.free(key)
    step.begin("zero")
    return step


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
    runs = [replay_point(step, step, process, settings, limit, skip_repeats=skip) for skip in (True, False)]
    assert runs[0] == runs[1]
