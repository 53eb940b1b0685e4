"""The Runner's measurements in fresh processes: a point in its own process, a sharded point's ranks."""

from __future__ import annotations

import os
from typing import Any

import torch

from ckptbench.config.grid import Point
from ckptbench.config.schema import SweepConfig
from ckptbench.processes.launch import measure_in_process


class FreshProcesses:
    """Mixin of measure/runner.py's Runner (which holds the fields below): points measured in new processes."""

    cfg: SweepConfig
    device: torch.device
    gpu_name: str | None
    point_timeout_s: float | None
    _history: list[dict[str, Any]]  # ok/oom records, for points run elsewhere

    def close(self) -> None:
        """Free the model and return cached device memory (the Runner's)."""
        raise NotImplementedError

    def _request(self, point: Point) -> dict[str, Any]:
        """What a point's own process needs: the config, the point, and what this runner knows
        (loss references, OOMs) of the points before it."""
        return {
            "config": self.cfg.model_dump(mode="json"),
            "key": point.key,
            "gpu_name": self.gpu_name,
            "done": list(self._history),
            "parent_pid": os.getpid(),
        }

    def _in_processes(self, point: Point, base: dict[str, Any], *, timeout_s: float | None) -> dict[str, Any]:
        """Measure a point in a fresh process (one per rank for a sharded point), with its allocator settings."""
        return measure_in_process(self._request(point), base, timeout_s=timeout_s)

    def _measure_fresh(self, point: Point, base: dict[str, Any]) -> dict[str, Any]:
        """Measure a point in its own process (with its allocator settings): what a new training run sees.

        This process's model is freed first so that the child has the card; this process's CUDA context
        stays, so without a memory cap the child has that much less (about 0.7 GiB on an H200).
        """
        self.close()
        return self._in_processes(point, base, timeout_s=None)

    def _sharded(self, point: Point, base: dict[str, Any]) -> dict[str, Any]:
        """A sharded point: one fresh process per rank (this process's model and cache freed first)."""
        visible = torch.cuda.device_count() if self.device.type == "cuda" else None
        if visible is not None and point.world_size > visible:
            reason = f"{point.parallel} needs {point.world_size} GPUs; {visible} visible here"
            return {**base, "status": "skipped", "reason": reason}
        self.close()
        return self._in_processes(point, base, timeout_s=self.point_timeout_s)
