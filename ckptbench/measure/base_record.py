"""A point's record before it is measured: its plan, FLOPs, predictions, probe and placement."""

from __future__ import annotations

import os
from typing import Any

from ckptbench.config.grid import Point
from ckptbench.config.layouts import LayoutPlan


def base_record(
    point: Point,
    plan: LayoutPlan,
    *,
    flops: tuple[int, int],
    peak_tflops: float | None,
    predicted: dict[str, Any] | None,
    probe_kind: str,
    points_before: int,
    placement: dict[str, Any],
) -> dict[str, Any]:
    """The fields every record of ``point`` starts from; ``flops``: train/flops.py's (model, hardware) per step."""
    model_flops, hw_flops = flops
    return {
        "key": point.key,
        "status": None,
        "reason": None,
        "plan": {"layers": list(plan.layers), "granularity": plan.granularity, "targets": list(plan.targets)},
        "layers_checkpointed": plan.describe_layers(),
        "num_checkpointed": len(plan.layers),
        "tokens_per_step": point.tokens,
        "model_flops_per_step": model_flops,
        "hardware_flops_per_step": hw_flops,
        # Of all the point's GPUs: FLOPs and tokens per step count every rank.
        "peak_tflops": peak_tflops * point.world_size if peak_tflops else None,
        # Estimates (ckptbench estimate), made before the point runs, kept next to the measurement.
        **(predicted or {}),
        "probe": probe_kind,
        "process": "in-process",
        "points_before": points_before,
        "allocator_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        **placement,
    }
