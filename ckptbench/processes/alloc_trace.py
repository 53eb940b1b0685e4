"""Record the CUDA caching allocator's own trace of a point, on the GPU, as compact JSON (never pickle).

``start_recording`` must run before the process allocates anything on the GPU, so that the trace holds
every request from an empty allocator (a point's own process: processes/point_process.py ``child_main``);
``write_trace`` takes ``torch.cuda.memory._snapshot()`` and keeps, per action, only what a replay needs
(estimator/recorded.py describes the format and replays it).
"""

from __future__ import annotations

import gzip
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckptbench.estimator.recorded import FORMAT, VERSION
from ckptbench.processes.workdirs import workdir

if TYPE_CHECKING:
    from ckptbench.config.schema import SweepConfig

ACTIONS = (
    "alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
    "segment_unmap", "oom", "snapshot", "user_defined", "empty_cache",
)
KEPT = {"alloc", "free_completed", "segment_alloc", "segment_free", "segment_map", "segment_unmap", "oom"}
# torch.cuda.empty_cache calls, as (start, end) in microseconds since the epoch: the allocator logs the segments
# they free but not the call, so the converter places a marker before the first entry inside each interval.
EMPTY_CACHE_CALLS: list[tuple[int, int]] = []


def start_recording() -> None:
    """Turn the allocator's history on (every action, no stack traces: small and fast) and note empty_cache calls."""
    import torch

    original = torch.cuda.empty_cache

    def empty_cache() -> None:
        start = time.time_ns() // 1000
        original()
        EMPTY_CACHE_CALLS.append((start, time.time_ns() // 1000))

    torch.cuda.empty_cache = empty_cache
    torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python")


def convert_snapshot(
    snapshot: dict[str, Any], *, meta: dict[str, Any], device: int = 0,
    empty_cache_us: list[tuple[int, int]] | None = None,
) -> dict[str, Any]:
    """The compact form of a ``torch.cuda.memory._snapshot()`` dict (its documented TraceEntry fields)."""
    events: list[list[int]] = []
    calls = sorted(empty_cache_us or [])
    marked: set[int] = set()
    for entry in snapshot["device_traces"][device]:
        action = entry["action"]
        if action not in KEPT:
            continue
        t = entry.get("time_us")
        call = next((i for i, (lo, hi) in enumerate(calls) if t is not None and lo <= t <= hi), None)
        if call is not None and call not in marked and action == "segment_free":
            events.append([ACTIONS.index("empty_cache"), 0, 0, 0])
            marked.add(call)
        addr = entry.get("device_free", 0) if action == "oom" else entry.get("addr", 0)
        events.append([ACTIONS.index(action), int(addr), int(entry.get("size", 0)), int(entry.get("stream", 0))])
    return {"format": FORMAT, "version": VERSION, "meta": meta, "actions": list(ACTIONS), "events": events}


def process_meta(device_index: int = 0) -> dict[str, Any]:
    """What a replay needs to know about the recording process: the card, the fraction, the settings."""
    import torch

    props = torch.cuda.get_device_properties(device_index)
    free, total = torch.cuda.mem_get_info(device_index)
    get_fraction = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    fraction = float(get_fraction(device_index)) if get_fraction is not None else None
    return {
        "torch": torch.__version__,
        "gpu_name": props.name,
        "total_bytes": int(props.total_memory),
        # The probe always sets a fraction (measure/probes.py); older torch cannot report it back.
        "fraction": fraction,
        "outside_bytes": max(0, total - free - torch.cuda.memory_reserved(device_index)),
        "allocator_conf": os.environ.get("PYTORCH_ALLOC_CONF") or os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or "",
        "max_memory_reserved_window": torch.cuda.max_memory_reserved(device_index),
    }


def write_trace(path: str | Path, *, extra: dict[str, Any] | None = None) -> Path:
    """Snapshot the allocator's history now and write it compressed to ``path`` (.json.gz)."""
    import torch

    snapshot = torch.cuda.memory._snapshot()
    data = convert_snapshot(snapshot, meta={**process_meta(), **(extra or {})}, empty_cache_us=EMPTY_CACHE_CALLS)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(gzip.compress(json.dumps(data, separators=(",", ":")).encode("utf-8"), mtime=0))
    torch.cuda.memory._record_memory_history(enabled=None)
    return out


def trace_file_name(key: Mapping[str, object]) -> str:
    """A file name for a point's trace: its layout, batch, sequence and the axes off their defaults."""
    from ckptbench.config.grid import setup_label

    setup = setup_label(key).replace(" ", "-").replace("=", "-")
    parts = [str(key[k]) for k in ("model", "layout")] + [f"b{key['batch_size']}", f"s{key['seq_len']}"]
    parts.append(str(key["precision"]))
    name = "_".join([*parts, setup] if setup else parts)
    return "".join(c if c.isalnum() or c in "-_.+" else "-" for c in name) + ".json.gz"


def trace_points(cfg: SweepConfig, out_dir: Path, *, gpu_name: str | None = None) -> list[dict[str, Any]]:
    """Run every point of ``cfg`` in its own process with the allocator's history on; one trace file each.

    Returns each point's record as JSON (as the child wrote it; why it has none when it failed) with
    ``trace_file`` set: the lines of records.jsonl.
    """

    from ckptbench.processes.launch import point_request, run_child
    from ckptbench.processes.outcome import ProcessFailure

    out: list[dict[str, Any]] = []
    for point in cfg.points_list():
        path = out_dir / trace_file_name(point.key)
        request = point_request(cfg, point, gpu_name=gpu_name, known=[]).model_copy(
            update={"allocator_trace": str(path)}
        )
        with workdir("trace") as tmp:
            outcome = run_child(request, workdir=Path(tmp), timeout_s=None)  # with the point's allocator settings
        fields = outcome.fields() if isinstance(outcome, ProcessFailure) else outcome.to_json()
        out.append({**fields, "trace_file": path.name if path.exists() else None})
    return out
