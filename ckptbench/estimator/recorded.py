"""A caching-allocator trace recorded on a GPU, as compact JSON, and its replay through our allocator. No torch.

``torch.cuda.memory._record_memory_history`` makes the allocator log every action; ``_snapshot()``
returns them under ``device_traces`` (one list per device) as dicts with ``action``, ``addr``,
``size``, ``stream`` (torch/cuda/memory.py, ``_snapshot``'s TraceEntry: 'alloc' carries the size the
caller asked for, 'segment_alloc'/'segment_free' the segment's; 'segment_map'/'segment_unmap' with
expandable segments; 'oom' the rounded request, its ``addr`` the free device memory). The GPU side
(processes/alloc_trace.py) keeps only what a replay needs, in this format (gzip-compressed JSON)::

    {"format": "ckptbench-allocator-trace", "version": 1, "meta": {...},
     "actions": ["alloc", "free_completed", ...],   # the code of each action is its index
     "events": [[code, addr, size, stream], ...]}

An ``empty_cache`` action marks a ``torch.cuda.empty_cache()`` call (the allocator logs the segments it
frees, not the call: processes/alloc_trace.py places the marker from the call's time).
``replay_recorded`` feeds the recorded requests (alloc, free_completed) to estimator/allocator.py with
the recorded segment addresses (so that ties between equal cached blocks break the same way) and
returns what it did next to what the GPU did: every segment allocation and free, the peak reserved
memory, and each allocation's address.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path

from ckptbench.config.alloc_conf import parse_alloc_conf
from ckptbench.estimator.allocator import Block, CachingAllocator, DeviceLimit
from ckptbench.json_object import JsonObject

FORMAT = "ckptbench-allocator-trace"
VERSION = 1
SEGMENT_ACTIONS = ("segment_alloc", "segment_free", "segment_map", "segment_unmap")


@dataclass(frozen=True)
class RecordedTrace:
    meta: JsonObject
    events: list[tuple[str, int, int, int]]  # (action, addr, size, stream)

    def segment_events(self) -> list[tuple[str, int]]:
        return [(a, size) for a, _, size, _ in self.events if a in SEGMENT_ACTIONS]

    def peak_reserved(self) -> int:
        """The most the recorded segments ever held (what max_memory_reserved reports without a reset)."""
        now = peak = 0
        for action, _, size, _ in self.events:
            if action in ("segment_alloc", "segment_map"):
                now += size
                peak = max(peak, now)
            elif action in ("segment_free", "segment_unmap"):
                now -= size
        return peak


def load_trace(path: str | Path) -> RecordedTrace:
    """Read a trace written by processes/alloc_trace.py (.json or .json.gz); ValueError for another format."""
    p = Path(path)
    raw = gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_bytes()
    data = json.loads(raw)
    if data.get("format") != FORMAT or data.get("version") != VERSION:
        raise ValueError(f"{p}: not a {FORMAT} v{VERSION} file")
    actions = data["actions"]
    return RecordedTrace(data["meta"], [(actions[c], addr, size, stream) for c, addr, size, stream in data["events"]])


@dataclass(frozen=True)
class ReplayComparison:
    recorded_segments: list[tuple[str, int]]
    replayed_segments: list[tuple[str, int]]
    recorded_peak_reserved: int
    replayed_peak_reserved: int
    address_mismatches: int  # allocations placed at another address than on the GPU


def replay_recorded(trace: RecordedTrace) -> ReplayComparison:
    """Replay the recorded requests; what our allocator did next to what the GPU's did."""
    meta = trace.meta
    limit = DeviceLimit(int(meta["total_bytes"]), meta.get("fraction"), int(meta.get("outside_bytes", 0)))
    settings = parse_alloc_conf(meta.get("allocator_conf") or "")
    addresses = None if settings.expandable_segments else [a for act, a, _, _ in trace.events if act == "segment_alloc"]
    allocator = CachingAllocator(settings, limit, record_segments=True, addresses=addresses)
    live: dict[int, Block] = {}
    mismatches = 0
    for action, addr, size, stream in trace.events:
        if action == "alloc":
            block = allocator.malloc(size, stream)
            mismatches += block.addr != addr and addresses is not None
            live[addr] = block
        elif action == "free_completed":
            allocator.free(live.pop(addr))
        elif action == "empty_cache":
            allocator.release_cached()
    return ReplayComparison(
        trace.segment_events(), [(a, size) for a, _, size in allocator.stats.segment_events],
        trace.peak_reserved(), allocator.stats.peak_reserved, mismatches,
    )
