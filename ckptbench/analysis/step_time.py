"""Step time from measured points: a linear model per cell, fitted by least squares, with leave-one-out error
bars, and carried over to another card only as a labelled, unvalidated estimate. Pure: numpy, no torch.

A *cell* is what a step time can be fitted across: the same model, precision, sequence length, optimizer and
techniques (every key axis but the layout, the batch size and the micro-batches), on the same card. Within a
cell the time of one optimizer step is a sum of terms, each a fitted coefficient times a feature of the point:

- ``optimizer_step``: 1 per step (the optimizer's update, the gradients' reset);
- ``per_sample``: samples per step (batch size x micro-batches): forward and backward without recomputation;
- ``attn_recompute_pflop`` and ``mlp_recompute_pflop``: the FLOPs of one more forward of every checkpointed
  layer's attention and MLP (train/flops.py), each at its own rate (attention kernels and the MLP's matmuls do
  not run equally fast);
- ``block_extra``: recomputed whole layers x samples: a whole layer also recomputes its norms and residual adds,
  memory-bound work that FLOPs do not count (attn+mlp granularity does not recompute them);
- ``ckpt_enabled``: forward-backward passes with any checkpointed module: the fixed cost of checkpointing;
- ``selective``: selectively checkpointed layers x samples: per-op checkpointing recomputes the cheap ops only,
  which FLOPs do not count either;
- ``per_pass``: forward-backward passes (micro-batches): the fixed cost of each pass.

A term no fitted point exercises is left out, and a point that needs it is not predicted ("measure to
know"): a prediction is made only where it is determined by the fitted points (its features lie in the row
space of theirs), never by an arbitrary choice among equally good fits.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ckptbench.config.grid import Point
from ckptbench.config.layouts import parse_layout
from ckptbench.config.model import ModelSpec
from ckptbench.config.presets import PRESETS
from ckptbench.estimator.gpus import GpuModel, gpu_for_name
from ckptbench.results.store import Run
from ckptbench.train.flops import ModelShape, recompute_flops_per_token

Bound = Literal["compute", "memory"]


@dataclass(frozen=True)
class Term:
    """One term of the step time: its feature's name, what it counts, and what bounds it when carried over to
    another card (compute: the bf16 peak; memory: the memory bandwidth)."""

    name: str
    counts: str
    bound: Bound


TERMS: tuple[Term, ...] = (
    Term("optimizer_step", "optimizer steps", "memory"),
    Term("per_sample", "samples (batch x micro-batches)", "compute"),
    Term("attn_recompute_pflop", "PFLOPs of recomputed attention", "compute"),
    Term("mlp_recompute_pflop", "PFLOPs of recomputed MLPs", "compute"),
    Term("block_extra", "recomputed whole layers x samples (norms, residuals)", "memory"),
    Term("ckpt_enabled", "forward-backward passes with checkpointing", "memory"),
    Term("selective", "selectively checkpointed layers x samples", "memory"),
    Term("per_pass", "forward-backward passes", "memory"),
)
# The axes a step time is fitted across, within a cell; every other key axis names the cell.
VARYING = ("layout", "batch_size", "micro_batches")
_RANK_TOL = 1e-9  # relative: singular values and row-space residuals below this are zero


def features(point: Point, shape: ModelShape) -> np.ndarray:
    """The point's value of every term (TERMS order)."""
    plan = parse_layout(point.layout, shape.num_layers)
    samples, passes = point.batch_size * point.micro_batches, point.micro_batches
    tokens = samples * point.seq_len
    per_token = recompute_flops_per_token(shape, seq_len=point.seq_len)
    g, n = plan.granularity, len(plan.layers)
    attn = n * tokens * per_token["attn"] if g in ("block", "attn", "attn+mlp") else 0
    mlp = n * tokens * per_token["mlp"] if g in ("block", "mlp", "attn+mlp") else 0
    whole = n * samples if g == "block" else 0
    selective = n * samples if g == "selective" else 0
    enabled = passes if n and g != "selective" else 0
    return np.array([1.0, samples, attn / 1e15, mlp / 1e15, whole, enabled, selective, passes], dtype=float)


def cell_of(key: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    """The cell a point's key belongs to: every key axis but the layout, batch size and micro-batches."""
    return tuple(sorted((k, v) for k, v in key.items() if k not in VARYING))


@dataclass(frozen=True)
class Observation:
    """One measured point of a cell: the mean of its runs' median step times."""

    point: Point
    step_time_s: float
    runs: tuple[str, ...]


@dataclass(frozen=True)
class LooError:
    """The leave-one-out check of one fitted point: fitted to the others, what the model predicts for it."""

    point: Point
    measured_s: float
    predicted_s: float | None  # None: the other points do not determine it (a term only it exercises)

    @property
    def error(self) -> float | None:
        """Relative error of the prediction, signed (predicted - measured) / measured."""
        return None if self.predicted_s is None else (self.predicted_s - self.measured_s) / self.measured_s


class _Fit:
    """Weighted least squares (relative errors) on the terms some point exercises; row-space checks."""

    def __init__(self, X: np.ndarray, y: np.ndarray) -> None:
        self.used = np.abs(X).max(axis=0) > 0
        self.scale = np.abs(X[:, self.used]).max(axis=0)
        Xs = X[:, self.used] / self.scale
        # Relative errors: each row divided by its measured time, so a 0.4 s point weighs as much as a 1.8 s one.
        self.coef_scaled, *_ = np.linalg.lstsq(Xs / y[:, None], np.ones(len(y)), rcond=None)
        _, sv, vt = np.linalg.svd(Xs, full_matrices=False)
        self.rowspace = vt[sv > _RANK_TOL * sv.max()] if sv.size else vt[:0]

    def determined(self, x: np.ndarray) -> bool:
        """Whether the fitted points determine the prediction at ``x`` (x lies in their row space)."""
        if np.any(x[~self.used]):
            return False
        xs = x[self.used] / self.scale
        residual = xs - self.rowspace.T @ (self.rowspace @ xs)
        return bool(np.linalg.norm(residual) <= 1e-7 * max(float(np.linalg.norm(xs)), 1.0))

    def predict(self, x: np.ndarray) -> float | None:
        return float((x[self.used] / self.scale) @ self.coef_scaled) if self.determined(x) else None

    @property
    def coefficients(self) -> np.ndarray:
        """Seconds per unit of each term (TERMS order; 0 for the terms left out)."""
        coef = np.zeros(len(self.used))
        coef[self.used] = self.coef_scaled / self.scale
        return coef


@dataclass(frozen=True)
class CellFit:
    """The step-time model of one cell on one card, and its leave-one-out errors."""

    cell: tuple[tuple[str, Any], ...]
    gpu_name: str | None
    shape: ModelShape
    observations: tuple[Observation, ...]
    loo: tuple[LooError, ...] = field(default=())

    @classmethod
    def fit(
        cls, observations: Sequence[Observation], *, shape: ModelShape, gpu_name: str | None, loo: bool = True
    ) -> CellFit:
        """Fit the cell's points; with ``loo``, check each point against a fit to the others."""
        obs = tuple(observations)
        errors: list[LooError] = []
        if loo:
            for i, o in enumerate(obs):
                rest = obs[:i] + obs[i + 1:]
                # At least two other points: one alone determines nothing worth an error bar.
                predicted = _fit_of(rest, shape).predict(features(o.point, shape)) if len(rest) >= 2 else None
                errors.append(LooError(o.point, o.step_time_s, predicted))
        return cls(cell_of(obs[0].point.key), gpu_name, shape, obs, tuple(errors))

    @property
    def _model(self) -> _Fit:
        return _fit_of(self.observations, self.shape)

    def predict_s(self, point: Point) -> float | None:
        """The fitted step time of ``point`` on this cell's card, or None where the points do not determine it."""
        return self._model.predict(features(point, self.shape))

    def term_seconds(self, point: Point) -> np.ndarray | None:
        """The fitted seconds of each term at ``point`` (sums to ``predict_s``), or None where not determined."""
        x = features(point, self.shape)
        model = self._model
        return model.coefficients * x if model.determined(x) else None

    @property
    def error_bound(self) -> float | None:
        """The largest leave-one-out relative error in the cell (None: no point could be checked)."""
        errors = [abs(e.error) for e in self.loo if e.error is not None]
        return max(errors) if errors else None

    @property
    def runs(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r for o in self.observations for r in o.runs))

    def source(self) -> str:
        """'fitted to 20 points of RUN, RUN (NVIDIA H200), leave-one-out error <= 3.9%'."""
        bound = self.error_bound
        checked = (f"leave-one-out error <= {bound:.1%}" if bound is not None
                   else "no leave-one-out check (too few points)")
        card = f" ({self.gpu_name})" if self.gpu_name else ""
        n = len(self.observations)
        return f"fitted to {n} point{'s' if n != 1 else ''} of {', '.join(self.runs)}{card}, {checked}"


def _fit_of(observations: Sequence[Observation], shape: ModelShape) -> _Fit:
    X = np.array([features(o.point, shape) for o in observations])
    y = np.array([o.step_time_s for o in observations])
    return _Fit(X, y)


@dataclass(frozen=True)
class StepTimePrediction:
    """A predicted step time: fitted on the card, or transferred from another (unvalidated), with its source."""

    step_time_s: float
    tokens_per_s: float
    source: str
    error_bound: float | None  # the cell's largest leave-one-out relative error; None when transferred
    label: Literal["fitted", "transferred"]

    def to_json(self) -> dict[str, Any]:
        """The four JSON fields every predicted point carries."""
        return {
            "predicted_step_time_s": self.step_time_s,
            "predicted_tokens_per_s": self.tokens_per_s,
            "step_time_source": self.source,
            "step_time_error_bound": self.error_bound,
        }


NO_TIME: dict[str, Any] = {
    "predicted_step_time_s": None, "predicted_tokens_per_s": None, "step_time_source": None,
    "step_time_error_bound": None,
}


@dataclass(frozen=True)
class StepTimeModel:
    """Every cell fitted from one or more runs; predicts a point on a card, or says why it cannot."""

    cells: tuple[CellFit, ...]

    @classmethod
    def from_runs(cls, runs: Sequence[Run], *, loo: bool = True) -> StepTimeModel:
        """Fit every cell the runs' ok points fill (a point measured in several runs: the mean of their medians)."""
        times: dict[tuple[Any, ...], dict[str, list[tuple[float, str]]]] = {}
        points: dict[str, Point] = {}
        shapes: dict[tuple[Any, ...], ModelShape] = {}
        for run in runs:
            for rec in run.points:
                point = rec.point
                median = rec.median_step_time_s
                if not rec.ok or point is None or not median or "busy" in rec.warning_kinds:
                    continue  # a busy host's step times mislead (measure/environment.py)
                shape = _shape(run, point.model)
                if shape is None:
                    continue
                where = (rec.gpu_name or run.environment.gpu_name, cell_of(rec.key))
                shapes.setdefault(where, shape)
                points[rec.key_id] = point
                times.setdefault(where, {}).setdefault(rec.key_id, []).append((median, _label(run)))
        cells = []
        for (gpu_name, _), by_key in times.items():
            obs = [Observation(points[k], statistics.fmean(t for t, _ in v), tuple(dict.fromkeys(r for _, r in v)))
                   for k, v in by_key.items()]
            cells.append(CellFit.fit(obs, shape=shapes[(gpu_name, _)], gpu_name=gpu_name, loo=loo))
        return cls(tuple(cells))

    @classmethod
    def from_calibration(cls, data: Mapping[str, Any], *, loo: bool = True) -> StepTimeModel:
        """The model of a calibration (``calibration_of``): each cell fitted again to the observations it keeps,
        as ``from_runs`` fits them to the runs they come from (the same predictions, the same sources)."""
        if data.get("schema") != CALIBRATION_SCHEMA:
            raise ValueError(f"a step-time calibration of schema {data.get('schema')!r}; this ckptbench reads "
                             f"{CALIBRATION_SCHEMA}")
        cells = []
        for cell in data["cells"]:
            obs = [Observation(Point.from_key(o["key"]), float(o["step_time_s"]), tuple(o["runs"]))
                   for o in cell["observations"]]
            cells.append(CellFit.fit(obs, shape=ModelShape(**cell["shape"]), gpu_name=cell["gpu_name"], loo=loo))
        return cls(tuple(cells))

    def cell_for(self, point: Point, gpu_name: str | None = None) -> CellFit | None:
        """The point's cell: on ``gpu_name`` when it was measured there, else on any card."""
        found = [c for c in self.cells if c.cell == cell_of(point.key)]
        same = [c for c in found if gpu_name is None or c.gpu_name == gpu_name]
        return (same or found)[0] if found else None

    def predict(self, point: Point, *, gpu: GpuModel | None = None) -> StepTimePrediction | None:
        """The step time of ``point`` on ``gpu`` (None: any card the model was fitted on); None when no cell
        determines it, or when carrying it to ``gpu`` lacks a card's figures."""
        cell = self.cell_for(point, gpu.name if gpu is not None else None)
        if cell is None:
            return None
        tokens = point.batch_size * point.seq_len * point.micro_batches
        if gpu is None or cell.gpu_name == gpu.name:
            seconds = cell.predict_s(point)
            if seconds is None or seconds <= 0:
                return None
            return StepTimePrediction(seconds, tokens / seconds, cell.source(), cell.error_bound, "fitted")
        return _transferred(cell, point, gpu, tokens)

    def why_not(self, point: Point, *, gpu: GpuModel | None = None) -> str:
        """Why ``predict`` gave no time for ``point``, in a few words."""
        cell = self.cell_for(point, gpu.name if gpu is not None else None)
        if cell is None:
            return "no measured point of this setup"
        if cell.predict_s(point) is None:
            return f"the {len(cell.observations)} measured points of this setup do not determine it"
        return f"no bf16 peak or memory bandwidth for {gpu.name if gpu else '?'} or {cell.gpu_name}"


def _transferred(cell: CellFit, point: Point, gpu: GpuModel, tokens: int) -> StepTimePrediction | None:
    """Carry a fitted time to another card: compute-bound terms by the bf16 peaks' ratio, memory-bound terms
    by the memory bandwidths' ratio. An estimate nothing has validated, and labelled so."""
    source = gpu_for_name(cell.gpu_name)
    terms = cell.term_seconds(point)
    if source is None or terms is None:
        return None
    peaks = (source.bf16_peak_tflops or 0.0, gpu.bf16_peak_tflops or 0.0)
    bands = (source.memory_bandwidth_bytes_per_s or 0.0, gpu.memory_bandwidth_bytes_per_s or 0.0)
    if not all((*peaks, *bands)):
        return None
    compute, memory = peaks[0] / peaks[1], bands[0] / bands[1]
    ratio = np.array([compute if t.bound == "compute" else memory for t in TERMS])
    seconds = float(terms @ ratio)
    if seconds <= 0:
        return None
    text = (
        f"transferred from {source.key.upper()} to {gpu.key.upper()} (bf16 peak {peaks[0]:g}/{peaks[1]:g} TFLOP/s, "
        f"memory bandwidth {bands[0] / 1e12:g}/{bands[1] / 1e12:g} TB/s), unvalidated; {cell.source()} on the "
        f"{source.key.upper()}"
    )
    return StepTimePrediction(seconds, tokens / seconds, text, None, "transferred")


CALIBRATION_SCHEMA = 1
CALIBRATION = "step_time_calibration.json"  # ckptbench/data/: what a plain install times steps with


def calibration_of(runs: Sequence[Run]) -> dict[str, Any]:
    """What the step-time model is fitted to, as JSON a package can ship: every cell's measured points (each point's
    key, the mean of its runs' median step times, the runs it comes from), the cell's card and model shape, and the
    runs' provenance (scripts/make_calibration.py writes it from the committed H200 runs)."""
    model = StepTimeModel.from_runs(runs, loo=False)
    return {
        "schema": CALIBRATION_SCHEMA,
        "what": "the measured points the step-time model is fitted to (analysis/step_time.py), with their runs",
        "runs": [{"path": _label(run), "gpu_name": run.environment.gpu_name, "git_sha": run.meta.git_sha,
                  "created_at": run.meta.created_at, "torch": run.environment.torch,
                  "transformers": run.environment.transformers} for run in runs],
        "cells": [{"gpu_name": c.gpu_name, "shape": dataclasses.asdict(c.shape),
                   "observations": [{"key": o.point.key, "step_time_s": o.step_time_s, "runs": list(o.runs)}
                                    for o in c.observations]} for c in model.cells],
    }


def shipped_calibration() -> StepTimeModel:
    """The step-time model of the calibration that ships with ckptbench (package data, no run directory read)."""
    text = resources.files("ckptbench").joinpath("data", CALIBRATION).read_text(encoding="utf-8")
    return StepTimeModel.from_calibration(json.loads(text))


def _label(run: Run) -> str:
    """How a source names a run: its path, relative to the working directory when it lies below it."""
    path = Path(run.path).resolve()
    return str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else str(run.path)


def _shape(run: Run, model: str) -> ModelShape | None:
    """The model's shape from the run's config (a preset and overrides), else from the preset of that name."""
    spec = run.config.get("model")
    try:
        resolved = ModelSpec.model_validate(spec).resolved() if isinstance(spec, dict) else PRESETS.get(model)
    except ValueError:
        resolved = PRESETS.get(model)
    return ModelShape.of_fields(resolved) if resolved else None
