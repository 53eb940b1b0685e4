"""One point's window with its loss check: the reference loss recomputed first when the point needs
one (once per loss cell, see measure/loss_check.py), then the measured window, then the comparison."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import torch

from ckptbench.config.grid import Point
from ckptbench.config.layouts import LayoutPlan
from ckptbench.config.schema import SweepConfig
from ckptbench.measure.loss_check import LossReferences, loss_rtol
from ckptbench.measure.probes import Probe
from ckptbench.measure.window import measure_point, recompute_first_loss, tracking
from ckptbench.train.parallel import Sharded


def measure_checked(
    model: Any,
    point: Point,
    plan: LayoutPlan,
    *,
    losses: LossReferences,
    sharded: Sharded | None,
    cfg: SweepConfig,
    probe: Probe,
    device: torch.device,
    init_std: float,
    vocab_size: int,
) -> dict[str, Any]:
    """Measure ``point`` on ``model`` (sharded as ``sharded`` says); a record's fields with its loss check."""
    common: dict[str, Any] = {"cfg": cfg, "probe": probe, "device": device, "init_std": init_std,
                              "vocab_size": vocab_size}
    recomputed, parts, fresh = None, {}, False
    if losses.needs_recomputed(point):  # before the window: the point's memory is not touched
        # The first step's loss depends only on the cell (initial weights, batch, precision): one
        # recomputation serves every layout of the cell (a 7B forward pass each time otherwise).
        recomputed = losses.recomputed(point)
        if recomputed is None:
            t0 = time.perf_counter()
            distributed = sharded is not None and sharded.spec.distributed
            # A sharded model's first forward creates FSDP2's lasting all-gather buffers (freed and
            # refilled by resizing later): the CPU tracker must see them made, as in any first step.
            # It is not reset: fresh, with the seed's weights (see measure_point).
            with tracking(probe) if distributed else contextlib.nullcontext():
                recomputed = recompute_first_loss(model, point, reset=not distributed, **common)
            if sharded is not None:
                sharded.reshard()  # fsdp2:N:noreshard keeps the forward's unsharded weights otherwise
            losses.keep_recomputed(point, recomputed)
            parts["loss_recompute"] = time.perf_counter() - t0
            fresh = True  # it reset the weights, and forward passes without gradients leave them so
    result = measure_point(model, point, plan, reset=not fresh, sharded=sharded, **common)
    result["overhead_parts_s"] = {**parts, **result.get("overhead_parts_s", {})}
    if result["status"] == "ok":
        rtol = loss_rtol(point.precision, cfg.loss_rtol)
        steps = result["warmup_losses"] + result["losses"]
        result["loss_check"] = losses.check(point, steps, rtol=rtol, recomputed=recomputed)
    return result
