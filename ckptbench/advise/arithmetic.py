"""What a setup the estimator cannot trace here would need, by arithmetic on the plain setup's prediction, labelled
so: 8-bit AdamW without bitsandbytes (two 8-bit moments and an fp32 absmax per block of 256 values in place of
AdamW's state), AdamW's state on the CPU without torchao or a GPU (the state leaves the card)."""

from __future__ import annotations

import dataclasses

from ckptbench.advise.verdict import Limit, Verdict, judge_needed
from ckptbench.config.grid import Point
from ckptbench.estimator.record import Estimate
from ckptbench.units import fmt_bytes

_BLOCK = 256  # values per absmax in bitsandbytes' blockwise 8-bit state
_FP32_WEIGHTS = ("amp_bf16", "amp_fp16", "fp32")


def plain_point(point: Point) -> Point | None:
    """The traceable setup arithmetic starts from (fused AdamW, state on the card), or None when ``point`` is
    not one arithmetic covers."""
    if point.optimizer == "adamw_8bit" and point.optimizer_offload == "none":
        return dataclasses.replace(point, optimizer="adamw_fused")
    if point.optimizer_offload == "cpu" and point.optimizer in ("adamw_fused", "adamw_foreach"):
        return dataclasses.replace(point, optimizer_offload="none")
    return None


def by_arithmetic(point: Point, plain: Estimate, limit: Limit) -> Verdict | None:
    """``point``'s verdict from ``plain`` (the prediction of ``plain_point(point)``), or None when there is none
    to start from (the plain setup runs out of memory or was not predicted either)."""
    if plain.needed_bytes is None or (plain.reserved is not None and plain.reserved.oom is not None):
        return None
    state = plain.breakdown.get("optimizer_state", 0)
    if point.optimizer == "adamw_8bit":
        params = plain.static["params_bytes"] // (4 if point.precision in _FP32_WEIGHTS else 2)
        replaced = params * 2 + params * 4 * 2 // _BLOCK  # two uint8 moments, an fp32 absmax per block each
        needed = plain.needed_bytes - state + min(state, replaced)
        label = f"predicted by arithmetic: AdamW state {fmt_bytes(state)} -> {fmt_bytes(replaced)} (8-bit)"
    else:
        needed = plain.needed_bytes - state
        label = f"predicted by arithmetic: AdamW state {fmt_bytes(state)} moved to the CPU"
    return judge_needed(needed, limit, label=label)
