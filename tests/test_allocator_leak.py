"""The C part of the replayed allocator (estimator/_replay_native.c) counts its references by hand: serving a million
requests (new segments, splits, merges, requests left to the general rules) must leave behind no objects, no
references and no memory."""

from __future__ import annotations

import gc
import random
import resource
import sys
import tracemalloc
from pathlib import Path

from ckptbench.config.alloc_conf import parse_alloc_conf
from ckptbench.estimator.allocator import AllocatorSegment, Block, CachingAllocator, DeviceLimit
from tests._native import WITH_NATIVE

MIB, GIB = 2**20, 2**30
REQUESTS_PER_ROUND, ROUNDS, WARM_UP = 100_000, 10, 2
CHUNK = 100  # requests per serve call: the per-call paths (the counters, the request list) run 10,000 times


def _resident_bytes() -> int:
    """The process's resident memory now (Linux), else its peak."""
    statm = Path("/proc/self/statm")
    if statm.exists():
        return int(statm.read_text().split()[1]) * resource.getpagesize()
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _round(rng: random.Random) -> list[tuple[int, int, int]]:
    """Phases of allocations and frees in random order, each of one kind of size and holding up to 512 MiB, everything
    freed at its end (what one phase cached, the next may not fit in: the card then frees cached segments). Keys and
    sizes are ints of their own (not the interpreter's shared small ones), so that their reference counts are this
    test's."""
    requests: list[tuple[int, int, int]] = []
    key = 10**9
    while len(requests) < REQUESTS_PER_ROUND:
        base = rng.choice([700, 4096, 300_000, MIB, 3 * MIB, 12 * MIB, 40 * MIB])
        sizes = [base + rng.randrange(512, 4096) for _ in range(8)]
        live: list[tuple[int, int]] = []  # (key, size)
        held = 0
        for _ in range(2000):
            size = rng.choice(sizes)
            if live and (rng.random() < 0.5 or held + size > GIB // 2):
                index = rng.randrange(len(live))
                live[index], live[-1] = live[-1], live[index]
                gone, gone_size = live.pop()
                requests.append((1, gone, 0))
                held -= gone_size
            else:
                key += 1
                requests.append((0, key, size))
                live.append((key, size))
                held += size
        requests += [(1, k, 0) for k, _ in live]
    return requests


def _serve_round(requests: list[tuple[int, int, int]]) -> None:
    """One fresh allocator serving the round in chunks, then dropped: a card of 640 MiB, on which C makes segments
    and leaves some requests to the general rules (which free cached segments of another phase and retry)."""
    allocator = CachingAllocator(parse_alloc_conf(""), DeviceLimit(640 * MIB), native=True)
    assert allocator._serves_in_c
    live: dict[int, Block] = {}
    for start in range(0, len(requests), CHUNK):
        allocator.serve(requests[start:start + CHUNK], live)
    assert not live and allocator.stats.allocated == 0 and allocator.stats.num_alloc_retries > 0


def _state(requests: list[tuple[int, int, int]]) -> dict[str, int]:
    gc.collect()
    sizes = sorted({n for op, _, n in requests if op == 0})
    watched = {"Block": Block, "AllocatorSegment": AllocatorSegment, "requests": requests, "a request": requests[0],
               "a key": requests[0][1], "the smallest size": sizes[0], "the largest size": sizes[-1]}
    shared = {"None": None, "True": True, "False": False}
    objects = gc.get_objects()
    return {
        **{f"references to {name}": sys.getrefcount(obj) for name, obj in watched.items()},
        "Block objects": sum(type(o) is Block for o in objects),
        "objects": len(objects),
        **{f"references to {name} (shared)": sys.getrefcount(obj) for name, obj in shared.items()},
        "memory blocks": sys.getallocatedblocks(),
        "resident bytes": _resident_bytes(),
    }


@WITH_NATIVE
def test_a_million_requests_leak_no_objects_references_or_memory() -> None:
    requests = _round(random.Random(0))
    for _ in range(WARM_UP):  # the interpreter's free lists and arenas grow to what a round needs
        _serve_round(requests)
    before = _state(requests)
    for _ in range(ROUNDS - WARM_UP):
        _serve_round(requests)
    after = _state(requests)
    grown = {name: after[name] - before[name] for name in before}
    # A reference leaked per request is 800,000 of them, one leaked per serve call 8,000. This test's objects: exactly
    # as many references as before, and no Block more. The interpreter's shared objects and caches drift a little
    # (tens of references and objects, a few hundred memory blocks over these rounds, with or without the C part).
    exact = {name: n for name, n in grown.items() if name.startswith("references") and "shared" not in name}
    exact["Block objects"] = grown["Block objects"]
    assert exact == dict.fromkeys(exact, 0), grown
    assert all(abs(grown[f"references to {name} (shared)"]) < 1000 for name in ("None", "True", "False")), grown
    assert grown["objects"] < 100 and grown["memory blocks"] < 1000, grown
    assert grown["resident bytes"] < 2 * MIB, grown


@WITH_NATIVE
def test_micro_plans_leak_no_objects_references_or_memory() -> None:
    """``micro_plan`` (MicroPlan.of's loop in C) 80 times over a step of 100,000 events in five micro-batches,
    and over steps it leaves to Python: nothing of the events' objects, nor memory, is left behind."""
    from ckptbench.estimator.allocator import NATIVE

    assert NATIVE is not None
    requests = _round(random.Random(1))
    starts = [len(requests) * k // 5 for k in range(6)]
    odd = [*requests[:-1], [1, requests[-1][1], 0]]  # left to Python: a list, not a tuple

    def plans() -> None:
        for _ in range(20):
            assert NATIVE.micro_plan(requests, starts, 0) is not None
            assert NATIVE.micro_plan(odd, starts, 0) is None

    plans()
    before = _state(requests)
    for _ in range(4):
        plans()
    after = _state(requests)
    grown = {name: after[name] - before[name] for name in before}
    exact = {name: n for name, n in grown.items() if name.startswith("references") and "shared" not in name}
    assert exact == dict.fromkeys(exact, 0), grown
    assert grown["objects"] < 100 and grown["memory blocks"] < 1000, grown
    assert grown["resident bytes"] < 2 * MIB, grown


@WITH_NATIVE
def test_process_replays_leak_no_objects_references_or_memory() -> None:
    """``replay`` (a point's process in C) 40 times over a round of 100,000 requests as its steps, under a roomy card,
    one that frees cached segments and retries, one that runs out in a step and one that runs out in the setup, and
    over steps it leaves to Python: nothing of the events' objects, nor memory, is left behind."""
    from ckptbench.estimator.allocator import NATIVE

    assert NATIVE is not None
    requests = [(op, key - 10**9, n) for op, key, n in _round(random.Random(2))]  # a step's keys: from 0 on
    odd = [*requests[:-1], [1, requests[-1][1], 0]]  # left to Python: a list, not a tuple
    workspaces, build = (8 * MIB, 8 * MIB, MIB), tuple(range(512, 512 * 200, 512))

    def replays() -> None:
        for total, retried, phase in ((4 * GIB, False, None), (680 * MIB, True, None), (64 * MIB, True, 1),
                                      (8 * MIB, True, 0)):
            found = NATIVE.replay(requests, (0, 0), requests, (0, 0), workspaces, build, 4096, 2, 3, -1, total,
                                  20 * MIB, 0)
            assert found is not None and (found[2] > 0, found[4] and found[4][0]) == (retried, phase), total
        for _ in range(6):
            assert NATIVE.replay(odd, (0, 0), requests, (0, 0), workspaces, build, 4096, 2, 3, -1, GIB, 20 * MIB,
                                 0) is None

    replays()
    before = _state(requests)
    tracemalloc.start()  # the C part's own arrays (PyMem) too, which neither objects nor memory blocks count
    try:
        traced = tracemalloc.get_traced_memory()[0]
        for _ in range(4):
            replays()
        traced = tracemalloc.get_traced_memory()[0] - traced
    finally:
        tracemalloc.stop()
    after = _state(requests)
    grown = {name: after[name] - before[name] for name in before}
    exact = {name: n for name, n in grown.items() if name.startswith("references") and "shared" not in name}
    assert exact == dict.fromkeys(exact, 0), grown
    assert grown["objects"] < 100 and grown["memory blocks"] < 1000, grown
    assert grown["resident bytes"] < 2 * MIB and traced < 64 * 1024, (grown, traced)
