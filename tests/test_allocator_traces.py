"""Allocator traces recorded on a GPU, replayed through ckptbench's allocator model: identical to the byte.

The GPU side converts ``torch.cuda.memory._snapshot()`` to compact JSON (processes/alloc_trace.py); the
synthetic test below checks that conversion on a trace in the snapshot's documented shape, made by the
replay itself, so the format and the replay of a recorded sequence are tested without a GPU.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from ckptbench.config.alloc_conf import parse_alloc_conf
from ckptbench.estimator.allocator import Block, CachingAllocator, DeviceLimit
from ckptbench.estimator.recorded import load_trace, replay_recorded
from ckptbench.processes.alloc_trace import convert_snapshot, trace_file_name

MIB, GIB = 2**20, 2**30
TRACES = Path(__file__).parent / "fixtures" / "allocator_traces"
RECORDED = sorted(TRACES.glob("*.json.gz"))


@pytest.mark.parametrize(
    "path",
    RECORDED or [pytest.param(None, marks=pytest.mark.skip(
        reason="no allocator trace recorded on a GPU is committed yet (scripts/gpu_stages/02-allocator-traces.sh "
               "records them; copy its traces/*.json.gz to tests/fixtures/allocator_traces/)"))],
    ids=[p.name for p in RECORDED] or ["none-committed"],
)
def test_recorded_gpu_trace_replays_identically(path: Path) -> None:
    trace = load_trace(path)
    result = replay_recorded(trace)
    assert result.replayed_segments == result.recorded_segments
    assert result.replayed_peak_reserved == result.recorded_peak_reserved
    assert result.address_mismatches == 0


class _Recorder:
    """Runs requests through our allocator and logs them as torch's _snapshot() TraceEntry dicts."""

    def __init__(self, conf: str = "", *, fraction: float | None = None) -> None:
        self.allocator = CachingAllocator(parse_alloc_conf(conf), DeviceLimit(GIB, fraction), record_segments=True)
        self.entries: list[dict[str, Any]] = []
        self.live: dict[int, Block] = {}

    def _segments_since(self, seen: int) -> None:
        for action, addr, size in self.allocator.stats.segment_events[seen:]:
            self.entries.append({"action": action, "addr": addr, "size": size, "stream": 0, "frames": []})

    def alloc(self, size: int) -> int:
        seen = len(self.allocator.stats.segment_events)
        block = self.allocator.malloc(size)
        self._segments_since(seen)
        self.entries.append({"action": "alloc", "addr": block.addr, "size": size, "stream": 0, "frames": [],
                             "time_us": len(self.entries)})
        self.live[block.addr] = block
        return block.addr

    def free(self, addr: int) -> None:
        block = self.live.pop(addr)
        self.entries.append({"action": "free_requested", "addr": addr, "size": block.requested, "stream": 0})
        self.allocator.free(block)
        self.entries.append({"action": "free_completed", "addr": addr, "size": block.requested, "stream": 0})

    def empty_cache(self) -> tuple[int, int]:
        """torch.cuda.empty_cache as the recorder sees it: its segment frees, inside the call's time interval."""
        seen, start = len(self.allocator.stats.segment_events), len(self.entries)
        self.allocator.release_cached()
        self._segments_since(seen)
        for i in range(start, len(self.entries)):
            self.entries[i]["time_us"] = 10_000 + i
        return 10_000 + start, 10_000 + len(self.entries)

    def snapshot(self) -> dict[str, Any]:
        return {"segments": [], "device_traces": [[*self.entries, {"action": "snapshot", "size": 0, "addr": 0}]]}


def _workload(rec: _Recorder) -> list[tuple[int, int]]:
    """Splits, merges, small and large pools, a retry that frees the cache under a 0.5 fraction, and an
    empty_cache call (its interval is returned, as the recording process notes it)."""
    a = [rec.alloc(n) for n in (43 * MIB, 6 * MIB, 700 * 1024, 41 * MIB - 4096, 120 * MIB)]
    rec.free(a[0])
    rec.free(a[3])
    b = rec.alloc(30 * MIB)
    rec.free(a[4])
    rec.alloc(400 * MIB)  # 0.5 GiB allowed: the cached 120 MiB segment is released and the request retried
    rec.free(b)
    rec.free(a[1])
    call = rec.empty_cache()  # gives back the segments that are whole again: 20 MiB (6 MiB) and 42 MiB (b, a[3])
    rec.alloc(44 * MIB)
    return [call]


def _written(tmp_path: Path, rec: _Recorder, calls: list[tuple[int, int]], conf: str = "") -> Path:
    meta = {"total_bytes": GIB, "fraction": rec.allocator.limit.fraction, "allocator_conf": conf}
    path = tmp_path / "t.json.gz"
    data = convert_snapshot(rec.snapshot(), meta=meta, empty_cache_us=calls)
    path.write_bytes(gzip.compress(json.dumps(data).encode()))
    return path


def test_a_trace_in_the_snapshot_shape_converts_and_replays_identically(tmp_path: Path) -> None:
    rec = _Recorder(fraction=0.5)
    trace = load_trace(_written(tmp_path, rec, _workload(rec)))
    actions = [a for a, *_ in trace.events]
    assert actions.count("alloc") == 8 and "free_requested" not in actions  # what a replay does not need: gone
    marker = actions.index("empty_cache")
    assert [(a, size) for a, _, size, _ in trace.events[marker + 1 : marker + 3]] == [
        ("segment_free", 20 * MIB), ("segment_free", 42 * MIB),  # release_blocks: large pool, by size
    ]
    result = replay_recorded(trace)
    assert ("segment_free", 120 * MIB) in result.recorded_segments  # the retry path is in the trace
    assert result.replayed_segments == result.recorded_segments
    assert result.replayed_peak_reserved == result.recorded_peak_reserved == rec.allocator.stats.peak_reserved
    assert result.address_mismatches == 0


def test_a_different_allocator_shows_up_as_a_mismatch(tmp_path: Path) -> None:
    rec = _Recorder("max_split_size_mb:40", fraction=0.5)  # recorded with oversize blocks kept whole
    result = replay_recorded(load_trace(_written(tmp_path, rec, _workload(rec))))  # replayed with the defaults
    assert result.replayed_segments != result.recorded_segments


def test_trace_file_names_say_which_point() -> None:
    key = {"model": "llama-7b", "layout": "first:16", "batch_size": 8, "seq_len": 2048, "precision": "bf16",
           "optimizer": "adamw_fused", "allocator": "expandable_segments"}
    assert trace_file_name(key) == "llama-7b_first-16_b8_s2048_bf16_allocator-expandable_segments.json.gz"
