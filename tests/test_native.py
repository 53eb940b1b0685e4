"""The C hot path of the replayed allocator (estimator/_replay_native.c) against its pure-Python reference: the
free lists behave as ``SortedBlocks`` under any sequence of operations, ``serve`` fails as the Python loop does, and
whole estimates (micro-batch skipping, out-of-memory points) are the same objects with and without it.

Request-by-request equality of ``serve`` with the general rules is in tests/test_speed.py (both loops)."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest

from ckptbench.config.alloc_conf import parse_alloc_conf
from ckptbench.config.load import load_config
from ckptbench.estimator import allocator as allocator_module
from ckptbench.estimator.allocator import NATIVE, AllocatorSegment, Block, CachingAllocator, DeviceLimit, SortedBlocks
from ckptbench.estimator.api import Estimator
from ckptbench.estimator.gpus import gpu_model
from tests._native import REQUIRED, WITH_NATIVE
from tests.conftest import tiny_config

MIB, GIB = 2**20, 2**30


def test_ci_runs_the_c_part() -> None:
    """Where CI asks for it (CKPTBENCH_REQUIRE_NATIVE=1), the install built it: the C loop is what estimates use."""
    if REQUIRED:
        assert NATIVE is not None
        assert CachingAllocator(parse_alloc_conf(""), DeviceLimit(GIB))._native is NATIVE
    assert CachingAllocator(parse_alloc_conf(""), DeviceLimit(GIB), native=False)._native is None


@WITH_NATIVE
@pytest.mark.parametrize("seed", range(6))
def test_free_list_is_sorted_blocks_in_c(seed: int) -> None:
    assert NATIVE is not None
    rng = random.Random(seed)
    segment = AllocatorSegment(0, 1 << 50, 0, small=False, expandable=False, page=0)
    c, py = NATIVE.FreeList(), SortedBlocks()
    held: list[Block] = []
    sizes = [512, 1024, 2 * MIB, 20 * MIB, 1 << 40]
    for _ in range(600):
        if held and rng.random() < 0.4:
            block = held.pop(rng.randrange(len(held)))
            c.remove(block)
            py.remove(block)
            assert block not in c
        else:
            block = Block(rng.randrange(1 << 20) * 512, rng.choice(sizes) * rng.randint(1, 3), segment)
            if block in py or any(b.addr == block.addr and b.size == block.size for b in held):
                continue
            c.add(block)
            py.add(block)
            held.append(block)
            assert block in c
        assert len(c) == len(py)
        assert list(c) == list(py)
        size = rng.choice(sizes) * rng.randint(1, 3) + rng.choice([-1, 0, 1])
        assert c.lower_bound(size) == py.lower_bound(size)
        if len(py):
            index = rng.randrange(-len(py), len(py))
            assert c.at(index) is py.at(index)
    assert not c.by_address
    stranger = Block(3, 512, segment)
    assert stranger not in c
    with pytest.raises(KeyError):
        c.remove(stranger)
    with pytest.raises(IndexError):
        c.at(len(c))


@pytest.mark.parametrize("native", [False, pytest.param(True, marks=WITH_NATIVE)])
def test_serve_fails_on_an_unknown_key_with_the_counters_written_back(native: bool) -> None:
    a = CachingAllocator(parse_alloc_conf(""), DeviceLimit(GIB), native=native)
    live: dict[int, Block] = {}
    a.serve([(0, 1, 4096)], live)  # a new segment (the Python part), then the C loop from the next request
    with pytest.raises(KeyError):
        a.serve([(0, 2, 1000), (1, 1, 0), (1, 7, 0), (0, 3, 1000)], live)
    assert sorted(live) == [2]
    assert a.stats.allocated == 1024 and a.stats.peak_allocated == 4096 + 1024


def _grid_points() -> tuple[Any, list[Any]]:
    cfg = load_config("configs/llama7b-estimate-grid.yaml")
    points = cfg.points_list()
    return cfg, points[::101] + [dataclasses.replace(points[5], micro_batches=m) for m in (3, 20)]


@WITH_NATIVE
@pytest.mark.parametrize("case", ["llama7b", "tiny-capped"])
def test_estimates_are_the_same_with_and_without_the_c_loop(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The product's estimates, every field, from the same traces: LLaMA-7B points of the 704-point grid (some run
    out of an H200) and accumulation (skipped micro-batches compare allocator states read off the C free lists); a
    capped tiny model with out-of-memory points and retries."""
    if case == "llama7b":
        cfg, points = _grid_points()
    else:
        cfg = tiny_config(device="cuda", memory_cap_gib=0.09,
                          sweep={"layout": ["none", "all"], "batch_size": [1, 16], "seq_len": [64],
                                 "precision": ["bf16"], "micro_batches": [1, 4]})
        points = cfg.points_list()
    est = Estimator(cfg, target="cuda", gpu=gpu_model("h200"))  # type: ignore[arg-type]
    est.run_traces(points, workers=1)
    with_c = est.estimate_each(points, workers=1)
    monkeypatch.setattr(allocator_module, "NATIVE", None)
    python = est.estimate_each(points, workers=1)
    assert with_c == python
    replays = [e.reserved for e in python]
    assert all(r is not None for r in replays)
    ooms = sum(r.oom is not None for r in replays if r is not None)
    assert 0 < ooms < len(replays), ooms  # both kinds of point were compared
    if case == "tiny-capped":
        assert any(r.num_alloc_retries for r in replays if r is not None)


@pytest.mark.parametrize("native", [False, pytest.param(True, marks=WITH_NATIVE)])
@pytest.mark.parametrize("fraction", [None, 0.5])
def test_new_segments_right_at_the_limit_are_made_or_refused_as_by_the_general_rules(
    native: bool, fraction: float | None
) -> None:
    """Segments that fill the device (or the memory fraction) to the byte are made, the next 2 MiB is not: the
    C loop makes new segments only where ``_alloc_block`` would, and leaves the rest to the slow path."""
    limit = DeviceLimit(1 * GIB, fraction, 64 * MIB)
    room = (limit.allowed_bytes if fraction else GIB - 64 * MIB) or 0
    for last in (room - 3 * 40 * MIB, room - 3 * 40 * MIB + 2 * MIB):  # the fourth segment fits exactly, or not
        fast = CachingAllocator(parse_alloc_conf(""), limit, record_segments=True, native=native)
        slow = CachingAllocator(parse_alloc_conf(""), limit, record_segments=True, native=False)
        slow._fast = False
        outcome = []
        for a in (fast, slow):
            live: dict[int, Block] = {}
            try:
                a.serve([(0, k, 40 * MIB) for k in range(3)] + [(0, 3, last)], live)
                outcome.append(("ok", a.stats.reserved, tuple(a.stats.segment_events)))
            except allocator_module.AllocatorOOM as oom:
                outcome.append(("oom", oom.request, oom.size, a.stats.num_alloc_retries))
        assert outcome[0] == outcome[1]
        assert outcome[0][0] == ("ok" if last == room - 3 * 40 * MIB else "oom")


@WITH_NATIVE
def test_an_older_build_than_the_source_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """A C part built before its source last changed (another ABI) is left alone, with a warning that says how to
    rebuild it; the estimates then run on the pure-Python loop."""
    assert NATIVE is not None
    monkeypatch.setattr(NATIVE, "ABI", allocator_module.NATIVE_ABI - 1)
    with pytest.warns(RuntimeWarning, match="older build.*pip install -e"):
        assert allocator_module._load_native() is None
    monkeypatch.setattr(NATIVE, "ABI", allocator_module.NATIVE_ABI)
    assert allocator_module._load_native() is NATIVE
    monkeypatch.setenv("CKPTBENCH_NATIVE", "0")
    assert allocator_module._load_native() is None


@pytest.mark.parametrize("native", [False, pytest.param(True, marks=WITH_NATIVE)])
def test_recorded_addresses_then_the_bump_pointer_as_in_the_general_rules(native: bool) -> None:
    """A recorded trace's segment addresses are used first (by the Python slow path), then the allocator's own
    rising addresses: the C loop leaves the bump pointer where it was while the recorded ones last."""
    recorded = [7 << 44, 3 << 44]
    requests = [(0, k, n) for k, n in enumerate([30 * MIB, 600, 12 * MIB, 40 * MIB, 700, 50 * MIB])]
    fast = CachingAllocator(parse_alloc_conf(""), DeviceLimit(GIB), addresses=recorded, native=native)
    slow = CachingAllocator(parse_alloc_conf(""), DeviceLimit(GIB), addresses=recorded, native=False)
    slow._fast = False
    lives: list[dict[int, Block]] = [{}, {}]
    for a, live in zip((fast, slow), lives, strict=True):
        a.serve(requests, live)
    assert [b.segment.addr for b in lives[0].values()] == [b.segment.addr for b in lives[1].values()]
    assert [b.segment.addr for b in lives[0].values()][:2] == recorded and fast._next_addr == slow._next_addr
