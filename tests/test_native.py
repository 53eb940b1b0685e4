"""The C fast path of the replayed allocator (estimator/_replay_native.c) against the general rules, its reference:
the free lists behave as ``SortedBlocks`` under any sequence of operations, ``serve`` fails as the general rules do,
whole estimates (micro-batch skipping, out-of-memory points) are the same objects with and without it, and a build is
used only when it was made from the source beside it and fits allocator.py's classes.

Request-by-request equality of ``serve`` with the general rules is in tests/test_allocator_serve.py; that it leaks
neither memory nor references, in tests/test_allocator_leak.py."""

from __future__ import annotations

import dataclasses
import hashlib
import random
from pathlib import Path
from typing import Any

import pytest

from ckptbench.config.alloc_conf import parse_alloc_conf
from ckptbench.config.load import load_config
from ckptbench.estimator import allocator as allocator_module
from ckptbench.estimator import native_fingerprint
from ckptbench.estimator.allocator import NATIVE, AllocatorSegment, Block, CachingAllocator, DeviceLimit, SortedBlocks
from ckptbench.estimator.estimator import Estimator
from ckptbench.estimator.event_assembly import StepEvents
from ckptbench.estimator.events import ALLOC
from ckptbench.estimator.gpus import gpu_model
from ckptbench.estimator.replay import ProcessModel, ReplayResult, replay_point
from tests._native import REQUIRED, WITH_NATIVE
from tests._random_steps import random_step, with_state
from tests.conftest import tiny_config

MIB, GIB = 2**20, 2**30


def test_ci_runs_the_c_part() -> None:
    """Where CI asks for it (CKPTBENCH_REQUIRE_NATIVE=1), the install built it from this source: the C loop is what
    estimates use under the default settings (the general rules elsewhere)."""
    if REQUIRED:
        assert NATIVE is not None
        built = NATIVE.SOURCE_HASH
        assert built == native_fingerprint.source_hash()
        default = CachingAllocator(parse_alloc_conf(""), DeviceLimit(GIB))
        assert default._native is NATIVE and default._serves_in_c
        expandable = CachingAllocator(parse_alloc_conf("expandable_segments:True"), DeviceLimit(GIB))
        assert expandable._native is NATIVE and not expandable._serves_in_c
    python = CachingAllocator(parse_alloc_conf(""), DeviceLimit(GIB), native=False)
    assert python._native is None and not python._serves_in_c


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
            if rng.random() < 0.5:
                c.remove(block)
                py.remove(block)
            else:
                index = list(py).index(block) - rng.choice([0, len(py)])  # from the front or the back
                assert c.pop(index) is block and py.pop(index) is block
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
    with pytest.raises(IndexError):
        c.pop(-len(c) - 1)


@pytest.mark.parametrize("native", [False, pytest.param(True, marks=WITH_NATIVE)])
def test_serve_fails_on_an_unknown_key_with_the_counters_written_back(native: bool) -> None:
    a = CachingAllocator(parse_alloc_conf(""), DeviceLimit(GIB), native=native)
    live: dict[int, Block] = {}
    a.serve([(0, 1, 4096)], live)  # a new segment
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
    est = Estimator(cfg, target="cuda", gpu=gpu_model("h200"))
    est.run_traces(points, workers=1)
    with_c = est.estimate_each(points, workers=1)
    monkeypatch.setattr(allocator_module, "NATIVE", None)
    est._estimates.clear()  # estimated again, not read from the memo: the event assembly and the replay in Python
    python = est.estimate_each(points, workers=1)
    assert with_c == python and all(a is not b for a, b in zip(with_c, python, strict=True))
    replays = [e.reserved for e in python]
    assert all(r is not None for r in replays)
    ooms = sum(r.oom is not None for r in replays if r is not None)
    assert 0 < ooms < len(replays), ooms  # both kinds of point were compared
    if case == "tiny-capped":
        assert any(r.num_alloc_retries for r in replays if r is not None)


@WITH_NATIVE
def test_micro_plan_in_c_is_the_python_loop() -> None:
    """``micro_plan`` against replay.py's loop on made-up steps: micro-batches that repeat from some point on or
    never, frees of keys made before the step, in an earlier micro-batch or in the same one; and what it leaves to
    the Python loop (an event that is not a plain triple of ints, a key beyond 64 bits)."""

    assert NATIVE is not None
    periodic: set[int] = set()
    for seed in range(16):
        _one_micro_plan(seed, periodic)
    # micro-batches that repeat from the first, from a later one, and never (one repeat of the last: 1)
    assert {0, 1} <= periodic and any(p > 1 for p in periodic), periodic


@WITH_NATIVE
@pytest.mark.parametrize("seed", range(8))
def test_a_micro_batch_repeated_in_c_is_the_python_copy(seed: int) -> None:
    """``shift_events`` (event_assembly.py ``_repeat``'s copy): the events from ``start`` appended again, each key at
    or past ``k_before`` moved on by ``step``, the others (tensors made before) kept, as the Python comprehension
    makes them; what is not a list of triples is refused."""
    assert NATIVE is not None
    rng = random.Random(seed)
    events = [(rng.randint(0, 1), rng.randint(0, 500), rng.choice([0, 512, 2**40])) for _ in range(rng.randint(0, 300))]
    start, k_before, step = rng.randint(0, len(events)), rng.randint(0, 500), rng.randint(1, 10**6)
    expected = events + [(op, key + step if key >= k_before else key, n) for op, key, n in events[start:]]
    NATIVE.shift_events(events, start, k_before, step)
    assert events == expected
    with pytest.raises(TypeError, match="each event"):
        NATIVE.shift_events([(0, 1)], 0, 0, 1)
    with pytest.raises(IndexError):
        NATIVE.shift_events([], 1, 0, 1)


def _one_micro_plan(seed: int, periodic: set[int]) -> None:
    from ckptbench.estimator.events import ALLOC, FREE
    from ckptbench.estimator.replay import _micro_plan

    assert NATIVE is not None
    rng = random.Random(seed)
    sizes = [rng.choice([512, 1024, 4096]) for _ in range(rng.randint(1, 12))]
    # each micro-batch: its allocations, frees of some of them and of some of the micro-batch before's (by position)
    own = rng.sample(range(len(sizes)), rng.randint(0, len(sizes)))
    back = rng.sample(range(len(sizes)), rng.randint(0, len(sizes)))
    events: list[tuple[int, int, int]] = [(FREE, -k, 0) for k in range(1, rng.randint(1, 4))]  # made before
    starts, made = [len(events)], list[list[int]]()
    for m in range(rng.randint(1, 7)):
        keys = [len(events) + i + 1000 * m for i in range(len(sizes))]
        events += [(ALLOC, k, n) for k, n in zip(keys, sizes, strict=True)]
        events += [(FREE, keys[i], 0) for i in own]
        events += [(FREE, made[-1][i], 0) for i in back if made and made[-1][i] not in {keys[j] for j in own}]
        if m == seed % 5:
            events.append((FREE, -1, 0))  # a key made before the step: this micro-batch is not like the others
        made.append(keys)
        starts.append(len(events))
    plan = _micro_plan(events, starts)
    assert NATIVE.micro_plan(events, starts, ALLOC) == plan
    periodic.add(plan[3])
    assert NATIVE.micro_plan([*events[:-1], [FREE, 1, 0]], starts, ALLOC) is None
    huge = [*events[: starts[0]], (ALLOC, 2**70, 8), *events[starts[0] + 1 :]]
    assert NATIVE.micro_plan(huge, starts, ALLOC) is None
    with pytest.raises(ValueError, match="starts must rise"):
        NATIVE.micro_plan(events, [*starts, 0], ALLOC)


@WITH_NATIVE
@pytest.mark.parametrize("fraction", [None, 0.5])
def test_new_segments_right_at_the_limit_are_made_or_refused_as_by_the_general_rules(fraction: float | None) -> None:
    """Segments that fill the device (or the memory fraction) to the byte are made, the next 2 MiB is not: the
    C loop makes new segments only where ``_alloc_block`` would, and leaves the rest to the general rules."""
    limit = DeviceLimit(1 * GIB, fraction, 64 * MIB)
    room = (limit.allowed_bytes if fraction else GIB - 64 * MIB) or 0
    for last in (room - 3 * 40 * MIB, room - 3 * 40 * MIB + 2 * MIB):  # the fourth segment fits exactly, or not
        fast = CachingAllocator(parse_alloc_conf(""), limit, record_segments=True, native=True)
        slow = CachingAllocator(parse_alloc_conf(""), limit, record_segments=True, native=False)
        outcome: list[tuple[Any, ...]] = []
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
def test_a_build_of_another_source_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """A C part built from another source than the one beside it (edited since) is left alone, with a warning that
    says how to rebuild it, and the general rules serve every request; an install without the source (a wheel that
    left it out) uses its build; CKPTBENCH_NATIVE=0 asks for the general rules alone."""
    assert NATIVE is not None
    built = NATIVE.SOURCE_HASH
    assert built == native_fingerprint.source_hash() and len(built) == 16
    monkeypatch.setattr(NATIVE, "SOURCE_HASH", "0" * 16)
    with pytest.warns(RuntimeWarning, match="older build.*pip install -e"):
        assert allocator_module._load_native() is None
    monkeypatch.setattr(allocator_module, "source_hash", lambda: None)
    assert allocator_module._load_native() is NATIVE
    monkeypatch.setattr(NATIVE, "SOURCE_HASH", built)
    monkeypatch.setenv("CKPTBENCH_NATIVE", "0")
    assert allocator_module._load_native() is None


def test_the_fingerprint_is_the_sources_sha256(tmp_path: Path) -> None:
    source = tmp_path / "x.c"
    source.write_bytes(b"int x;\n")
    assert native_fingerprint.source_hash(source) == hashlib.sha256(b"int x;\n").hexdigest()[:16]
    assert native_fingerprint.source_hash(tmp_path / "absent.c") is None


def _block_like(slots: tuple[str, ...], *, key: int = -1, base: type = object) -> type:
    """A class with these slots whose __init__ does what Block's does (but for ``key``'s default)."""

    def __init__(self: Any, addr: int, size: int, segment: AllocatorSegment, *, mapped: bool = True) -> None:
        made = {"addr": addr, "size": size, "segment": segment, "mapped": mapped, "allocated": False, "prev": None,
                "next": None, "gc_base": 0, "requested": 0, "key": key}
        for name in slots:
            setattr(self, name, made.get(name))

    return type("BlockLike", (base,), {"__slots__": slots, "__init__": __init__})


@WITH_NATIVE
@pytest.mark.parametrize(("block", "refused"), [
    (_block_like(Block.__slots__, key=0), "BlockLike.__init__ sets key otherwise"),
    (_block_like((*Block.__slots__, "extra")), "slot extra that this build does not know"),
    (_block_like(tuple(s for s in Block.__slots__ if s != "key")), "lacks slots"),
    (_block_like(()), "lacks slots"),
    (type("Dict", (), {}), "has a __dict__"),
    (_block_like((), base=Block), "not a Python class deriving from object alone"),
    (int, "not a Python class"),
], ids=["init-default", "extra-slot", "missing-slot", "no-slot", "dict", "subclass", "builtin"])
def test_the_c_part_refuses_classes_it_was_not_written_for(block: type, refused: str) -> None:
    """The C part writes Block's slots and makes blocks without __init__: it binds only to a class whose slots are
    exactly the ones it writes and whose __init__ makes what it makes, else refuses (and keeps its binding)."""
    assert NATIVE is not None
    with pytest.raises(TypeError, match=refused):
        NATIVE.bind(block, AllocatorSegment)
    a = CachingAllocator(parse_alloc_conf(""), DeviceLimit(GIB), native=True)
    live: dict[int, Block] = {}
    a.serve([(0, 1, 4096), (0, 2, 4096), (1, 1, 0)], live)  # still bound to Block: blocks it makes are Blocks
    assert type(live[2].next) is Block and type(live[2].prev) is Block and live[2].prev.size == 4096


@WITH_NATIVE
def test_a_class_like_block_binds_and_a_refused_one_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """The refusals above are for what they say: the same class with Block's __init__ defaults is accepted; and
    allocator.py leaves a C part that refuses its classes alone, with a warning."""
    assert NATIVE is not None
    try:
        NATIVE.bind(_block_like(Block.__slots__), AllocatorSegment)
    finally:
        NATIVE.bind(Block, AllocatorSegment)
    segment_like = type("SegmentLike", (), {"__slots__": (*AllocatorSegment.__slots__, "extra"),
                                            "__init__": AllocatorSegment.__init__})
    with pytest.raises(TypeError, match="SegmentLike has a slot extra"):
        NATIVE.bind(Block, segment_like)
    monkeypatch.setattr(allocator_module, "Block", _block_like(Block.__slots__, key=7))
    with pytest.warns(RuntimeWarning, match="sets key otherwise.*general rules"):
        assert allocator_module._load_native() is None


@WITH_NATIVE
def test_recorded_addresses_then_the_bump_pointer_as_in_the_general_rules() -> None:
    """A recorded trace's segment addresses are used first (the C loop leaves those new segments to the general
    rules), then the allocator's own rising addresses: the C loop leaves the bump pointer where it was while the
    recorded ones last."""
    recorded = [7 << 44, 3 << 44]
    requests = [(0, k, n) for k, n in enumerate([30 * MIB, 600, 12 * MIB, 40 * MIB, 700, 50 * MIB])]
    fast = CachingAllocator(parse_alloc_conf(""), DeviceLimit(GIB), addresses=recorded, native=True)
    slow = CachingAllocator(parse_alloc_conf(""), DeviceLimit(GIB), addresses=recorded, native=False)
    lives: list[dict[int, Block]] = [{}, {}]
    for a, live in zip((fast, slow), lives, strict=True):
        a.serve(requests, live)
    assert [b.segment.addr for b in lives[0].values()] == [b.segment.addr for b in lives[1].values()]
    assert [b.segment.addr for b in lives[0].values()][:2] == recorded and fast._next_addr == slow._next_addr


def _random_process(seed: int) -> tuple[ReplayResult, ReplayResult]:
    """One random process (steps of 1 to 7 micro-batches of large and small requests, a first step that makes its
    optimizer state, cuBLAS-like workspaces, a model, a batch) under a random limit and the default settings: replayed
    in C and through allocator.py's objects."""
    rng = random.Random(seed)
    steady = random_step(rng, rng.choice([1, 2, 3, 5, 7]), small=rng.choice([0, 3, 8]))
    first = with_state(steady, [rng.choice([512, 3 * 2**20, 11 * 2**20]) for _ in range(rng.randint(0, 4))],
                       transient=rng.choice([0, 0, 64 * 2**20]))
    workspaces = rng.choice([(), (8_519_680, 8_519_680, 2**20), (32 * 2**20, 32 * 2**20, 2**20)])
    build = tuple(rng.choice([0, 512, 4096, 2**20, 5 * 2**20, 24 * 2**20]) for _ in range(rng.randint(0, 12)))
    process = ProcessModel(warmup_steps=rng.choice([1, 2, 3]), measured_steps=rng.choice([1, 3, 5]),
                           workspaces=workspaces, build=build, batch_bytes=rng.choice([512, 4096, 3 * 2**20]))
    settings = parse_alloc_conf(rng.choice(["", "", "garbage_collection_threshold:0.6"]))
    # The limit between what the process allocates at most and what it reserves with room to spare (where cached
    # segments are freed and the request retried), or well below it (out of memory).
    roomy = replay_point(first, steady, process, settings, DeviceLimit(2**40, 1.0, 0), in_c=False)
    low, high = roomy.peak_allocated_bytes, roomy.peak_reserved_bytes
    total = int(rng.choice([low * rng.uniform(0.3, 1.0), rng.uniform(low, high * 1.05)])) + 2**20
    limit = DeviceLimit(total, rng.choice([None, 1.0, 0.7]), rng.choice([0, 2**20]))
    return (replay_point(first, steady, process, settings, limit),
            replay_point(first, steady, process, settings, limit, in_c=False))


@WITH_NATIVE
def test_a_process_replayed_in_c_is_the_general_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    """Random processes replayed in C (``_replay_native.replay``) give the general rules' results, field for field:
    peaks, retries, and where they run out (in the setup, a warm-up step, a measured step: phase, segment, bytes)."""
    assert NATIVE is not None
    calls = []
    original = NATIVE.replay

    def counted(*args: Any) -> Any:
        calls.append(found := original(*args))
        return found

    monkeypatch.setattr(NATIVE, "replay", counted)
    results = []
    for seed in range(300):
        in_c, python = _random_process(seed)
        assert in_c == python, seed
        results.append(python)
    assert len(calls) > 150 and all(found is not None for found in calls)  # replayed in C but under GC settings
    phases = {r.oom.phase.split(" step")[0] for r in results if r.oom is not None}
    assert phases == {"setup", "warm-up", "measured"}, phases
    assert sum(r.oom is None for r in results) >= 30


@WITH_NATIVE
def test_of_cached_blocks_of_one_size_a_request_takes_the_lowest_address_in_c_as_by_the_general_rules() -> None:
    """One 20 MiB segment in five 4 MiB blocks; the first, third and fifth freed: three cached blocks of one size. A
    4 MiB request takes the lowest (at 0), so that freeing the fourth merges it with the third and fifth into 12 MiB,
    which a 12 MiB request then takes: 20 MiB reserved. Had it taken the highest, the fourth would merge with the
    third alone (8 MiB) and the 12 MiB request would need a segment of its own: 32 MiB."""
    step = StepEvents()
    step.begin("start")
    step.begin("pre@0")
    a, b, c, d, e = (step.alloc(4 * MIB) for _ in range(5))
    for key in (a, c, e):
        step.free(key)
    x = step.alloc(4 * MIB)
    step.free(d)
    y = step.alloc(12 * MIB)
    for key in (b, x, y):
        step.free(key)
    step.begin("opt")
    step.begin("zero")
    process = ProcessModel(warmup_steps=1, measured_steps=1, workspaces=(), build=(), batch_bytes=512)
    limit = DeviceLimit(GIB, 1.0, 0)
    in_c = replay_point(step, step, process, parse_alloc_conf(""), limit)
    assert in_c == replay_point(step, step, process, parse_alloc_conf(""), limit, in_c=False)
    assert in_c.peak_reserved_bytes == 20 * MIB + 2 * MIB  # (and the batch's small segment)


@WITH_NATIVE
@pytest.mark.parametrize("total_mib", [27, 30, 60])
def test_a_retry_that_fits_and_one_that_does_not_are_replayed_in_c_as_by_the_general_rules(total_mib: int) -> None:
    """3 MiB leaves a whole cached 20 MiB segment; 25 MiB then needs a new 26 MiB one, over the limit with it: the
    cached segment is freed and the request retried. Under 30 MiB it then fits (the batch's 2 MiB small segment, which
    the 512 KiB requests share, beside it); under 27 MiB it does not (out of memory after the retry). Under 60 MiB
    nothing is retried."""
    step = StepEvents()
    step.begin("start")
    for k in range(2):
        step.begin(f"pre@{k}")
        first = step.alloc(3 * 2**20)
        step.free(first)
        kept, small = step.alloc(25 * 2**20), step.alloc(2**19)
        step.free(small)
        step.free(kept)
    step.begin("opt")
    step.begin("zero")
    process = ProcessModel(warmup_steps=2, measured_steps=3, workspaces=(), build=(), batch_bytes=512)
    limit = DeviceLimit(total_mib * 2**20, 1.0, 0)
    assert NATIVE is not None
    found = NATIVE.replay(step.events, (0, 0), step.events, (0, 0), (), (), 512, 2, 3, limit.allowed_bytes,
                          limit.total_bytes, parse_alloc_conf("").large_segment_size, ALLOC)
    assert found is not None
    retries, oom = found[2], found[4]
    assert (retries, oom is None) == {27: (1, False), 30: (1, True), 60: (0, True)}[total_mib]
    in_c = replay_point(step, step, process, parse_alloc_conf(""), limit)
    assert in_c == replay_point(step, step, process, parse_alloc_conf(""), limit, in_c=False)


@WITH_NATIVE
def test_the_estimator_replays_every_point_of_a_plain_config_in_c(monkeypatch: pytest.MonkeyPatch) -> None:
    """A point of a few micro-batches under the default settings is replayed by ``_replay_native.replay``, not through
    allocator.py's objects (which it would give the same numbers as, only slower): the estimator's fast path is the one
    it takes."""
    assert NATIVE is not None
    calls: list[Any] = []
    original = NATIVE.replay

    def counted(*args: Any) -> Any:
        calls.append(found := original(*args))
        return found

    monkeypatch.setattr(NATIVE, "replay", counted)
    cfg = tiny_config(device="cuda", sweep={"layout": ["none", "all"], "batch_size": [2], "seq_len": [32],
                                            "precision": ["bf16"], "micro_batches": [1, 4]})
    points = cfg.points_list()
    est = Estimator(cfg, target="cuda", gpu=gpu_model("h200"))
    est.run_traces(points, workers=1)
    estimates = est.estimate_each(points, workers=1)
    assert all(e.reserved is not None and e.reserved.peak_reserved_bytes for e in estimates)
    assert len(calls) == len(points) and all(found is not None for found in calls)


@WITH_NATIVE
def test_a_step_of_sparse_keys_is_left_to_the_general_rules() -> None:
    """The C replay holds the live requests as an array by key (a step's keys count its requests from 0); a step whose
    keys are far apart is replayed through allocator.py's objects instead, with the same result."""
    assert NATIVE is not None
    step = StepEvents()
    step.begin("start")
    step.begin("pre@0")
    step.events += [(ALLOC, 10**7, 3 * MIB), (ALLOC, 5, 512), (1, 10**7, 0)]
    step.begin("opt")
    step.begin("zero")
    args = ((0, 0), (), (), 512, 2, 3, -1, GIB, 20 * MIB, ALLOC)
    assert NATIVE.replay(step.events, args[0], step.events, *args) is None
    process = ProcessModel(warmup_steps=2, measured_steps=3, workspaces=(), build=(), batch_bytes=512)
    limit, settings = DeviceLimit(GIB, 1.0, 0), parse_alloc_conf("")
    assert replay_point(step, step, process, settings, limit) == replay_point(step, step, process, settings, limit,
                                                                              in_c=False)
