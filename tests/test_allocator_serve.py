"""The allocator's fast path, ``serve`` in C (estimator/_replay_native.c), against the general rules
(``malloc``/``free``, the reference): the same blocks, counters, segments and out-of-memory errors after every
request, on random streams and on the requests the C loop leaves to the general rules.

Without the C part ``serve`` is the general rules request by request (tests/test_allocator.py works them out by
hand); whole estimates with and without the C part are compared in tests/test_native.py."""

from __future__ import annotations

import random
from typing import Any

import pytest

from ckptbench.config.alloc_conf import parse_alloc_conf
from ckptbench.estimator.allocator import NATIVE, AllocatorOOM, Block, CachingAllocator, DeviceLimit
from tests._native import WITH_NATIVE

MIB, GIB = 2**20, 2**30
SIZES = [1, 511, 513, 4096, 300_000, MIB, MIB + 1, 3 * MIB, 9 * MIB, 12 * MIB, 40 * MIB, 200 * MIB]


def _snapshot(a: CachingAllocator) -> tuple[Any, ...]:
    s = a.stats
    pools = tuple(
        (small, stream, tuple((b.addr, b.size, b.gc_base) for b in a.pools[small].free[stream]))
        for small in (True, False) for stream in sorted(a.pools[small].free)
        if len(a.pools[small].free[stream])  # an empty list of cached blocks is none (serve makes stream 0's at once)
    )
    return (s.allocated, s.reserved, s.peak_allocated, s.peak_reserved, s.num_alloc_retries, s.num_ooms,
            s.num_device_alloc, s.num_device_free, tuple(s.segment_events), pools)


def _chain(block: Block) -> tuple[tuple[int, int, bool], ...]:
    """The block's whole segment, in address order (what merging and splitting left)."""
    first = block
    while first.prev is not None:
        first = first.prev
    out = []
    walk: Block | None = first
    while walk is not None:
        out.append((walk.addr, walk.size, walk.allocated))
        walk = walk.next
    return tuple(out)


def _pair(limit: DeviceLimit, **kwargs: Any) -> tuple[CachingAllocator, CachingAllocator]:
    """(serve in C, the general rules alone) under the default settings."""
    fast = CachingAllocator(parse_alloc_conf(""), limit, record_segments=True, native=True, **kwargs)
    slow = CachingAllocator(parse_alloc_conf(""), limit, record_segments=True, native=False, **kwargs)
    assert fast._serves_in_c and fast._native is NATIVE and not slow._serves_in_c and slow._native is None
    return fast, slow


@WITH_NATIVE
@pytest.mark.parametrize("seed", range(12))
def test_serving_one_request_at_a_time_in_c_replays_exactly_as_the_general_rules(seed: int) -> None:
    """The C ``serve``, one request per call, against ``malloc``/``free`` (get_free_block -> alloc_found_block;
    free_block): the same blocks, counters, segments and out-of-memory errors after every request (on a small card,
    so that segments are released, retries counted and requests refused too)."""
    rng = random.Random(seed)
    fast, slow = _pair(DeviceLimit(2 * GIB, None if seed % 2 else 0.9, 64 * MIB))
    live: dict[int, Block] = {}
    held: dict[int, Block] = {}
    for key in range(1500):
        if held and rng.random() < 0.45:
            gone = rng.choice(list(held))
            fast.serve([(1, gone, 0)], live)
            slow.free(held.pop(gone))
        else:
            n = rng.choice(SIZES) + rng.randrange(0, 4096) * rng.choice([0, 1])
            outcome: list[Any] = []
            try:
                fast.serve([(0, key, n)], live)
                outcome.append(live[key])
            except AllocatorOOM as oom:
                outcome.append(("oom", oom.size, oom.allocated, oom.reserved))
            try:
                outcome.append(held.setdefault(key, slow.malloc(n)))
            except AllocatorOOM as oom:
                outcome.append(("oom", oom.size, oom.allocated, oom.reserved))
            if isinstance(outcome[0], Block):
                assert isinstance(outcome[1], Block)
                assert _chain(outcome[0]) == _chain(outcome[1])
            else:
                assert outcome[0] == outcome[1]
        assert _snapshot(fast) == _snapshot(slow)


@WITH_NATIVE
@pytest.mark.parametrize("seed", range(8))
def test_serving_a_request_stream_in_c_is_the_general_rules_request_by_request(seed: int) -> None:
    """The C ``serve`` of chunks of requests against ``serve`` through the general rules: the same blocks, counters
    and segments after every chunk, and the same out-of-memory error naming the same request (a small card: segments
    released, retries, refusals, each left by the C loop to the general rules)."""
    rng = random.Random(seed)
    fast, slow = _pair(DeviceLimit(2 * GIB, None if seed % 2 else 0.9, 64 * MIB))
    live_fast: dict[int, Block] = {}
    live_slow: dict[int, Block] = {}
    next_key, ooms = 0, 0
    for _ in range(120):
        chunk: list[tuple[int, int, int]] = []
        held = list(live_fast)
        for _ in range(rng.randint(1, 40)):
            if held and rng.random() < 0.45:
                chunk.append((1, held.pop(rng.randrange(len(held))), 0))
            else:
                n = rng.choice(SIZES) + rng.randrange(0, 4096) * rng.choice([0, 1])
                chunk.append((0, next_key, n))
                held.append(next_key)
                next_key += 1
        outcome: list[Any] = []
        for a, live in ((fast, live_fast), (slow, live_slow)):
            try:
                a.serve(chunk, live)
                outcome.append(None)
            except AllocatorOOM as oom:
                outcome.append((oom.request, oom.size, oom.allocated, oom.reserved))
        assert outcome[0] == outcome[1]
        if outcome[0] is not None:
            ooms += 1
            assert outcome[0][0] in chunk and outcome[0][0][0] == 0
        assert live_fast.keys() == live_slow.keys()
        assert all(_chain(live_fast[k]) == _chain(live_slow[k]) for k in live_fast)
        assert _snapshot(fast) == _snapshot(slow)
        if rng.random() < 0.2 or ooms:  # keep the card from filling up for good
            for key in list(live_fast)[: len(live_fast) // 2]:
                fast.free(live_fast.pop(key))
                slow.free(live_slow.pop(key))
            ooms = 0


@WITH_NATIVE
def test_what_the_c_loop_does_not_know_is_served_by_the_general_rules() -> None:
    """Requests that are not plain (a list for a tuple, a float op), a block of another stream, a key that is not live:
    the C loop leaves each to the general rules, which give what they give without it (the other stream's block goes
    back to that stream's free list; the unknown key is a KeyError, with the counters written back)."""
    outcomes = []
    for a in _pair(DeviceLimit(GIB)):
        live: dict[Any, Block] = {"other stream": a.malloc(5 * MIB, stream=1)}
        odd: list[Any] = [(0, 1, 4096), [0, 2, 3 * MIB], (0.0, 3, 700), (1, "other stream", 0), (1, 1, 0)]
        a.serve(odd, live)
        with pytest.raises(KeyError):
            a.serve([(0, 4, 9000), (1, 99, 0), (0, 5, 9000)], live)
        free = {stream: [(b.addr, b.size) for b in blocks] for stream, blocks in a.pools[False].free.items()}
        outcomes.append((sorted(live), {k: _chain(b) for k, b in live.items()}, free, _snapshot(a)))
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][0] == [2, 3, 4] and outcomes[0][2][1] == [(1 << 40, 20 * MIB)]
