"""Predict the peak allocated memory of every point of a sweep without running it (pure: no printing).

A prediction is the live-bytes trace of ckptbench's own training step (same model builder,
checkpoint wrapping, precision handling and optimizer) run on fake tensors
(estimate/trace.py), seen through a kernel model of the target device: ``cuda`` models the
CUDA kernels and caching allocator (what ``torch.cuda.max_memory_allocated`` reports), ``cpu``
what ckptbench's live-tensor tracker measures on CPU (estimate/device_model.py says what differs).

``method="fast"`` (default) traces one short model per (precision, seq_len, batch_size) and
re-assembles every layout from per-layer costs (estimate/assembly.py); ``method="full"``
traces the whole model for every point. The peak is that of a sweep's measured window: the
steady-state step (optimizer state present, gradients freed by the previous step), plus what
each measured step keeps alive for the next (the detached loss the runner records).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ckptbench.config.grid import Point
from ckptbench.config.layouts import parse_layout
from ckptbench.config.schema import SweepConfig
from ckptbench.errors import ConfigError
from ckptbench.estimate.assembly import (
    Peak,
    StepCosts,
    assemble,
    describe_segment,
    layer_classes,
    plans_for,
    short_model_classes,
)
from ckptbench.estimate.record import CATEGORIES, Estimate, EstimateProgress
from ckptbench.estimate.trace import StepTrace, trace_optimizer, trace_step
from ckptbench.estimate.tracker import GRADS, OPTIMIZER_STATE, PARAMS
from ckptbench.train.unavailable import TechniqueUnavailable
from ckptbench.units import GIB

Target = Literal["cpu", "cuda"]
Method = Literal["fast", "full"]

Job = tuple[str, Callable[[], None]]


@dataclass
class Estimator:
    """Runs the traces that points need (each once) and turns them into estimates."""

    cfg: SweepConfig
    target: Target = "cuda"
    method: Method = "fast"
    _costs: dict[tuple[Any, ...], StepCosts] = field(default_factory=dict)
    _optim: dict[tuple[Any, ...], StepTrace] = field(default_factory=dict)
    _full: dict[Point, Peak] = field(default_factory=dict)
    _classes: dict[tuple[Any, ...], set[str]] = field(default_factory=dict)
    _failed: dict[Any, str] = field(default_factory=dict)

    def classes(self, point: Point) -> list[str]:
        return layer_classes(parse_layout(point.layout, self.cfg.model.num_layers))

    def _short_key(self, point: Point) -> tuple[Any, ...]:
        """What a short-model trace depends on, ending with the layer classes it must contain."""
        shape = _shape_key(point)
        return (*shape, tuple(short_model_classes(self._classes[shape])))

    def jobs(self, points: Sequence[Point]) -> list[Job]:
        """The traces ``points`` still need, each with a progress label."""
        jobs: list[Job] = []
        for key, p in {_optim_key(p): p for p in points}.items():
            if key not in self._optim and key not in self._failed:
                label = f"{p.precision} {p.optimizer}: optimizer step of the whole model"
                jobs.append((label, self._guarded(key, self._trace_optim, p)))
        if self.method == "full":
            todo = [p for p in dict.fromkeys(points) if p not in self._full]
            return jobs + [(_label(p, "whole model"), self._guarded(p, self._trace_full, p)) for p in todo]
        for p in points:
            self._classes.setdefault(_shape_key(p), set()).update(self.classes(p))
        for key, p in {self._short_key(p): p for p in points}.items():
            if key not in self._costs and key not in self._failed:
                label = _label(p, f"{len(key[-1])}-layer model")
                jobs.append((label, self._guarded(key, self._trace_short, p)))
        return jobs

    def _guarded(self, key: Any, trace: Callable[[Point], None], point: Point) -> Callable[[], None]:
        def run() -> None:
            try:
                trace(point)
            except (TechniqueUnavailable, ModuleNotFoundError) as exc:
                self._failed[key] = str(exc).splitlines()[0]

        return run

    def _trace_optim(self, point: Point) -> None:
        self._optim[_optim_key(point)] = trace_optimizer(self.cfg, point, target=self.target)

    def _trace_short(self, point: Point) -> None:
        key = self._short_key(point)
        classes, micro = key[-1], min(point.micro_batches, 2)
        trace = trace_step(
            self.cfg, point, target=self.target, plans=plans_for(classes), num_layers=len(classes),
            micro_batches=micro, defer_shared=True,
        )
        self._costs[key] = StepCosts.from_trace(trace, classes, micro)

    def _trace_full(self, point: Point) -> None:
        self._full[point] = Peak.of_trace(trace_step(self.cfg, point, target=self.target))

    def ready(self, point: Point) -> bool:
        """Whether every trace ``point`` needs has run (or failed): ``estimate`` can answer now."""
        optim = _optim_key(point)
        trace_key: Any = point if self.method == "full" else self._short_key(point)
        traced = trace_key in (self._full if self.method == "full" else self._costs)
        return (optim in self._optim or optim in self._failed) and (traced or trace_key in self._failed)

    def estimate(self, point: Point, *, budget_bytes: int | None = None) -> Estimate:
        """The estimate of one point (its traces must have run: see ``jobs``)."""
        trace_key: Any = point if self.method == "full" else self._short_key(point)
        failure: str | None = self._failed.get(_optim_key(point)) or self._failed.get(trace_key)
        if failure is not None:
            note = f"not estimated: {failure}"
            return Estimate(point, self.target, self.method, None, {}, {}, None, budget_bytes, note)
        if self.method == "full":
            peak = self._full[point]
        else:
            optim = self._optim[_optim_key(point)]
            peak = assemble(self._costs[trace_key], optim, self.classes(point), point.micro_batches)
        vector = peak.after_steps(self.cfg.measured_steps)
        compile_note = "torch.compile is not modelled: the eager step is estimated" if point.compile else None
        return Estimate(
            point=point, target=self.target, method=self.method, peak_bytes=sum(vector),
            breakdown=dict(zip(CATEGORIES, vector, strict=True)), static=self._static(point),
            peak_at=describe_segment(peak.label), budget_bytes=budget_bytes, note=compile_note,
        )

    def _static(self, point: Point) -> dict[str, int]:
        """Parameters, gradients (all of them, at the end of backward) and optimizer state, in bytes."""
        optim = self._optim[_optim_key(point)]
        grads = optim.static[GRADS] + max(optim.get("grads").delta[GRADS], 0)
        return {
            "params_bytes": optim.static[PARAMS],
            "grads_bytes": grads,
            "optimizer_state_bytes": optim.static[OPTIMIZER_STATE],
        }


def _shape_key(point: Point) -> tuple[Any, ...]:
    """Everything but the layout that shapes a step's per-layer costs."""
    return (
        point.precision, point.seq_len, point.batch_size, point.optimizer, point.lora, point.offload,
        point.attn_implementation, min(point.micro_batches, 2), point.loss, point.optimizer_in_backward,
        point.optimizer_offload,
    )


def _optim_key(point: Point) -> tuple[Any, ...]:
    return (point.precision, point.optimizer, point.lora, point.optimizer_in_backward, point.optimizer_offload)


def _label(point: Point, what: str) -> str:
    return f"{point.precision} b={point.batch_size} s={point.seq_len}: {what}"


def estimate_points(
    cfg: SweepConfig,
    points: Sequence[Point],
    *,
    target: Target = "cuda",
    method: Method = "fast",
    budget_bytes: int | None = None,
    on_progress: Callable[[EstimateProgress], None] | None = None,
) -> list[Estimate]:
    """Predict the measured-window peak of each point; ``on_progress`` hears of every trace."""
    est = Estimator(cfg, target=target, method=method)
    jobs = est.jobs(points)
    for i, (label, job) in enumerate(jobs):
        if on_progress is not None:
            on_progress(EstimateProgress(i, len(jobs), label))
        job()
    if on_progress is not None:
        on_progress(EstimateProgress(len(jobs), len(jobs), "done"))
    return [est.estimate(p, budget_bytes=budget_bytes) for p in points]


def resolve_target(cfg: SweepConfig, target: str | None) -> Target:
    """``--target`` when given ('cuda' or 'cpu'), else the device the config's sweep would run on."""
    if target is None:
        return "cpu" if cfg.device == "cpu" else "cuda"
    if target not in ("cuda", "cpu"):
        raise ConfigError(f"--target: {target!r} is not one of cuda, cpu")
    return target  # type: ignore[return-value]


def estimate_config(
    cfg: SweepConfig,
    *,
    target: str | None = None,
    budget_bytes: int | None = None,
    method: Method = "fast",
    on_progress: Callable[[EstimateProgress], None] | None = None,
) -> list[Estimate]:
    """Estimate every point of ``cfg`` (in execution order) against a budget, by default its memory cap."""
    if budget_bytes is None and cfg.memory_cap_gib is not None:
        budget_bytes = int(cfg.memory_cap_gib * GIB)
    return estimate_points(
        cfg, cfg.points_list(), target=resolve_target(cfg, target), method=method,
        budget_bytes=budget_bytes, on_progress=on_progress,
    )


def predict_points(cfg: SweepConfig, points: Sequence[Point], *, target: Target = "cuda") -> dict[str, int | None]:
    """Predicted peak allocated bytes by ``Point.key_id``, for a sweep to record next to its measurement."""
    return dict(iter_predictions(cfg, points, target=target))


def iter_predictions(
    cfg: SweepConfig, points: Sequence[Point], *, target: Target = "cuda"
) -> Iterator[tuple[str, int | None]]:
    """(key_id, predicted peak allocated bytes) of each point as soon as its traces have run.

    The traces are those estimate_points runs (every point's layer classes are registered before the
    first trace), in the points' order, so a sweep measuring the points in that order gets the first
    predictions first (bench/predictions.py makes them in a background process).
    """
    est = Estimator(cfg, target=target)
    pending = list(points)
    for _, job in est.jobs(points):
        job()
        ready = [p for p in pending if est.ready(p)]
        pending = [p for p in pending if p not in ready]
        yield from ((p.key_id, est.estimate(p).peak_bytes) for p in ready)
    yield from ((p.key_id, est.estimate(p).peak_bytes) for p in pending)
