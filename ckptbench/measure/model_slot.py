"""The runner's one live model: built (and sharded) on the device when a point's setup needs another."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from ckptbench.config.grid import Point, model_setup
from ckptbench.config.schema import SweepConfig
from ckptbench.measure.probes import Probe
from ckptbench.measure.window import Tracking
from ckptbench.train.model import apply_lora, build_model, warm_device_libraries
from ckptbench.train.parallel import Sharded, device_mesh, shard
from ckptbench.train.step import param_dtype


@dataclass
class ModelSlot:
    """The model of the last setup (the axes config/grid.py declares ``builds_model``: precision, LoRA, parallel);
    ``build`` replaces it when that changes."""

    setup: tuple[Any, ...] | None = None
    model: Any = None
    sharded: Sharded | None = None
    build_s: float | None = None  # how long the last build took, until a record takes it

    def holds(self, point: Point) -> bool:
        return self.setup == model_setup(point)

    def build(self, point: Point, *, cfg: SweepConfig, device: torch.device, probe: Probe) -> None:
        """Build the point's model on ``device`` (the old one must be freed first) and count it."""
        t0 = time.perf_counter()
        dtype = param_dtype(point.precision)
        warm_device_libraries(device, dtype)
        model: Any = build_model(cfg.model, device=device, dtype=dtype, seed=cfg.seed)
        if point.lora != "none":
            model = apply_lora(model, rank=int(point.lora[1:]), spec=cfg.lora)
        probe.adopt([*model.parameters(), *model.buffers()])
        # Under the CPU tracker: fully_shard's new shards and DDP's gradient buckets are counted.
        mesh = device_mesh(point.parallel, device)
        with Tracking(probe):
            self.sharded = shard(model, point.parallel, precision=point.precision, device=device, mesh=mesh)
        probe.sync()
        self.model, self.setup = model, model_setup(point)
        self.build_s = time.perf_counter() - t0

    def take_build_s(self) -> float | None:
        """The last build's time, once: the next point reuses the model and built nothing."""
        build_s, self.build_s = self.build_s, None
        return build_s
