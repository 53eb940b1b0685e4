"""`ckptbench tune`: the measuring loop around tune's decisions (analysis/tune_planner.py).

The space comes from ``analysis.tune_space``; every candidate is estimated first (the estimator runs
the same Trainer on fake tensors), batch size by batch size, stopping at the first batch where
nothing is predicted to fit; then the planner proposes one point at a time and the ordinary runner
measures it as a search probe of a run directory (so ``--resume`` works and every measurement is a
recorded point). The search's decisions go into run.json under ``searches``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from ckptbench.analysis.tune_planner import Margin, TuneCandidate, TunePlanner, predicted_fit
from ckptbench.analysis.tune_space import TuneSpace
from ckptbench.config.grid import Point
from ckptbench.config.layouts import parse_layout
from ckptbench.config.schema import SweepConfig
from ckptbench.estimator.estimator import Estimator, card
from ckptbench.estimator.gpus import GpuModel
from ckptbench.estimator.record import Estimate, EstimateProgress
from ckptbench.json_object import JsonObject
from ckptbench.results.record import PointRecord
from ckptbench.train.flops import ModelShape, step_flops
from ckptbench.train.model import hf_config, model_shape


@dataclass
class TuneSearch:
    """The planner as a runner search: it proposes points and reads their records."""

    planner: TunePlanner
    clock: Callable[[], float] = time.perf_counter
    started: float | None = None
    kind: str = "tune"

    def next_point(self, budget_bytes: int | None = None) -> Point | None:
        if self.started is None:  # the time budget counts from the first proposal (after the estimates)
            self.started = self.clock()
        return self.planner.next(self.clock() - self.started)

    def observe(self, point: Point, record: PointRecord, budget_bytes: int | None) -> bool:
        self.planner.observe(point, record)
        return record.ok

    def outcome(self) -> JsonObject:
        """The search as run.json keeps it, as JSON (what the runner hands the sweep to write): the planner's
        typed ``TuneRecord``."""
        return self.planner.outcome().to_json()

    def fresh(self, point: Point) -> bool:
        return False  # every candidate in the sweep's process, as a grid point (after the cache is emptied)


@dataclass
class TuneOptions:
    """What `ckptbench tune` was asked (kept in run.json under ``tune``)."""

    budget_bytes: int
    headroom_bytes: int
    seq_len: int | None = None
    allow: tuple[str, ...] = ()
    max_points: int | None = None
    time_budget_s: float | None = None

    @property
    def limit_bytes(self) -> int:
        return self.budget_bytes - self.headroom_bytes

    def to_json(self) -> JsonObject:
        return {
            "budget_bytes": self.budget_bytes, "headroom_bytes": self.headroom_bytes, "seq_len": self.seq_len,
            "allow": list(self.allow), "max_points": self.max_points, "time_budget_s": self.time_budget_s,
        }


def estimate_candidates(
    cfg: SweepConfig,
    space: TuneSpace,
    *,
    limit_bytes: int,
    target: str,
    on_estimate: Callable[[EstimateProgress], None] | None = None,
    gpu: GpuModel | None = None,
) -> tuple[list[TuneCandidate], list[str]]:
    """Every point of the space with its estimate and hardware FLOPs, batch size by batch size; on CUDA
    with the allocator replayed on ``gpu`` (the predicted peak reserved; default the H200).

    Larger batches only need more memory, so once no point of a batch is predicted to fit (by the
    predicted reserved memory plus context, or else by allocated bytes alone, the least any margin
    allows) the larger batches are not estimated.
    """
    cuda = target == "cuda"
    estimator = Estimator(cfg, target="cuda" if cuda else "cpu", gpu=card(gpu) if cuda else None)
    shape = model_shape(hf_config(cfg.model))
    out: list[TuneCandidate] = []
    notes: list[str] = []
    for i, batch in enumerate(sorted(space.batch_sizes)):
        points = space.points(cfg.model.name, architecture=cfg.model.architecture, batch_sizes=[batch])
        jobs = estimator.jobs(points)
        for j, (label, job) in enumerate(jobs):
            if on_estimate is not None:
                on_estimate(EstimateProgress(j, len(jobs), label))
            job()
        found = [TuneCandidate(p, _hardware_flops(shape, p), _estimate(estimator, p, cfg)) for p in points]
        out += found
        fits = [predicted_fit(c.estimate, limit_bytes=limit_bytes, margin=Margin(1.0, "")).fits for c in found]
        if found and all(f is False for f in fits) and i + 1 < len(space.batch_sizes):
            larger = sorted(space.batch_sizes)[i + 1 :]
            notes.append(f"batch {batch}: no point predicted to fit; batch sizes {larger} not considered")
            break
    return out, notes


# Techniques the estimator cannot trace, and the traceable technique that stands in for them:
# (axis, value, stand-in, why it is close). None: the config's own value.
STAND_INS: tuple[tuple[str, str, str | None, str], ...] = (
    ("loss", "fused_linear", "chunked", "which, like the fused loss, never keeps the whole batch's logits"),
    ("optimizer", "adamw_8bit_torchao", None, "whose optimizer state is at least as large as 8-bit state"),
    ("optimizer", "adamw_8bit", None, "whose optimizer state is at least as large as 8-bit state"),
    ("optimizer_offload", "cpu", "none", "which keeps on the GPU the state that offloading moves to the host"),
)


def _estimate(estimator: Estimator, point: Point, cfg: SweepConfig) -> Estimate:
    """The point's estimate; for a technique that is not estimated, its stand-in's, labelled as such.

    Without it, every such candidate would have to be measured to learn that it does not fit. A
    stand-in is not exact (Liger's loss holds the LM head's gradient from the forward on; the chunked
    loss holds one chunk's fp32 logits instead); a fit is believed only once it is measured.
    """
    est = estimator.estimate(point)
    if est.peak_bytes is not None:
        return est
    stand_in, because = point, []
    for axis, value, other, why in STAND_INS:
        if getattr(stand_in, axis) == value:
            substitute = other if other is not None else cfg.optimizer
            fields: dict[str, Any] = {axis: substitute}  # an axis by name (STAND_INS): Point's fields differ in type
            stand_in = replace(stand_in, **fields)
            because.append(f"{axis}={substitute}, {why}")
    if stand_in == point:
        return est
    for _, job in estimator.jobs([stand_in]):
        job()
    bound = estimator.estimate(stand_in)
    if bound.peak_bytes is None:
        return est
    return replace(bound, point=point, note=f"stand-in: estimated as {'; '.join(because)}")


def _hardware_flops(shape: ModelShape, point: Point) -> int:
    plan = parse_layout(point.layout, shape.num_layers)
    return step_flops(shape, plan, tokens=point.tokens, seq_len=point.seq_len, frozen_base=point.lora != "none",
                      recompute_lm_head=point.loss == "chunked")[1]
