"""Step time from measured points: a linear model per cell, fitted by least squares, with leave-one-out error
bars (*fitted*); elsewhere the op model of analysis/op_time.py, calibrated on the same points from each point's
traced ops (*modelled* on a calibrated card, with its leave-one-cell-out error bar; *transferred* to another card by
its datasheet figures, class by class, unvalidated). Pure: numpy, no torch.

``StepTimeModel.predict`` answers in that order: inside a measured cell on its card the fitted model (it is within
1.45% leave-one-out on the committed whole-layer and granular points, the op model within 2.2%); in another cell the
op model, given the point's op costs (``Estimator.op_costs``); without them, a fitted cell carried to another card.

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
import functools
import json
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ckptbench.analysis.op_time import OpTimeModel, Rates, Sample, card_of, not_modelled
from ckptbench.config.cards import BY_KEY, Card
from ckptbench.config.grid import Point
from ckptbench.config.layouts import parse_layout
from ckptbench.config.model import ModelSpec
from ckptbench.config.presets import PRESETS
from ckptbench.estimator.gpus import GpuModel, gpu_for_name
from ckptbench.results.store import Run
from ckptbench.train.flops import ModelShape, OpCosts, recompute_flops_per_token, step_flops

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


Label = Literal["fitted", "modelled", "transferred"]


@dataclass(frozen=True)
class StepTimePrediction:
    """A predicted step time with its source: *fitted* inside a measured cell, *modelled* from each op's FLOPs and
    bytes in another cell of a calibrated card (analysis/op_time.py), or *transferred* to another card by its
    datasheet figures (unvalidated)."""

    step_time_s: float
    tokens_per_s: float
    source: str
    error_bound: float | None  # fitted: the cell's largest leave-one-out error; modelled: leave-one-cell-out
    label: Label
    mfu: float | None = None  # model FLOPs / (time x the card's dense peak of the precision's dtype): implied
    terms: tuple[tuple[str, float], ...] = ()  # modelled and transferred: seconds of each op class (sum: the time)

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
    """Every cell fitted from one or more runs, and per card the op model calibrated on the same points (where their
    op costs were given); predicts a point on a card, or says why it cannot."""

    cells: tuple[CellFit, ...]
    op_models: tuple[OpTimeModel, ...] = ()

    @classmethod
    def from_runs(cls, runs: Sequence[Run], *, loo: bool = True, ops: Mapping[str, OpCosts] | None = None
                  ) -> StepTimeModel:
        """Fit every cell the runs' ok points fill (a point measured in several runs: the mean of their medians);
        with ``ops`` (each point's op costs by key_id: estimator.run_op_costs), calibrate the op model too."""
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
        return cls(tuple(cells), _op_models(cells, ops or {}, checks=loo))

    @classmethod
    def from_calibration(cls, data: Mapping[str, Any], *, loo: bool = True) -> StepTimeModel:
        """The model of a calibration (``calibration_of``): each cell fitted again to the observations it keeps,
        as ``from_runs`` fits them to the runs they come from (the same predictions, the same sources), and the op
        model calibrated again on the op costs they keep."""
        if data.get("schema") != CALIBRATION_SCHEMA:
            raise ValueError(f"a step-time calibration of schema {data.get('schema')!r}; this ckptbench reads "
                             f"{CALIBRATION_SCHEMA}")
        cells, ops = [], {}
        for cell in data["cells"]:
            obs = [Observation(Point.from_key(o["key"]), float(o["step_time_s"]), tuple(o["runs"]))
                   for o in cell["observations"]]
            ops.update({Point.from_key(o["key"]).key_id: OpCosts.from_json(o["ops"])
                        for o in cell["observations"] if o.get("ops") is not None})
            cells.append(CellFit.fit(obs, shape=ModelShape(**cell["shape"]), gpu_name=cell["gpu_name"], loo=loo))
        return cls(tuple(cells), _op_models(cells, ops, checks=loo, kept=data.get("op_models") or ()))

    def cell_for(self, point: Point, gpu_name: str | None = None) -> CellFit | None:
        """The point's cell: on ``gpu_name`` when it was measured there, else on any card."""
        found = [c for c in self.cells if c.cell == cell_of(point.key)]
        same = [c for c in found if gpu_name is None or c.gpu_name == gpu_name]
        return (same or found)[0] if found else None

    def op_model_for(self, gpu_name: str | None) -> OpTimeModel | None:
        """The op model calibrated on ``gpu_name`` (None: the first calibrated), or None."""
        found = [m for m in self.op_models if gpu_name is None or m.card == gpu_name]
        return found[0] if found else None

    def predict(self, point: Point, *, gpu: GpuModel | None = None, ops: OpCosts | None = None,
                shape: ModelShape | None = None) -> StepTimePrediction | None:
        """The step time of ``point`` on ``gpu`` (None: a card the model was fitted on): *fitted* where its
        measured cell determines it; else, given its ``ops`` (Estimator.op_costs), *modelled* by the op model of
        that card, or *transferred* from another card's, class by class; without ``ops``, a fitted cell carried to
        another card. None when nothing determines it (``why_not`` says why). ``shape``: the model's, for the
        implied MFU (default: its preset's)."""
        tokens = point.batch_size * point.seq_len * point.micro_batches
        shape = shape or _preset_shape(point.model)
        cell = self.cell_for(point, gpu.name if gpu is not None else None)
        if cell is not None and (gpu is None or cell.gpu_name == gpu.name):
            seconds = cell.predict_s(point)
            if seconds is not None and seconds > 0:
                return StepTimePrediction(seconds, tokens / seconds, cell.source(), cell.error_bound, "fitted",
                                          _mfu(point, shape, seconds, card_of(cell.gpu_name)))
        if ops is not None and not_modelled(point.key) is None:
            found = self._by_ops(point, ops, gpu, tokens, shape)
            if found is not None:
                return found
        if cell is not None and gpu is not None and cell.gpu_name != gpu.name:
            return _transferred(cell, point, gpu, tokens)
        return None

    def _by_ops(self, point: Point, ops: OpCosts, gpu: GpuModel | None, tokens: int, shape: ModelShape | None
                ) -> StepTimePrediction | None:
        """Modelled on a calibrated card, else transferred from the first calibrated card that can time it."""
        own = self.op_model_for(gpu.name if gpu is not None else None)
        if own is not None:
            terms = own.rates.terms(ops)
            if terms is None:
                return None
            seconds = sum(terms.values())
            return StepTimePrediction(seconds, tokens / seconds, own.source(), own.error_bound, "modelled",
                                      _mfu(point, shape, seconds, card_of(own.card)), tuple(terms.items()))
        target = _card(gpu)
        for model in self.op_models if target is not None else ():
            rates = model.rates.on_card(target)  # type: ignore[arg-type]
            terms = rates.terms(ops) if rates is not None else None
            if terms is None:
                continue
            seconds = sum(terms.values())
            source_card = card_of(model.card)
            on = f" on the {source_card.key.upper()}" if source_card is not None else ""
            source = f"{_transfer_words(source_card, target)}; {model.source()}{on}"  # type: ignore[arg-type]
            return StepTimePrediction(seconds, tokens / seconds, source, None, "transferred",
                                      _mfu(point, shape, seconds, target), tuple(terms.items()))
        return None

    def why_not(self, point: Point, *, gpu: GpuModel | None = None, ops: OpCosts | None = None) -> str:
        """Why ``predict`` gave no time for ``point``, in a few words."""
        cell = self.cell_for(point, gpu.name if gpu is not None else None)
        if cell is not None and cell.predict_s(point) is None and ops is None:
            return f"the {len(cell.observations)} measured points of this setup do not determine it"
        if not self.op_models:
            return "no measured point of this setup" if cell is None else \
                f"no bf16 peak or memory bandwidth for {gpu.name if gpu else '?'} or {cell.gpu_name}"
        reason = not_modelled(point.key)
        if reason is not None:
            return f"no measured point of this setup, and {reason}"
        if ops is None:
            return "no measured point of this setup (its ops were not traced)"
        own = self.op_model_for(gpu.name if gpu is not None else None)
        rates: Rates | None = own.rates if own is not None else None
        if rates is None and _card(gpu) is not None:
            rates = self.op_models[0].rates.on_card(_card(gpu))  # type: ignore[arg-type]
        if rates is None:
            return f"no figures of {gpu.name if gpu else 'this card'} to carry the op rates to"
        missing = rates.missing(ops)
        return f"no calibrated rate for its {', '.join(missing)} ops" if missing else "not determined"


def _samples(cells: Sequence[CellFit], ops: Mapping[str, OpCosts]) -> dict[str | None, list[Sample]]:
    """Per card, the cells' points whose op costs are known and timed per op, in the cells' order."""
    by_card: dict[str | None, list[Sample]] = {}
    for cell in cells:
        for o in cell.observations:
            costs = ops.get(o.point.key_id)
            if costs is not None and not_modelled(o.point.key) is None:
                by_card.setdefault(cell.gpu_name, []).append(Sample(o.point.key, cell.cell, costs, o.step_time_s))
    return by_card


def _op_models(cells: Sequence[CellFit], ops: Mapping[str, OpCosts], *, checks: bool,
               kept: Sequence[Mapping[str, Any]] = ()) -> tuple[OpTimeModel, ...]:
    """Per card, the op model calibrated on the cells' points whose op costs are known (``kept``: the models a
    calibration file keeps, ``OpTimeModel.to_json``, read back instead of calibrated again)."""
    stored = {m["card"]: m for m in kept}
    found: list[OpTimeModel | None] = []
    for card, samples in _samples(cells, ops).items():
        if card in stored and (checks or not stored[card].get("loo")):
            found.append(OpTimeModel.from_json(samples, stored[card]))
        elif card in stored:
            found.append(dataclasses.replace(OpTimeModel.from_json(samples, stored[card]), loo=(), loco=()))
        else:
            found.append(OpTimeModel.calibrated(samples, card=card, checks=checks))
    return tuple(m for m in found if m is not None)


def _card(gpu: GpuModel | None) -> Card | None:
    """The card table's entry of ``gpu``; for a card given by its size with --tflops and --bandwidth, a card of those
    figures (its bf16 peak only)."""
    if gpu is None:
        return None
    found = BY_KEY.get(gpu.key)
    if found is not None or not gpu.bf16_peak_tflops or not gpu.memory_bandwidth_bytes_per_s:
        return found
    return Card(gpu.key, gpu.name, gpu.capability, gpu.total_bytes, gpu.total_source, gpu.context_bytes,
                gpu.context_source, bf16_tflops=gpu.bf16_peak_tflops, fp16_tflops=None, flops_source=gpu.peak_source,
                bandwidth_bytes_per_s=gpu.memory_bandwidth_bytes_per_s, bandwidth_source=gpu.bandwidth_source)


def _transfer_words(source: Card | None, target: Card) -> str:
    name = source.key.upper() if source is not None else "?"
    peaks = f"{source.bf16_tflops:g}/{target.bf16_tflops:g}" if source and target.bf16_tflops else "?"
    bands = f"{source.bandwidth_bytes_per_s / 1e12:g}/{target.bandwidth_bytes_per_s / 1e12:g}" if source else "?"
    return (f"transferred from {name} to {target.key.upper()} class by class (bf16 peak {peaks} TFLOP/s, memory "
            f"bandwidth {bands} TB/s), unvalidated")


def _preset_shape(model: str) -> ModelShape | None:
    fields = PRESETS.get(model)
    return ModelShape.of_fields(fields) if fields else None


def _mfu(point: Point, shape: ModelShape | None, seconds: float, card: Card | None) -> float | None:
    """Model FLOPs (train/flops.py: 6N per token plus attention; 4N with a frozen base) over the time at the card's
    dense peak of the precision's 16-bit dtype; None without a shape, a card or such a peak (fp32)."""
    if shape is None or card is None:
        return None
    dtype = "fp16" if "fp16" in point.precision else "bf16" if "bf16" in point.precision else None
    peak = {"bf16": card.bf16_tflops, "fp16": card.fp16_tflops}.get(dtype or "")
    if not peak:
        return None
    tokens = point.batch_size * point.seq_len * point.micro_batches
    model, _ = step_flops(shape, parse_layout(point.layout, shape.num_layers), tokens=tokens, seq_len=point.seq_len,
                          frozen_base=point.lora != "none")
    return model / (seconds * peak * 1e12)


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
    return StepTimePrediction(seconds, tokens / seconds, text, None, "transferred",
                              _mfu(point, cell.shape, seconds, _card(gpu)))


CALIBRATION_SCHEMA = 2
CALIBRATION = "step_time_calibration.json"  # ckptbench/data/: what a plain install times steps with


def calibration_of(runs: Sequence[Run], ops: Mapping[str, OpCosts] | None = None) -> dict[str, Any]:
    """What the step-time model is fitted to, as JSON a package can ship: every cell's measured points (each point's
    key, the mean of its runs' median step times, the runs it comes from, and with ``ops`` its step's op costs:
    estimator.run_op_costs), the cell's card and model shape, and the runs' provenance (scripts/make_calibration.py
    writes it from the committed H200 runs). The fits are made again from it when it is read."""
    model = StepTimeModel.from_runs(runs, loo=False)
    ops = ops or {}
    return {
        "schema": CALIBRATION_SCHEMA,
        "what": "the measured points the step-time model is fitted to (analysis/step_time.py) and the op model "
                "calibrated on (analysis/op_time.py: each point's ops as [class, FLOPs, bytes, count]), with their "
                "runs",
        "runs": [{"path": _label(run), "gpu_name": run.environment.gpu_name, "git_sha": run.meta.git_sha,
                  "created_at": run.meta.created_at, "torch": run.environment.torch,
                  "transformers": run.environment.transformers} for run in runs],
        "cells": [{"gpu_name": c.gpu_name, "shape": dataclasses.asdict(c.shape),
                   "observations": [{"key": o.point.key, "step_time_s": o.step_time_s, "runs": list(o.runs),
                                     "ops": ops[o.point.key_id].to_json() if o.point.key_id in ops else None}
                                    for o in c.observations]} for c in model.cells],
        # the op model as calibrated on them, with its held-out checks: read back, not refitted (no scipy, ~0.4 s)
        "op_models": [m.to_json() for m in _op_models(model.cells, ops, checks=True)],
    }


@functools.cache
def shipped_calibration() -> StepTimeModel:
    """The step-time model of the calibration that ships with ckptbench (package data, no run directory read; made
    once per process: its checks refit the op model some forty times)."""
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
