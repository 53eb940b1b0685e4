"""The predicted allocator timeline of one point in the format of ``torch.cuda.memory._snapshot()``.

PyTorch's memory visualizer (https://pytorch.org/memory_viz, ``torch.cuda._memory_viz``) reads a pickled
dict with ``segments`` (each cudaMalloc'd segment and its blocks) and ``device_traces`` (one list per
device of ``alloc`` / ``free_requested`` / ``free_completed`` / ``segment_alloc`` / ``segment_free`` /
``segment_map`` / ``segment_unmap`` / ``oom`` events with addresses and sizes). This module replays a
point's process through ckptbench's caching-allocator model (estimator/allocator.py) as
estimator/replay.py does, records every event, and writes ``segments`` as they stand at the predicted peak
reserved of the measured window, so the picture a user opens is the predicted peak. Every address and
size in it is predicted: the frames name the step and the part of the step (``ckptbench estimate``).
"""

from __future__ import annotations

import bisect
import pickle
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NotRequired, TypedDict

from ckptbench.config.alloc_conf import AllocatorSettings
from ckptbench.config.grid import Point
from ckptbench.config.schema import SweepConfig
from ckptbench.estimator.allocator import AllocatorOOM, Block, CachingAllocator, DeviceLimit
from ckptbench.estimator.assembly import describe_segment
from ckptbench.estimator.event_assembly import StepEvents
from ckptbench.estimator.events import ALLOC
from ckptbench.estimator.gpus import GpuModel
from ckptbench.estimator.recorded import FORMAT, VERSION, RecordedTrace
from ckptbench.estimator.replay import ProcessModel
from ckptbench.results.store import atomic_file

SOURCE = "ckptbench estimate (predicted)"  # the frames' file name: nothing here was measured
_SEGMENT_UP = ("segment_alloc", "segment_map")
_SEGMENT_DOWN = ("segment_free", "segment_unmap")


# The snapshot's records, as torch/cuda/memory.py declares them (``_Frame``, ``_TraceEntry``, ``_Block``, ``_Segment``,
# ``_Snapshot``): the fields ckptbench writes, so the visualizer finds each one where it looks.
class Frame(TypedDict):
    filename: str
    line: int
    name: str


class TraceEntry(TypedDict):
    """One allocator event of ``device_traces``."""

    action: str  # 'alloc', 'free_requested', 'free_completed', 'segment_alloc', ..., 'oom'
    addr: int
    size: int
    stream: int
    frames: list[Frame]
    requested_size: NotRequired[int]  # alloc and frees
    device_free: NotRequired[int]  # oom


class SnapshotBlock(TypedDict):
    address: int
    size: int
    requested_size: int
    state: str  # 'active_allocated' or 'inactive'
    frames: list[Frame]


class SnapshotSegment(TypedDict):
    device: int
    address: int
    total_size: int
    allocated_size: int
    active_size: int
    requested_size: int
    stream: int
    segment_type: str  # 'small' or 'large'
    segment_pool_id: tuple[int, int]
    is_expandable: bool
    frames: list[Frame]
    blocks: list[SnapshotBlock]


class Snapshot(TypedDict):
    """What ``torch.cuda.memory._snapshot()`` returns (the fields the visualizer reads)."""

    segments: list[SnapshotSegment]
    device_traces: list[list[TraceEntry]]
    allocator_settings: dict[str, str]


class _Recording(CachingAllocator):
    """The caching-allocator model, writing each event into a trace as the CUDA allocator's history does."""

    def __init__(self, settings: AllocatorSettings, limit: DeviceLimit) -> None:
        super().__init__(settings, limit)
        self.trace: list[TraceEntry] = []
        self.where = "setup"

    def _frames(self) -> list[Frame]:
        return [{"filename": SOURCE, "line": 0, "name": self.where}]

    def malloc(self, requested: int, stream: int = 0) -> Block:
        try:
            block = super().malloc(requested, stream)
        except AllocatorOOM as oom:
            free = self.limit.total_bytes - self.limit.outside_bytes - self.stats.reserved
            self.trace.append({"action": "oom", "addr": 0, "size": oom.size, "stream": stream,
                               "device_free": max(free, 0), "frames": self._frames()})
            raise
        self.trace.append({"action": "alloc", "addr": block.addr, "size": block.size, "stream": stream,
                           "requested_size": requested, "frames": self._frames()})
        return block

    def free(self, block: Block) -> None:
        for action in ("free_requested", "free_completed"):  # one stream: freed at once
            self.trace.append({"action": action, "addr": block.addr, "size": block.size, "stream": block.stream,
                               "requested_size": block.requested, "frames": self._frames()})
        super().free(block)

    def _reserve(self, nbytes: int, action: str, addr: int) -> None:
        super()._reserve(nbytes, action, addr)
        self.trace.append({"action": action, "addr": addr, "size": nbytes, "stream": 0, "frames": self._frames()})

    def _unreserve(self, nbytes: int, action: str, addr: int) -> None:
        super()._unreserve(nbytes, action, addr)
        self.trace.append({"action": action, "addr": addr, "size": nbytes, "stream": 0, "frames": self._frames()})


@dataclass
class PredictedTimeline:
    """A replay's events, where the measured window starts, and its predicted peaks."""

    trace: list[TraceEntry]
    window_start: int  # index of the first event of the measured window
    peak_reserved_bytes: int
    peak_allocated_bytes: int
    oom: bool = False
    notes: list[str] = field(default_factory=list)


def record_replay(
    first: StepEvents, steady: StepEvents, process: ProcessModel, settings: AllocatorSettings, limit: DeviceLimit
) -> PredictedTimeline:
    """Replay a point's process as estimator/replay.py ``replay_point`` does (setup, warm-up steps, every
    measured step), recording every event."""
    alloc = _Recording(settings, limit)
    window_start, oom = 0, False
    try:
        alloc.where = "setup: library workspaces, parameters, the batch"
        for n in (*process.workspaces, *process.build, process.batch_bytes):
            if n > 0:
                alloc.malloc(n)
        losses: list[Block] = []
        for i in range(process.warmup_steps):
            losses += _step(alloc, first if i == 0 else steady, f"warm-up step {i + 1}")
        for block in losses:  # the warm-up losses, dropped when the warm-up returns
            alloc.free(block)
        alloc.reset_peak()
        window_start = len(alloc.trace)
        for i in range(process.measured_steps):
            _step(alloc, steady, f"measured step {i + 1}")
    except AllocatorOOM:
        oom = True
    stats = alloc.stats
    return PredictedTimeline(alloc.trace, window_start, stats.peak_reserved, stats.peak_allocated, oom)


def _step(alloc: _Recording, events: StepEvents, phase: str) -> list[Block]:
    """One step; the blocks it leaves allocated that are not optimizer state (the loss)."""
    live: dict[int, Block] = {}
    starts = [start for start, _ in events.bounds]
    for index, (op, key, nbytes) in enumerate(events.events):
        at = bisect.bisect_right(starts, index) - 1
        alloc.where = f"{phase}: {describe_segment(events.bounds[at][1])}" if at >= 0 else phase
        if op == ALLOC:
            live[key] = alloc.malloc(nbytes)
        else:
            alloc.free(live.pop(key))
    state = events.keys_made_in("opt")
    return [b for k, b in live.items() if k not in state]


def _peak_index(timeline: PredictedTimeline) -> int:
    """How many events lead to the measured window's peak reserved (the whole run's when it ran out): the
    first moment reserved memory reaches it."""
    levels, reserved = [], 0
    for e in timeline.trace:
        if e["action"] in _SEGMENT_UP:
            reserved += e["size"]
        elif e["action"] in _SEGMENT_DOWN:
            reserved -= e["size"]
        levels.append(reserved)
    if not levels:
        return 0
    # The window's peak counts the reserved memory it starts with (reset_peak_memory_stats keeps it).
    lo = 0 if timeline.oom or timeline.window_start >= len(levels) else max(timeline.window_start - 1, 0)
    top = max(levels[lo:])
    return next(i for i in range(lo, len(levels)) if levels[i] == top) + 1


def segments_at(trace: Sequence[TraceEntry], upto: int) -> list[SnapshotSegment]:
    """The segments and their blocks after ``trace[:upto]``, in ``_snapshot()``'s shape: allocated blocks
    'active_allocated', the gaps between them 'inactive'."""
    segs: dict[int, int] = {}  # address -> size
    live: dict[int, TraceEntry] = {}
    for e in trace[:upto]:
        action = e["action"]
        if action in _SEGMENT_UP:
            segs[e["addr"]] = e["size"]
        elif action in _SEGMENT_DOWN:
            segs.pop(e["addr"], None)
        elif action == "alloc":
            live[e["addr"]] = e
        elif action == "free_completed":
            live.pop(e["addr"], None)
    allocs = sorted(live.values(), key=lambda e: e["addr"])
    starts = [e["addr"] for e in allocs]
    out: list[SnapshotSegment] = []
    for addr, size in sorted(segs.items()):
        blocks: list[SnapshotBlock] = []
        cursor = addr
        for e in allocs[bisect.bisect_left(starts, addr):bisect.bisect_left(starts, addr + size)]:
            if e["addr"] > cursor:
                blocks.append(_block(cursor, e["addr"] - cursor, "inactive"))
            blocks.append(_block(e["addr"], e["size"], "active_allocated", e["requested_size"], e["frames"]))
            cursor = e["addr"] + e["size"]
        if cursor < addr + size:
            blocks.append(_block(cursor, addr + size - cursor, "inactive"))
        allocated = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
        out.append({
            "device": 0, "address": addr, "total_size": size, "allocated_size": allocated, "active_size": allocated,
            "requested_size": sum(b["requested_size"] for b in blocks if b["state"] == "active_allocated"),
            "stream": 0, "segment_type": "small" if size <= 2 * 2**20 else "large", "segment_pool_id": (0, 0),
            "is_expandable": False, "frames": [], "blocks": blocks,
        })
    return out


def _block(addr: int, size: int, state: str, requested: int | None = None,
           frames: list[Frame] | None = None) -> SnapshotBlock:
    return {"address": addr, "size": size, "requested_size": size if requested is None else requested,
            "state": state, "frames": frames or []}


def snapshot_dict(timeline: PredictedTimeline) -> Snapshot:
    """The ``_snapshot()``-shaped dict: segments at the predicted peak reserved, the whole trace."""
    return {
        "segments": segments_at(timeline.trace, _peak_index(timeline)),
        "device_traces": [list(timeline.trace)],
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "(predicted by ckptbench estimate)"},
    }


def point_snapshots(
    cfg: SweepConfig, points: Sequence[Point], *, gpu: GpuModel, method: str = "fast"
) -> list[Snapshot]:
    """Trace ``points`` (as ``ckptbench estimate`` does, each trace once) and return each one's predicted
    snapshot on ``gpu``."""
    from ckptbench.estimator.estimator import Estimator, _optim_key
    from ckptbench.estimator.replay import allocator_settings, device_limit, fast_steps, full_steps, process_model

    est = Estimator(cfg, target="cuda", method=method, gpu=gpu)  # type: ignore[arg-type]
    for _, job in est.jobs(points):
        job()
    out = []
    for point in points:
        optim = est._optim[_optim_key(point)]  # the traces the estimator ran for this point
        if est.method == "full":
            steps = full_steps(est._traces[point], optim)
        else:
            key = est._short_key(point)
            steps = fast_steps(est._traces[key], key[-1], est.classes(point), point.micro_batches, optim)
        timeline = record_replay(*steps, process_model(cfg, point, optim, gpu), allocator_settings(point),
                                 device_limit(cfg, gpu))
        out.append(snapshot_dict(timeline))
    return out


def snapshot_paths(path: Path, points: Sequence[Point]) -> list[Path]:
    """``path`` for one point; for several, one file each: 'snap.pickle' -> 'snap-all-b2.pickle'."""
    if len(points) == 1:
        return [path]
    names = [f"{path.stem}-{p.layout}-b{p.batch_size}" for p in points]
    names = [n if names.count(n) == 1 else f"{n}-{i}" for i, n in enumerate(names)]
    safe = ["".join(c if c.isalnum() or c in "-_.+" else "_" for c in n) for n in names]
    return [path.with_name(n + (path.suffix or ".pickle")) for n in safe]


def write_snapshot(snapshot: Snapshot, path: Path) -> Path:
    """Pickle the snapshot as ``torch.cuda.memory._dump_snapshot`` does (open it at pytorch.org/memory_viz), written
    whole or not at all (a full disk or Ctrl-C leaves no cut pickle; a link at ``path`` keeps its file)."""
    with atomic_file(path) as tmp, tmp.open("wb") as f:
        pickle.dump(snapshot, f)
    return path


# -- a trace recorded on a GPU (ckptbench trace-allocator) as a snapshot ----------------------------------------

RECORDED_SOURCE = "recorded on the GPU (ckptbench trace-allocator)"  # the frames' file name: measured, not predicted
MAX_TRACE_BYTES = 2**30  # a compact trace of a 7B step is tens of MB; a bigger file is not one of ours


def read_compact_trace(path: Path) -> RecordedTrace:
    """A trace written by ``ckptbench trace-allocator`` (.json.gz or .json), read within ``MAX_TRACE_BYTES``
    (compressed and uncompressed); ValueError with one line for anything else."""
    import gzip
    import io
    import json
    import zlib

    if not path.is_file():
        raise ValueError(f"{path}: no such trace file" if not path.exists() else f"{path}: not a regular file")
    with path.open("rb") as f:
        raw = f.read(MAX_TRACE_BYTES + 1)
    try:
        if path.suffix == ".gz":
            with gzip.GzipFile(fileobj=io.BytesIO(raw)) as z:
                raw = z.read(MAX_TRACE_BYTES + 1)
        if len(raw) > MAX_TRACE_BYTES:
            raise ValueError(f"{path}: larger than {MAX_TRACE_BYTES // 2**20} MiB, not a ckptbench trace")
        data = json.loads(raw)
        if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("version") != VERSION:
            raise ValueError(f"{path}: not a {FORMAT} v{VERSION} file (ckptbench trace-allocator writes one)")
        actions = [str(a) for a in data["actions"]]
        events = [(actions[int(c)], int(addr), int(size), int(stream)) for c, addr, size, stream in data["events"]]
        return RecordedTrace(dict(data.get("meta") or {}), events)
    except (OSError, EOFError, zlib.error, json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise ValueError(f"{path}: unreadable trace ({type(exc).__name__})") from None
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        if isinstance(exc, ValueError) and str(exc).startswith(str(path)):
            raise
        raise ValueError(f"{path}: not a {FORMAT} v{VERSION} file (damaged events)") from None


def recorded_timeline(trace: RecordedTrace) -> PredictedTimeline:
    """The recorded events in ``_snapshot()``'s TraceEntry shape (each free as free_requested then
    free_completed, as one stream frees; the empty_cache markers left out: the allocator logs no such
    action), with the recorded peaks."""
    key = trace.meta.get("key")
    where = " ".join(f"{k}={v}" for k, v in key.items()) if isinstance(key, dict) else "the recorded point"
    frames: list[Frame] = [{"filename": RECORDED_SOURCE, "line": 0, "name": where}]
    events: list[TraceEntry] = []
    sizes: dict[int, int] = {}
    allocated = peak_allocated = 0
    for action, addr, size, stream in trace.events:
        if action == "alloc":
            sizes[addr] = size
            allocated += size
            peak_allocated = max(peak_allocated, allocated)
            events.append({"action": "alloc", "addr": addr, "size": size, "stream": stream, "requested_size": size,
                           "frames": frames})
        elif action == "free_completed":
            size = sizes.pop(addr, size)
            allocated -= size
            for step in ("free_requested", "free_completed"):
                events.append({"action": step, "addr": addr, "size": size, "stream": stream,
                               "requested_size": size, "frames": frames})
        elif action == "oom":  # compact form: its addr is the free device memory
            events.append({"action": "oom", "addr": 0, "size": size, "stream": stream, "device_free": addr,
                           "frames": frames})
        elif action in (*_SEGMENT_UP, *_SEGMENT_DOWN):
            events.append({"action": action, "addr": addr, "size": size, "stream": stream, "frames": frames})
    oom = any(e["action"] == "oom" for e in events)
    return PredictedTimeline(events, 0, trace.peak_reserved(), peak_allocated, oom)


def recorded_snapshot(trace: RecordedTrace) -> Snapshot:
    """A ``_snapshot()``-shaped dict of a recorded trace: segments at its peak reserved, every event."""
    snapshot = snapshot_dict(recorded_timeline(trace))
    conf = trace.meta.get("allocator_conf")
    snapshot["allocator_settings"] = {"PYTORCH_CUDA_ALLOC_CONF": str(conf or ""), "source": RECORDED_SOURCE}
    return snapshot
