"""Step time from every op's FLOPs and bytes: a roofline per op class whose rates are calibrated on measured points,
carried to another card by its datasheet figures. Pure: numpy and scipy, no torch.

A step's ops (``train.flops.OpCosts``: counted on the traced step by estimator/op_costs.py, recomputation where the
layout recomputes) take, on one card,

    time = sum over ops of max(FLOPs x s[flop:class], bytes x s[byte:group]) + ops x s[op]
           + loop ops x s[op:optimizer:single] + s[step]

with physical parameters: seconds per FLOP of each compute class (1 / its achieved FLOP/s: ``matmul:bf16``,
``attention:sdpa:bf16``, ``attention:eager:bf16``, ...), seconds per byte of each memory group (1 / its achieved
bandwidth: ``memory`` (elementwise ops, norms, the loss, and the bytes side of every compute op), ``copy`` (casts
and copies), and the optimizer's by kernel: ``optimizer:fused``, ``optimizer:foreach``, ``optimizer:single``), a
cost per forward-backward pass with checkpointed layers, seconds per op (a kernel's launch, an op's dispatch: what
a small op costs beyond its bytes), seconds per op of a per-tensor optimizer loop beyond that (SGD's, Adafactor's:
the loop issues one op per tensor from Python, small tensors' included, and the device waits for it: 7.4 us an op on
the H200, against 1.6 us for any op) and a fixed cost per step. Communication is not timed: a step with collectives
is not modelled.

**Calibration** (``calibrate``): least squares on relative errors, each rate at most its card's datasheet peak
(``least_seconds``; a CPU has none: non-negative); the max is settled by iterating (each op is bound by the side
the current rates make longer, the rates are fitted again, until no op changes side), then refitted with the sides
following the rates (two starts, the better fit kept). A parameter the points say little about stays near the one
it falls back to (``fallbacks``: a copy or the optimizer at the memory bandwidth, the optimizer's per-tensor and
multi-tensor ops at each other's (the same streaming kernels, launched per tensor or per list of tensors), then on a
GPU at the fused kernel's; an attention kernel at its dtype's matmul rate; fp16 at bf16's rate scaled by the card's
fp16/bf16 peaks), by a weak prior on the log of their ratio (none for the loop's per-op cost: what it costs beyond
any op is the data's to say); a class under MIN_SHARE of every
point's time is not calibrated, and a parameter no point exercises *is* its fallback when a prediction needs it; a
class with none (fp32 matmuls on a card calibrated in bf16, communication) is not predicted.

**Error bars**: leave-one-out (each point predicted from a calibration on the others) and leave-one-cell-out (each
cell's points predicted from a calibration on the other cells: what a prediction in a cell nobody measured can
expect).

**Another card** (``Rates.on_card``): each compute class's seconds per FLOP scaled by the ratio of the two cards'
dense peaks of its dtype, each memory group's by the ratio of their bandwidths (config/cards.py: datasheet
figures); the per-op and per-step costs are kept. Unvalidated, and labelled so.
"""

from __future__ import annotations

import json
import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ckptbench.config.cards import Card, card_named
from ckptbench.train.flops import (
    CHECKPOINTED_PASS,
    COMMUNICATION,
    COPY,
    MEMORY,
    OPTIMIZER,
    OPTIMIZER_FOREACH,
    OPTIMIZER_FUSED,
    OPTIMIZER_SINGLE,
    OpCosts,
    is_compute,
)

STEP, OP, PASS = "step", "op", "checkpointed pass"
LOOP = "op:optimizer:single"  # seconds per op of a per-tensor optimizer loop, beyond OP's
_NO_PRIOR = frozenset({LOOP})  # falls back when uncalibrated, but is not pulled toward its fallback
# Weight of the prior that keeps a parameter near its fallback, per squared natural log of their ratio, against the
# squared relative errors of the points: a rate twice its fallback costs what a 0.07% error on one point costs.
PRIOR_WEIGHT = 1e-6
_RIDGE = 1e-9  # on the scaled parameters: only where nothing else decides (a parameter in no row)
_ITERATIONS = 40
_OTHER_DTYPE = {"bf16": "fp16", "fp16": "bf16"}


def flop_param(op_class: str) -> str:
    return f"flop:{op_class}"


def byte_param(op_class: str) -> str:
    """The bandwidth an op's bytes move at: its own group's (copy, optimizer), else the memory bandwidth (a
    checkpointed pass: its own cost, once per pass)."""
    if op_class == CHECKPOINTED_PASS:
        return PASS
    return f"byte:{op_class if op_class == COPY or op_class.startswith(OPTIMIZER) else MEMORY}"


def _units(op_class: str, nbytes: int) -> int:
    """What a class's byte-side parameter multiplies: its bytes, or 1 for a checkpointed pass."""
    return 1 if op_class == CHECKPOINTED_PASS else nbytes


def card_of(name: str | None) -> Card | None:
    return card_named(name) if name else None


def _peak(card: Card | None, dtype: str) -> float | None:
    if card is None:
        return None
    return {"bf16": card.bf16_tflops, "fp16": card.fp16_tflops}.get(dtype)


_STREAMING = {byte_param(OPTIMIZER_FOREACH): byte_param(OPTIMIZER_SINGLE),
              byte_param(OPTIMIZER_SINGLE): byte_param(OPTIMIZER_FOREACH)}


def fallbacks(param: str, card: Card | None) -> list[tuple[str, float]]:
    """What an uncalibrated parameter stands in for, in order, each with the factor on its seconds: the optimizer's
    per-tensor (single) and multi-tensor (foreach) ops' bytes at each other's (the same elementwise kernels streaming
    whole tensors: the H200 calibrates them at 3.27 and 3.22 TB/s), then on a GPU at the fused kernel's, then at the
    memory bandwidth; a copy's or another optimizer byte at the memory bandwidth; the loop's per-op cost at any op's;
    an attention kernel's FLOP at the same kernel in the other 16-bit dtype (scaled by the card's peaks), else at its
    dtype's matmul rate; a matmul's at the other 16-bit dtype's."""
    if param in _STREAMING:
        fused = [(byte_param(OPTIMIZER_FUSED), 1.0)] if card is not None else []
        return [(_STREAMING[param], 1.0), *fused, (byte_param(MEMORY), 1.0)]
    if param == LOOP:
        return [(OP, 1.0)]
    if param.startswith("byte:") and param != byte_param(MEMORY):
        return [(byte_param(MEMORY), 1.0)]
    if not param.startswith("flop:"):
        return []
    kind, _, dtype = param.removeprefix("flop:").rpartition(":")
    other = _OTHER_DTYPE.get(dtype)
    mine, theirs = _peak(card, dtype), _peak(card, other) if other else None
    ratio = theirs / mine if mine and theirs else None  # seconds per FLOP scale as 1 / peak
    found: list[tuple[str, float]] = []
    if other and ratio:
        found.append((flop_param(f"{kind}:{other}"), ratio))
    if kind != "matmul":
        found.append((flop_param(f"matmul:{dtype}"), 1.0))
        if other and ratio:
            found.append((flop_param(f"matmul:{other}"), ratio))
    return found


def not_modelled(key: Mapping[str, Any]) -> str | None:
    """Why a point's step is not timed per op (what takes its time is not among its traced ops), or None."""
    if key.get("offload", "none") != "none":
        return "activation offloading's host copies are not timed per op"
    if key.get("optimizer_offload", "none") != "none":
        return "the optimizer's host offload is not timed per op"
    if str(key.get("optimizer", "")).startswith("adamw_8bit"):
        return "the 8-bit optimizer's kernels are stood in for in the trace, not timed per op"
    if key.get("compile"):
        return "torch.compile's fused kernels are not timed per op"
    if key.get("parallel", "none") != "none":
        return "communication between ranks is not timed"
    return None


def loop_ops(ops: OpCosts, card: Card | None) -> int:
    """The ops of a per-tensor optimizer loop among ``ops`` on a GPU: their per-tensor (single) optimizer ops where
    there are more than one (one alone is a fused or multi-tensor optimizer's update of its step counters, not a
    loop). None (0) on a CPU, where nothing runs ahead of an op's dispatch: the per-op cost is all of it."""
    n = ops.count(OPTIMIZER_SINGLE) if card is not None else 0
    return n if n > 1 else 0


def params_of(ops: OpCosts, card: Card | None) -> set[str]:
    """The parameters the time of these ops needs on ``card`` (None: a CPU)."""
    found = {OP, STEP} | ({LOOP} if loop_ops(ops, card) else set())
    for c in ops.classes:
        if c == COMMUNICATION:
            continue
        found.add(byte_param(c))
        if is_compute(c):
            found.add(flop_param(c))
    return found


@dataclass(frozen=True)
class Rates:
    """One card's parameters: seconds per FLOP of each compute class, per byte of each memory group, per op and per
    step (``seconds``); ``card``: the card's name as torch reports it (None: the CPU); ``transferred_from``: the
    card they were calibrated on, when carried over by datasheet figures."""

    card: str | None
    seconds: Mapping[str, float]
    transferred_from: str | None = None

    def get(self, param: str, _seen: frozenset[str] = frozenset()) -> float | None:
        """A parameter's seconds, or its fallback's (``fallbacks``, each asked once); None when none was calibrated."""
        if param in self.seconds:
            return self.seconds[param]
        for other, factor in fallbacks(param, card_of(self.card)):
            found = None if other in _seen else self.get(other, _seen | {param})
            if found is not None:
                return found * factor
        return None

    def missing(self, ops: OpCosts) -> list[str]:
        """The classes of ``ops`` these rates cannot time (no parameter, no fallback; communication)."""
        out = [COMMUNICATION] if COMMUNICATION in ops.classes else []
        return out + [p for p in sorted(params_of(ops, card_of(self.card))) if self.get(p) is None]

    def terms(self, ops: OpCosts) -> dict[str, float] | None:
        """Seconds of each class (compute classes: their ops' roofline times), 'per-op' and 'fixed'; None when a
        class cannot be timed."""
        if self.missing(ops):
            return None
        out: dict[str, float] = {}
        for (c, flops, nbytes), n in ops.counts.items():
            t = _units(c, nbytes) * self.get(byte_param(c))  # type: ignore[operator]
            if is_compute(c):
                t = max(t, flops * self.get(flop_param(c)))  # type: ignore[operator]
            out[c] = out.get(c, 0.0) + n * t
        out["per-op"] = ops.ops * self.get(OP)  # type: ignore[operator]
        loop = loop_ops(ops, card_of(self.card))
        if loop:
            out["optimizer loop"] = loop * self.get(LOOP)  # type: ignore[operator]
        out["fixed"] = self.get(STEP)  # type: ignore[assignment]
        return out

    def time(self, ops: OpCosts) -> float | None:
        terms = self.terms(ops)
        return None if terms is None else sum(terms.values())

    def achieved(self) -> dict[str, float]:
        """Each calibrated parameter as a rate: TFLOP/s (flop:), GB/s (byte:), microseconds (op, step)."""
        out = {}
        for p, s in sorted(self.seconds.items()):
            if p.startswith("flop:"):
                out[p] = 1e-12 / s if s > 0 else math.inf
            elif p.startswith("byte:"):
                out[p] = 1e-9 / s if s > 0 else math.inf
            else:
                out[p] = s * 1e6
        return out

    def on_card(self, target: Card) -> Rates | None:
        """These rates carried to another card by datasheet figures, class by class: a compute class's seconds per
        FLOP by the ratio of the two cards' dense peaks of its dtype (bf16 or fp16; a class calibrated in one of them
        is also carried in the other, as ``fallbacks`` derives it), a memory group's by the ratio of their
        bandwidths, the per-op and per-step costs as they are. A class without a peak on either card is not carried
        (fp32: the card table holds 16-bit peaks only), unless it was calibrated free (no op of it was ever bound by
        its FLOPs); None when the rates' own card is unknown."""
        source = card_of(self.card)
        if source is None:
            return None
        out: dict[str, float] = {}
        flops = sorted({p.rpartition(":")[0] for p in self.seconds if p.startswith("flop:")})
        for kind in flops:  # 'flop:matmul'
            for dtype in ("bf16", "fp16", *{p.rpartition(":")[2] for p in self.seconds if p.startswith(kind + ":")}):
                param = f"{kind}:{dtype}"
                s = self.get(param) if param in self.seconds or dtype in _OTHER_DTYPE else None
                mine, theirs = _peak(source, dtype), _peak(target, dtype)
                if s is not None and mine and theirs:
                    out[param] = s * mine / theirs
                elif s == 0.0:
                    out[param] = 0.0
        for p, s in self.seconds.items():
            if p.startswith("byte:"):
                out[p] = s * source.bandwidth_bytes_per_s / target.bandwidth_bytes_per_s
            elif not p.startswith("flop:"):
                out[p] = s  # the host's and the launch's costs: not a datasheet figure
        return Rates(target.name, out, transferred_from=self.card)


@dataclass(frozen=True)
class Sample:
    """One measured point: its key, its cell, its step's ops and its measured step time (the mean of its runs'
    medians)."""

    key: Mapping[str, Any]
    cell: Hashable
    ops: OpCosts
    step_time_s: float


@dataclass(frozen=True)
class Check:
    """A held-out point: what a calibration without it (or without its cell) predicts."""

    key: Mapping[str, Any]
    cell: Hashable
    measured_s: float
    predicted_s: float | None

    @property
    def error(self) -> float | None:
        return None if self.predicted_s is None else (self.predicted_s - self.measured_s) / self.measured_s


class _Design:
    """The samples' ops as arrays over the parameters, and the rows a set of rates makes of them."""

    def __init__(self, samples: Sequence[Sample], params: Sequence[str], card: Card | None,
                 alias: Mapping[str, tuple[str, float]] | None = None) -> None:
        self.params = list(params)
        col = {p: i for i, p in enumerate(self.params)}
        alias = alias or {}

        def where(param: str) -> tuple[int, float]:  # its column, and the factor on the seconds there
            factor = 1.0
            while param in alias:
                param, k = alias[param]
                factor *= k
            return col.get(param, -1), factor

        self.op_col, self.step_col = col[OP], col[STEP]
        self.loop_col, self.loop_factor = where(LOOP) if LOOP in col or LOOP in alias else (-1, 1.0)
        self.rows: list[tuple[np.ndarray, ...]] = []
        self.op_counts = [float(s.ops.ops) for s in samples]
        self.loop_counts = [float(loop_ops(s.ops, card)) for s in samples]
        for s in samples:
            items = list(s.ops.counts.items())
            fwhere = [where(flop_param(c)) if is_compute(c) else (-1, 1.0) for (c, _, _), _ in items]
            bwhere = [where(byte_param(c)) for (c, _, _), _ in items]
            flops = np.array([f * k for ((_, f, _), _), (_, k) in zip(items, fwhere, strict=True)], dtype=float)
            nbytes = np.array([_units(c, b) * k for ((c, _, b), _), (_, k) in zip(items, bwhere, strict=True)],
                              dtype=float)
            count = np.array([n for _, n in items], dtype=float)
            fcol = np.array([i for i, _ in fwhere])
            bcol = np.array([i for i, _ in bwhere])
            self.rows.append((flops, nbytes, count, fcol, bcol))

    def matrix(self, theta: np.ndarray | None) -> tuple[np.ndarray, list[np.ndarray]]:
        """Each sample's row (seconds per unit of each parameter) with each op on the side ``theta`` makes longer
        (None: every compute op on its FLOPs), and which ops are compute-bound."""
        X = np.zeros((len(self.rows), len(self.params)))
        sides = []
        for i, (flops, nbytes, count, fcol, bcol) in enumerate(self.rows):
            compute = fcol >= 0
            if theta is not None:
                compute = compute & (flops * theta[np.maximum(fcol, 0)] >= nbytes * theta[bcol])
            np.add.at(X[i], fcol[compute], (count * flops)[compute])
            np.add.at(X[i], bcol[~compute], (count * nbytes)[~compute])
            X[i, self.op_col] = self.op_counts[i]
            if self.loop_col >= 0:
                X[i, self.loop_col] += self.loop_counts[i] * self.loop_factor
            X[i, self.step_col] = 1.0
            sides.append(compute)
        return X, sides


def calibrate(samples: Sequence[Sample], *, card: str | None, weight: float = PRIOR_WEIGHT) -> Rates | None:
    """The rates that fit ``samples`` best (relative errors), each op on its longer side; None without samples."""
    usable = [s for s in samples if COMMUNICATION not in s.ops.classes]
    if not usable:
        return None
    device = card_of(card)
    params = sorted(set().union(*(params_of(s.ops, device) for s in usable)))
    y = np.array([s.step_time_s for s in usable])
    theta = _fit(_Design(usable, params, device), y, params, device, weight)
    # A class too small in every point for the points to say its rate (a fused optimizer's step counters) takes
    # the rate it falls back to: fitted free, it could take any value, and would where it is not small.
    alias = _undetermined(_Design(usable, params, device), y, params, theta, device)
    if alias:
        params = [p for p in params if p not in alias]
        theta = _fit(_Design(usable, params, device, alias), y, params, device, weight)
    return Rates(card, {p: float(v) for p, v in zip(params, theta, strict=True)})


MIN_SHARE = 0.005  # of every point's time: below it a class's rate is not calibrated but its fallback's


def _undetermined(design: _Design, y: np.ndarray, params: Sequence[str], theta: np.ndarray, card: Card | None
                  ) -> dict[str, tuple[str, float]]:
    """The parameters whose ops take less than MIN_SHARE of every point's time at the rate they fall back to (one
    the prior does not pull toward its fallback: at its own fitted rate), each with that fallback and its factor."""
    X, _ = design.matrix(theta)
    found: dict[str, tuple[str, float]] = {}
    for i, j, k in _priors(params, card, every=True):
        if params[j] in found or theta[j] <= 0:
            continue
        rate = theta[i] if params[i] in _NO_PRIOR else theta[j] * math.exp(k)
        if float(np.max(X[:, i] * rate / y)) < MIN_SHARE:
            found[params[i]] = (params[j], math.exp(k))
    return found


def _fit(design: _Design, y: np.ndarray, params: Sequence[str], card: Card | None, weight: float) -> np.ndarray:
    """The rates of ``params`` that fit best: the linear fits settle each op's side, the refit moves the rates."""
    best: tuple[float, np.ndarray] | None = None
    for guarded in (False, True):  # two ways into the max's sides (``_solve``): the better fit of the two wins
        theta: np.ndarray | None = None
        sides: list[np.ndarray] | None = None
        for _ in range(_ITERATIONS):
            X, new_sides = design.matrix(theta)
            if sides is not None and all(np.array_equal(a, b) for a, b in zip(sides, new_sides, strict=True)):
                break
            sides = new_sides
            theta = _solve(X, y, params, theta, card, weight, guarded=guarded)
        assert theta is not None
        theta = _refine(design, y, params, theta, card, weight)
        score = _objective(design, y, params, theta, card, weight)
        if best is None or score < best[0]:
            best = (score, theta)
    assert best is not None
    return best[1]


def least_seconds(param: str, card: Card | None) -> float:
    """The fewest seconds a parameter can take on ``card``: one over its datasheet peak (a compute class of a dtype
    with a peak, every byte group at the memory bandwidth); 0 where the card table has no figure (a CPU, fp32)."""
    if card is None:
        return 0.0
    if param.startswith("byte:"):
        return 1.0 / card.bandwidth_bytes_per_s
    if param.startswith("flop:"):
        peak = _peak(card, param.rpartition(":")[2])
        return 1.0 / (peak * 1e12) if peak else 0.0
    return 0.0


def _priors(params: Sequence[str], card: Card | None, *, every: bool = False) -> list[tuple[int, int, float]]:
    """(parameter, the one it falls back to, log of the factor between them) for each parameter with a fallback
    among ``params`` that the prior pulls toward it (``every``: each parameter with a fallback)."""
    col = {p: i for i, p in enumerate(params)}
    return [(i, j, math.log(k)) for p, i in col.items() if every or p not in _NO_PRIOR
            for j, k in [next(((col[q], k) for q, k in fallbacks(p, card) if q in col), (-1, 1.0))] if j >= 0]


def _objective(design: _Design, y: np.ndarray, params: Sequence[str], theta: np.ndarray, card: Card | None,
               weight: float) -> float:
    """What the calibration minimises: the squared relative errors, plus the prior on the parameters set."""
    errors = _times(design, theta) / y - 1.0
    prior = [(math.log(theta[i] / theta[j]) - k) ** 2 for i, j, k in _priors(params, card)
             if theta[i] > 0 and theta[j] > 0]
    return float(np.sum(errors ** 2) + weight * sum(prior))


def _times(design: _Design, theta: np.ndarray) -> np.ndarray:
    """Each sample's time at ``theta``, every op on its longer side."""
    X, _ = design.matrix(theta)
    return np.asarray(X @ theta)


def _refine(design: _Design, y: np.ndarray, params: Sequence[str], start: np.ndarray, card: Card | None,
            weight: float) -> np.ndarray:
    """The least-squares rates of the model with its max (the linear fits above settle which side each op takes;
    this one moves the rates with the sides following them), in logs: positive, and the prior exact."""
    from scipy.optimize import least_squares  # only where a calibration is made: a shipped one is read, not refitted

    floor = 1e-30
    priors = _priors(params, card)
    start = start.copy()
    for i, j, k in priors:  # one the linear fit set to zero but that stands in for another starts at that one
        if start[i] <= floor < start[j]:
            start[i] = start[j] * math.exp(k)
    least = np.array([least_seconds(p, card) for p in params])
    start = np.where(least > 0, np.maximum(start, least * (1 + 1e-9)), start)
    fixed = start <= floor  # a parameter the linear fit set to zero (no per-op cost, say) stays there

    def full(free: np.ndarray) -> np.ndarray:
        theta = start.copy()
        theta[~fixed] = np.exp(free)
        return theta

    def residuals(free: np.ndarray) -> np.ndarray:
        theta = full(free)
        errors = _times(design, theta) / y - 1.0
        logs = np.log(np.maximum(theta, floor))
        prior = [math.sqrt(weight) * (logs[i] - logs[j] - k) for i, j, k in priors if not fixed[i] and not fixed[j]]
        return np.concatenate([errors, np.array(prior)])

    if fixed.all():
        return start
    lower = np.where(least > 0, np.log(np.maximum(least, floor)), -np.inf)[~fixed]
    found = least_squares(residuals, np.log(start[~fixed]), method="trf", x_scale=1.0, xtol=1e-12, ftol=1e-12,
                          gtol=1e-12, max_nfev=2000, bounds=(lower, np.inf))
    better = full(found.x)
    return better if np.sum(residuals(found.x) ** 2) <= np.sum(residuals(np.log(start[~fixed])) ** 2) else start


def _solve(X: np.ndarray, y: np.ndarray, params: Sequence[str], previous: np.ndarray | None, card: Card | None,
           weight: float, *, guarded: bool = False) -> np.ndarray:
    """Non-negative least squares on relative errors, plus the prior rows (linearised around ``previous``;
    ``guarded``: none around a parameter the previous fit set to (nearly) zero, where the linearised prior is
    meaningless, though on some data it is what leads to the best fit)."""
    from scipy.optimize import lsq_linear

    scale = np.abs(X).max(axis=0)
    scale[scale == 0] = 1.0
    rows, targets = [X / y[:, None] / scale], [np.ones(len(y))]
    col = {p: i for i, p in enumerate(params)}
    if previous is not None:
        for p, i in col.items():
            parent = None if p in _NO_PRIOR else next(((col[q], k) for q, k in fallbacks(p, card) if q in col), None)
            if parent is None or previous[parent[0]] <= 0:
                continue
            j, k = parent
            if guarded and previous[j] * scale[j] <= 1e-6:
                continue
            # log(s_p / (k s_q)) ~ s_p / (k s_q0) - s_q / s_q0 around the previous fit
            row = np.zeros(len(params))
            row[i] = 1.0 / (k * previous[j]) / scale[i]
            row[j] = -1.0 / previous[j] / scale[j]
            rows.append(math.sqrt(weight) * row[None, :])
            targets.append(np.zeros(1))
    rows.append(math.sqrt(_RIDGE) * np.eye(len(params)))
    targets.append(np.zeros(len(params)))
    least = np.array([least_seconds(p, card) for p in params]) * scale  # no rate above the datasheet's
    found = lsq_linear(np.vstack(rows), np.concatenate(targets), bounds=(least, np.inf), method="bvls")
    return np.asarray(found.x) / scale


def held_out(samples: Sequence[Sample], *, card: str | None, by_cell: bool) -> tuple[Check, ...]:
    """Each sample predicted by a calibration on the others (``by_cell``: on the other cells)."""
    checks = []
    groups = list(dict.fromkeys(s.cell for s in samples)) if by_cell else list(range(len(samples)))
    for g in groups:
        kept = [s for i, s in enumerate(samples) if (s.cell if by_cell else i) != g]
        out = [s for i, s in enumerate(samples) if (s.cell if by_cell else i) == g]
        rates = calibrate(kept, card=card) if len(kept) >= 2 else None
        for s in out:
            checks.append(Check(s.key, s.cell, s.step_time_s, rates.time(s.ops) if rates is not None else None))
    return tuple(checks)


@dataclass(frozen=True)
class OpTimeModel:
    """The op model of one card: its samples, its calibrated rates and their held-out checks."""

    card: str | None
    samples: tuple[Sample, ...]
    rates: Rates
    loo: tuple[Check, ...] = ()
    loco: tuple[Check, ...] = ()

    @classmethod
    def calibrated(cls, samples: Sequence[Sample], *, card: str | None, checks: bool = True) -> OpTimeModel | None:
        """Calibrate on ``samples`` (one card's); with ``checks``, leave-one-out and leave-one-cell-out."""
        rates = calibrate(samples, card=card)
        if rates is None:
            return None
        samples = tuple(samples)
        loo = held_out(samples, card=card, by_cell=False) if checks else ()
        loco = held_out(samples, card=card, by_cell=True) if checks and len({s.cell for s in samples}) > 1 else ()
        return cls(card, samples, rates, loo, loco)

    def to_json(self) -> dict[str, Any]:
        """The calibrated rates and each sample's held-out predictions (in the samples' order), for a calibration
        file to keep: reading them back (``from_json``) needs no refit, and no scipy."""
        def by_sample(checks: Sequence[Check]) -> list[float | None]:
            found = {_key_text(c.key): c.predicted_s for c in checks}
            return [found.get(_key_text(s.key)) for s in self.samples]

        return {"card": self.card, "seconds": dict(sorted(self.rates.seconds.items())),
                "loo": by_sample(self.loo) if self.loo else None, "loco": by_sample(self.loco) if self.loco else None}

    @classmethod
    def from_json(cls, samples: Sequence[Sample], data: Mapping[str, Any]) -> OpTimeModel:
        """The model ``to_json`` kept, on the same ``samples``."""
        samples = tuple(samples)

        def checks(predicted: Sequence[float | None] | None) -> tuple[Check, ...]:
            if predicted is None:
                return ()
            if len(predicted) != len(samples):
                raise ValueError(f"an op model of {len(predicted)} held-out points for {len(samples)} samples")
            return tuple(Check(s.key, s.cell, s.step_time_s, p) for s, p in zip(samples, predicted, strict=True))

        rates = Rates(data["card"], {str(k): float(v) for k, v in data["seconds"].items()})
        return cls(data["card"], samples, rates, checks(data.get("loo")), checks(data.get("loco")))

    @property
    def cells(self) -> int:
        return len({s.cell for s in self.samples})

    @property
    def main_cell(self) -> Hashable:
        """The cell with the most points (the first of them on a tie): the one the others depart from."""
        counts: dict[Hashable, int] = {}
        for s in self.samples:
            counts[s.cell] = counts.get(s.cell, 0) + 1
        return max(counts, key=lambda c: counts[c])

    @property
    def error_bound(self) -> float | None:
        """The largest leave-one-cell-out relative error of the cells that depart from the main cell, each
        predicted from a calibration on the rest (the main cell among them), as a prediction in a cell nobody
        measured is made; None with one cell or none predicted."""
        return _bound([c for c in self.loco if c.cell != self.main_cell])

    @property
    def main_cell_error(self) -> float | None:
        """The largest error of the main cell's points predicted from the other cells alone."""
        return _bound([c for c in self.loco if c.cell == self.main_cell])

    @property
    def loo_bound(self) -> float | None:
        return _bound(self.loo)

    def source(self) -> str:
        """'modelled from each op's FLOPs and bytes, rates calibrated on 26 points of 6 cells (NVIDIA H200),
        leave-one-cell-out error <= 7.9% (5 cells)'."""
        bound = self.error_bound
        others = len({c.cell for c in self.loco if c.cell != self.main_cell and c.error is not None})
        checked = (f"leave-one-cell-out error <= {bound:.1%} ({others} cell{'s' if others != 1 else ''})"
                   if bound is not None else "no leave-one-cell-out check (one cell)")
        n, cells = len(self.samples), self.cells
        where = self.card or "CPU"
        return (f"modelled from each op's FLOPs and bytes, rates calibrated on {n} point{'s' if n != 1 else ''} of "
                f"{cells} cell{'s' if cells != 1 else ''} ({where}), {checked}")


def _key_text(key: Mapping[str, Any]) -> str:
    return json.dumps(dict(key), sort_keys=True)


def _bound(checks: Sequence[Check]) -> float | None:
    errors = [abs(c.error) for c in checks if c.error is not None]
    return max(errors) if errors else None
