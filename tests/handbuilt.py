"""Hand-built runs of LLaMA-7B-shaped points (no GPU, no torch): the inputs of the claims and per-layer tests.

Each point is given in GiB and milliseconds, as a reader would quote them; the builder fills in what the
runner records (key, plan, counts of checkpointed layers, tokens, the static part).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckptbench.analysis.step_time import StepTimeModel, StepTimePrediction
from ckptbench.answers.claims import Answers, answer_claims
from ckptbench.answers.evidence import Scope
from ckptbench.answers.predictions import OomFigures, PredictedPoint, Predictions
from ckptbench.answers.verdicts import Budget
from ckptbench.config.grid import AXIS_DEFAULTS, Point, key_id
from ckptbench.config.layouts import parse_layout
from ckptbench.results.meta import RunMeta
from ckptbench.results.record import PointRecord
from ckptbench.results.store import Run

GIB = 2**30
LAYERS = 32
PARAMS = 12.5 * GIB  # bf16 LLaMA-7B-like static part: params, grads, 2x AdamW state
BUDGET = Budget(80 * GIB, 4 * GIB)  # limit 76 GiB, as docs/answers.md uses


def pt(layout: str, batch: int, res: float | None = None, ms: float = 400.0, *, alloc: float | None = None,
       status: str = "ok", seq: int = 2048, precision: str = "bf16", model: str = "llama-7b",
       extra_key: dict[str, Any] | None = None, **axes: Any) -> dict[str, Any]:
    """One point record as points.jsonl holds it; ``res`` and ``alloc`` in GiB, ``ms`` the median step."""
    plan = parse_layout(layout, LAYERS)
    micro = int(axes.get("micro_batches", 1))
    key = {**AXIS_DEFAULTS, "model": model, "layout": layout, "batch_size": batch, "seq_len": seq,
           "precision": precision, **axes, **(extra_key or {})}
    rec: dict[str, Any] = {
        "key": key, "status": status, "num_checkpointed": len(plan.layers),
        "plan": {"granularity": plan.granularity, "layers": list(plan.layers), "targets": list(plan.targets)},
        "tokens_per_step": batch * seq * micro,
    }
    if status == "ok":
        assert res is not None
        alloc_b = int((alloc if alloc is not None else res - 1.0) * GIB)
        rec.update(
            peak_reserved_bytes=int(res * GIB), peak_allocated_bytes=alloc_b,
            step_times_s=[ms / 1e3] * 3, model_flops_per_step=int(6e9 * batch * seq),
            hardware_flops_per_step=int(6e9 * batch * seq * (1 + len(plan.layers) / LAYERS / 3)),
            memory={"params_bytes": int(PARAMS), "grads_bytes": int(PARAMS), "optimizer_state_bytes": int(2 * PARAMS)},
        )
    return rec


def run_of(points: list[dict[str, Any]], *, path: str = "runs/a", gpu: str = "NVIDIA H200") -> Run:
    meta = {"schema_version": 1, "name": Path(path).name, "created_at": "2026-01-01T00:00:00+00:00",
            "config": {"name": "x", "model": {"preset": "llama-7b"}, "optimizer": "adamw_fused"},
            "environment": {"gpu_name": gpu, "device_type": "cuda", "torch": "2.13.0"}}
    return Run(path=Path(path), meta=RunMeta.model_validate(meta),
               points=[PointRecord.model_validate(p) for p in points])


def answers(*runs: Run, budget: Budget = BUDGET, pr: Predictions | None = None) -> Answers:
    return answer_claims(list(runs), budget=budget, predictions=pr)


def key(layout: str, batch: int, *, seq: int = 2048, precision: str = "bf16", **axes: Any) -> dict[str, Any]:
    """The full key of a point of the scope (LLaMA-7B), as the estimator's predictions carry it."""
    return {**Scope().key(layout, batch, **axes), "seq_len": seq, "precision": precision}


def predicted(layout: str, batch: int, res: float | None = None, *, alloc: float | None = None,
              oom: tuple[float, float, float] | None = None, state: float = 2 * PARAMS / GIB, seq: int = 2048,
              precision: str = "bf16", **axes: Any) -> PredictedPoint:
    """A prediction in GiB: ``res`` peak reserved; ``oom`` (request, allocated, reserved) where the replay runs
    out; ``state`` the optimizer state (GiB)."""
    alloc_b = int((alloc if alloc is not None else (res or 0) - 1.0) * GIB)
    where = "warm-up step 2, forward of the loss and logits"
    figures = OomFigures(where, *(int(x * GIB) for x in oom)) if oom else None
    return PredictedPoint(key(layout, batch, seq=seq, precision=precision, **axes), alloc_b,
                          None if oom else int((res or 0) * GIB), figures, int(PARAMS), 0, int(state * GIB))


@dataclass(frozen=True)
class FixedTimes(StepTimeModel):
    """Step times given by hand (key -> ms), labelled fitted, as the time model would give them."""

    ms: dict[str, float] = field(default_factory=dict)

    def predict(self, point: Point, *, gpu: Any = None, ops: Any = None, shape: Any = None
                ) -> StepTimePrediction | None:
        ms = self.ms.get(point.key_id)
        if ms is None:
            return None
        return StepTimePrediction(ms / 1e3, point.tokens / (ms / 1e3), "fitted to hand-built points", 0.02, "fitted")

    def why_not(self, point: Point, *, gpu: Any = None, ops: Any = None) -> str:
        return "no measured point of this setup"


def predictions(*points: PredictedPoint, ms: dict[str, float] | None = None) -> Predictions:
    """Predictions as `ckptbench answers` hands them in, on an H200-like card; ``ms`` by key_id (see ``key``)."""
    return Predictions({p.key_id: p for p in points}, "NVIDIA H200", int(139.8 * GIB), int(0.74 * GIB),
                       "hand-built predictions", FixedTimes(cells=(), ms=ms or {}))


def times(*pairs: tuple[dict[str, Any], float]) -> dict[str, float]:
    """Step times (ms) by point key, for ``predictions``."""
    return {key_id(k): ms for k, ms in pairs}


def base_points() -> list[dict[str, Any]]:
    """A batch-2 cell like the committed H200 check: none fits, checkpointing saves ~11 GiB."""
    return [
        pt("none", 2, 63.0, 390), pt("all", 2, 52.5, 495), pt("first:16", 2, 52.6, 450),
        pt("last:16", 2, 58.7, 452), pt("every:2", 2, 53.1, 450), pt("every:4", 2, 58.0, 426),
    ]
