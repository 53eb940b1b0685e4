"""When nothing fits at a batch (no layout, no accumulation of micro-batches): setups that change more than the
layout, each predicted at the question's batch and sequence length with no checkpointing and then every layer
checkpointed, never one the question already has; the first that fits and trains the same model is the one
recommended (its code is printed)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from ckptbench.advise.predictor import Predictor
from ckptbench.advise.record import Table, WayOut
from ckptbench.advise.request import AdviseRequest

# (what, the point's axes it changes, whether it changes what is trained, the allow name that admits it)
_VARIANTS: tuple[tuple[str, dict[str, Any], bool], ...] = (
    ("8-bit AdamW state (bitsandbytes adamw_8bit)", {"optimizer": "adamw_8bit"}, False),
    ("AdamW state on the CPU (torchao CPUOffloadOptimizer)", {"optimizer_offload": "cpu"}, False),
    ("sharded across 2 cards (FSDP2, per card)", {"parallel": "fsdp2:2"}, False),
    ("LoRA r16 (changes what is trained)", {"lora": "r16"}, True),
)


def ways_out(pred: Predictor, table: Table, request: AdviseRequest) -> list[WayOut]:
    """Each way out the question does not already take, at no checkpointing, then at all layers if that does
    not fit."""
    base = table.none.point
    variants = [(what, change, changes, [dataclasses.replace(base, layout=lay, **change) for lay in ("none", "all")])
                for what, change, changes in _VARIANTS if _applies(base, change)]
    # Traced side by side (each variant's short model holds both layouts): not one after the other as each is judged.
    pred.warm([point for *_, points in variants for point in points])
    out: list[WayOut] = []
    for what, change, changes, points in variants:
        for point in points:
            way = WayOut(what, point, pred.verdict(point), changes, change)
            out.append(way)
            if way.fits:
                break
    return out


def _applies(base: Any, change: dict[str, Any]) -> bool:
    """Whether a way out is one the question does not take already."""
    if all(getattr(base, k) == v for k, v in change.items()):
        return False  # the question already has it
    if "parallel" in change and base.parallel != "none":
        return False  # already spread over cards: more of them is another question
    # 8-bit state replaces AdamW's; another optimizer's is another question
    return "optimizer" not in change or base.optimizer in ("adamw_fused", "adamw_foreach")


def recommended(ways: Sequence[WayOut], request: AdviseRequest) -> WayOut | None:
    """The first way out that fits and keeps what is trained (or changes it where --allow says so)."""
    for way in ways:
        if way.point.parallel != "none" and request.parallel == "none":
            continue  # a second card: named, but not the code for one card
        if way.fits and (not way.changes_training or "lora" in request.allow):
            return way
    return None
