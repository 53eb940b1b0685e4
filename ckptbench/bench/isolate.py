"""Run each point in a fresh process (``--isolate``): a crash, a CUDA error or a hang fails one point only.

The parent keeps the sweep's bookkeeping (skips after OOM, loss references) and never builds a
model. Each point runs in ``python -m ckptbench.bench.point_process REQUEST.json``, which rebuilds the same
config, re-expands the grid, picks the point by its key and writes its record to a JSON file.
The parent records a process that dies, exits without a record or outlives ``--point-timeout``
as a failed point (``status: error``) with the tail of its stderr.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckptbench.bench.alloc_trace import start_recording, write_trace
from ckptbench.bench.child import run_child
from ckptbench.bench.device import make_probe, resolve_device
from ckptbench.bench.runner import Runner, merge_child_record
from ckptbench.config.alloc_conf import axis_to_conf
from ckptbench.config.grid import Point
from ckptbench.config.layouts import LayoutPlan, parse_layout
from ckptbench.config.load import parse_config
from ckptbench.results.record import PointRecord
from ckptbench.results.store import write_json_atomic


@dataclass
class IsolatedRunner(Runner):
    """A Runner whose points each run in a child process; the parent holds no model."""

    point_timeout_s: float | None = None
    _history: list[dict[str, Any]] = field(default_factory=list)

    def remember(self, point: Point, record: PointRecord) -> None:
        super().remember(point, record)
        if record.status in ("ok", "oom"):
            self._history.append(record.to_json())  # sent to later children: loss references and OOM skips

    def _measure_safely(self, point: Point, plan: LayoutPlan, base: dict[str, Any]) -> dict[str, Any]:
        request = {
            "config": self.cfg.model_dump(mode="json"),
            "key": point.key,
            "gpu_name": self.gpu_name,
            "done": self._history,
            "parent_pid": os.getpid(),
        }
        with tempfile.TemporaryDirectory(prefix="ckptbench-point-") as tmp:
            record = run_child(
                request, workdir=Path(tmp), timeout_s=self.point_timeout_s, alloc_conf=axis_to_conf(point.allocator)
            )
        return {**merge_child_record(base, record), "isolated": True}

    def _measure_fresh(self, point: Point, base: dict[str, Any]) -> dict[str, Any]:
        return self._measure_safely(point, parse_layout(point.layout, self.shape.num_layers), base)


# ---------------------------------------------------------------- the child side


def _exit_with_parent(parent_pid: int) -> None:
    """End this process when the parent sweep is gone (it was killed): never hold the GPU orphaned."""

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent_pid:
                os._exit(3)

    threading.Thread(target=watch, daemon=True, name="ckptbench-parent-watch").start()


def child_main(request_path: str) -> int:
    """Entry point of ``python -m ckptbench.bench.point_process``: run one point, write its record."""
    request = json.loads(Path(request_path).read_text(encoding="utf-8"))
    _exit_with_parent(int(request["parent_pid"]))
    trace_path = request.get("allocator_trace")
    if trace_path:  # before anything touches the GPU: the trace starts from an empty allocator
        start_recording()
    cfg = parse_config(request["config"], source="isolated point config")
    device = resolve_device(cfg)
    runner = Runner(cfg, device, make_probe(cfg, device), gpu_name=request.get("gpu_name"), own_process=True)
    for done in request["done"]:
        record = PointRecord.model_validate(done)
        runner.remember(Point.from_key(record.key), record)
    point = Point.from_key(request["key"])  # a grid point or a search probe
    Path(request["ready"]).touch()  # from here on, --point-timeout applies
    try:
        # The parent already decided this point runs (OOM skips are its call), so never skip here.
        record = runner.run_point(point, allow_skip=False)
        if trace_path:
            fraction = getattr(runner.probe, "fraction", None)  # what the probe set (older torch cannot read it)
            write_trace(trace_path, extra={"key": point.key, "status": record.status, "fraction": fraction})
    finally:
        runner.close()
    write_json_atomic(Path(request["result"]), record.to_json())
    return 0
