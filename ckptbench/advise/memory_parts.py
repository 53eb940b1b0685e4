"""What fills the memory of one setup at its peak, in parts that add up to what the table says it needs, and the
user's nvidia-smi figure set against the same parts.

The parts: the allocated bytes by category (they add up to the predicted peak allocated), the allocator's cached
but free blocks (the predicted peak reserved less that), the bound's margin (the peak reserved raised by the worst
under-prediction seen for its kind of layout: results/fit.py) and the card's CUDA context. Together: 'needed'.
nvidia-smi shows the process's reserved memory and its context: the prediction of that is 'needed' less the
bound's margin.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ckptbench.advise.predictor import Predictor
from ckptbench.advise.record import Option, Part
from ckptbench.advise.request import AdviseRequest
from ckptbench.advise.verdict import Outcome, gib
from ckptbench.config.grid import Point

_CLOSE = 0.03  # an observed figure within 3% of the prediction is explained by it


def parts(option: Option, *, context_label: str) -> list[Part]:
    """The parts of ``option``'s peak (see the module docstring); the allocated ones only when the replayed
    allocator runs out first (there is no reserved figure)."""
    e = option.estimate
    if e.peak_bytes is None:
        return []
    b = e.breakdown
    out = [
        Part("parameters", b["params"], "predicted"), Part("gradients", b["grads"], "predicted"),
        Part("optimizer state", b["optimizer_state"], "predicted"),
        Part("saved activations", b["activations"], "predicted"),
        Part("logits and loss", b["logits_loss"], "predicted"),
        Part("workspaces and buffers", b["transient"] + b["other"], "predicted"),
    ]
    r, bound = e.reserved, e.reserved_bound_bytes
    if r is not None and r.peak_reserved_bytes is not None and bound is not None:
        out += [Part("cached but free (allocator)", r.peak_reserved_bytes - e.peak_bytes, "predicted"),
                Part("bound's margin (worst under-prediction seen)", bound - r.peak_reserved_bytes, "predicted"),
                Part("CUDA context", r.context_bytes, context_label)]
    elif r is None:  # not replayed (verdict.py: ALLOCATED_ONLY): the context is still part of what it needs
        out.append(Part("CUDA context", option.verdict.limit.card.context_bytes, context_label))
    return out


def expected_smi_bytes(option: Option) -> int | None:
    """What nvidia-smi should show for the setup: its predicted peak reserved plus the context."""
    r = option.estimate.reserved
    if r is None or r.peak_reserved_bytes is None:
        return None
    return r.peak_reserved_bytes + r.context_bytes


def observed(pred: Predictor, option: Option, request: AdviseRequest) -> list[str]:
    """The user's nvidia-smi figure against ``option``'s parts, and setups that would show it when they differ."""
    seen = request.observed_bytes()
    if seen is None:
        return []
    e = option.estimate
    at = f"{option.setup} at batch {e.point.batch_size}"
    expected = expected_smi_bytes(option)
    if expected is None:
        return [f"Observed {gib(seen)}: {at}: {option.verdict.reason()}, so your figure comes from another setup.",
                *_setups_near(pred, e.point, seen)]
    r = e.reserved
    assert r is not None and r.peak_reserved_bytes is not None and e.peak_bytes is not None
    cache = r.peak_reserved_bytes - e.peak_bytes
    lines = [f"Observed {gib(seen)} (nvidia-smi: the process's reserved memory and its CUDA context) against {at}: "
             f"allocated peak {gib(e.peak_bytes)}, the allocator's cache {gib(cache)} and the context "
             f"{gib(r.context_bytes)} make {gib(expected)} (predicted; the bound adds "
             f"{gib((e.reserved_bound_bytes or 0) - r.peak_reserved_bytes)} to the table's figure)."]
    gap = seen - expected
    if abs(gap) <= _CLOSE * seen:
        lines.append(f"{gib(seen)} is {gib(abs(gap))} {'above' if gap >= 0 else 'below'} the predicted "
                     f"{gib(expected)}: the prediction explains your figure.")
    else:
        lines.append(f"{gib(seen)} is {gib(abs(gap))} {'above' if gap > 0 else 'below'} the predicted "
                     f"{gib(expected)}: your setup differs.")
        lines += _setups_near(pred, e.point, seen)
    return lines


def _setups_near(pred: Predictor, point: Point, seen: int) -> list[str]:
    candidates: list[tuple[str, dict[str, Any]]] = [
        ("precision amp_bf16 (fp32 weights and AdamW state)", {"precision": "amp_bf16"}),
        ("precision bf16 (pure bf16)", {"precision": "bf16"}),
        ("optimizer adamw_foreach", {"optimizer": "adamw_foreach"}),
        (f"batch {point.batch_size * 2}", {"batch_size": point.batch_size * 2}),
        ("eager attention (no flash kernels)", {"attn_implementation": "eager"}),
    ]
    if point.seq_len * 2 <= int(pred.cfg.model.resolved()["max_position_embeddings"]):
        candidates.append((f"sequence {point.seq_len * 2}", {"seq_len": point.seq_len * 2}))
    found: list[tuple[str, int | None, str]] = []
    for what, change in candidates:
        if all(getattr(point, k) == v for k, v in change.items()):
            continue
        option = pred.option("none", dataclasses.replace(point, **change))
        shows = expected_smi_bytes(option)
        if shows is not None:
            found.append((what, shows, f"would show {gib(shows)} (predicted)"))
        elif option.verdict.outcome is Outcome.ALLOCATOR_OOM:
            found.append((what, None, "runs out of memory (predicted)"))
    found.sort(key=lambda item: abs((item[1] if item[1] is not None else 10**15) - seen))
    lines = [f"  with {what}: {words}" for what, _, words in found[:3]]
    return ["Setups nearest your figure (the same layout and batch otherwise):", *lines] if lines else []
