"""The layouts of a question, predicted: every count of every layout family (fitting is not always monotone in the
number of checkpointed layers near the limit: the caching allocator decides), the fewest layers that one more
layer cannot break, and the largest batch that fits with checkpointing."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence

from ckptbench.advise.arithmetic import by_arithmetic, plain_point
from ckptbench.advise.record import FamilyScan, Option
from ckptbench.advise.verdict import Limit, Verdict, judge, judge_allocated
from ckptbench.analysis.boundary import largest
from ckptbench.analysis.step_time import StepTimeModel, StepTimePrediction
from ckptbench.config.grid import Point
from ckptbench.config.layouts import parse_layout
from ckptbench.config.schema import SweepConfig
from ckptbench.estimator.estimator import Estimator
from ckptbench.estimator.gpus import GpuModel
from ckptbench.estimator.record import Estimate, EstimateProgress
from ckptbench.train.flops import ModelShape

# Layouts whose classes every question needs traced together (one short model per shape holds them all).
GRANULAR = ("all@attn", "all@mlp", "all@attn+mlp", "all@selective")
PRIMED = ("none", "all", *GRANULAR)
FAMILIES = ("first", "last", "every")
MAX_BATCH_SEARCHED = 4096
_SECANT_STEPS = 6  # probes of the secant method before it brackets the largest batch


class Predictor:
    """The estimator of one question on one card: each trace runs once, each point is estimated once, each
    estimate judged against the limit."""

    def __init__(self, cfg: SweepConfig, limit: Limit, times: StepTimeModel | None,
                 on_progress: Callable[[EstimateProgress], None] | None = None,
                 estimator: Estimator | None = None) -> None:
        self.cfg, self.limit, self.times, self.on_progress = cfg, limit, times, on_progress
        self.estimator = estimator if estimator is not None else Estimator(cfg, target="cuda", gpu=limit.card)

    @property
    def card(self) -> GpuModel:
        return self.limit.card

    def prime(self, points: Sequence[Point]) -> None:
        """Run the traces ``points`` need (together: one short model per shape covers every layer class)."""
        self.estimator.run_traces(points, on_progress=self.on_progress)

    def warm(self, points: Sequence[Point]) -> None:
        """Predict ``points`` side by side (``Estimator.predict_many``) where their verdict needs the allocator's
        replay (a point whose allocated peak alone exceeds the limit is judged without one: ``quick_verdict``)."""
        self.prime(points)
        needed = []
        for p in points:
            allocated = self.estimator.allocated_peak(p)
            if allocated is None or judge_allocated(allocated, self.limit) is None:
                needed.append(p)
        self.estimator.predict_many(needed, budget_bytes=self.card.total_bytes)

    def estimate(self, point: Point) -> Estimate:
        """The point's estimate on the card (the Estimator's memo: made once; its traces run where they have not)."""
        return self.estimator.predict(point, budget_bytes=self.card.total_bytes)

    def verdict(self, point: Point) -> Verdict:
        """The point judged against the limit; where the estimator could not trace it (a library missing here),
        by labelled arithmetic on the plain setup when there is such a rule (advise/arithmetic.py)."""
        verdict = judge(self.estimate(point), self.limit)
        plain = plain_point(point) if not verdict.predicted else None
        if plain is not None:
            found = by_arithmetic(point, self.estimate(plain), self.limit)
            if found is not None:
                return dataclasses.replace(found, note=verdict.note)
        return verdict

    def time(self, point: Point) -> StepTimePrediction | None:
        """The point's step time on the card: fitted inside a measured cell, else modelled (or transferred) from
        its traced ops (analysis/step_time.py); None where the model has no calibration for it."""
        if self.times is None:
            return None
        return self.times.predict(point, gpu=self.card, ops=self.estimator.op_costs(point), shape=self.shape)

    @functools.cached_property
    def shape(self) -> ModelShape | None:
        """The model's shape for the implied MFU (None where its fields are not LLaMA-shaped)."""
        try:
            return ModelShape.of_fields(self.cfg.model.resolved())
        except (KeyError, TypeError, ValueError):
            return None

    def option(self, family: str, point: Point, scan: FamilyScan | None = None) -> Option:
        return Option(family, self.estimate(point), self.verdict(point), self.time(point), self.cfg.model.num_layers,
                      scan)

    def quick_verdict(self, point: Point) -> Verdict:
        """``verdict``, without replaying the allocator where the allocated peak alone already exceeds the limit."""
        self.prime([point])  # nothing to run when its traces ran
        allocated = self.estimator.allocated_peak(point)
        found = judge_allocated(allocated, self.limit) if allocated is not None else None
        return found if found is not None else self.verdict(point)

    def scan(self, base: Point, family: str) -> FamilyScan:
        """Every count of ``family`` at ``base``'s batch, sequence length and micro-batches (a count whose
        allocated peak alone exceeds the limit is judged without replaying it)."""
        n = self.cfg.model.num_layers
        verdicts = tuple(self.quick_verdict(dataclasses.replace(base, layout=f"{family}:{c}"))
                         for c in range(1, n + 1))
        return FamilyScan(family, n, verdicts)


def family_rows(pred: Predictor, base: Point) -> list[Option]:
    """Every family's row at ``base``'s batch, sequence length and micro-batches: none and all; when no
    checkpointing does not fit, the fewest-layers robust count of first:k, last:k and every:n (every count
    predicted); then each granularity of all layers. Rows that checkpoint the same layers as an earlier row
    (every:1, first:n, last:n are all) are left out."""
    at = lambda layout: dataclasses.replace(base, layout=layout)  # noqa: E731
    pred.warm([at(layout) for layout in PRIMED])
    rows = [pred.option("none", at("none")), pred.option("all", at("all"))]
    if not rows[0].fits:
        n = pred.cfg.model.num_layers
        pred.warm([at(f"{family}:{c}") for family in FAMILIES for c in range(1, n + 1)])
        for family in FAMILIES:
            scan = pred.scan(base, family)
            robust = scan.robust
            if robust is not None:
                rows.append(pred.option(f"{family}:{'n' if family == 'every' else 'k'}", at(scan.layout(robust)), scan))
    rows += [pred.option(g, at(g)) for g in GRANULAR]
    return _distinct(rows, pred.cfg.model.num_layers)


def _distinct(rows: list[Option], num_layers: int) -> list[Option]:
    """The rows whose checkpointed modules differ from every earlier row's."""
    seen: set[tuple[str, tuple[str, ...]]] = set()
    out = []
    for row in rows:
        plan = parse_layout(row.layout, num_layers)
        what = (plan.granularity, plan.targets)  # all@selective wraps the same modules as all, per op
        if what not in seen:
            seen.add(what)
            out.append(row)
    return out


def fewest(rows: Sequence[Option]) -> Option | None:
    """The fitting row with the fewest checkpointed layers (whole layers before parts of layers), least memory
    next."""
    fitting = [o for o in rows if o.fits and "@" not in o.layout]
    return min(fitting, key=lambda o: (o.layers, o.verdict.needed_bytes or 0)) if fitting else None


def largest_batch(pred: Predictor, base: Point, known: Sequence[Option]) -> tuple[int, Estimate, Verdict] | None:
    """The largest batch that fits with every layer checkpointed ('all'), by the secant method on what each batch
    needs (memory grows about linearly in the batch: a new batch costs a new trace, so a few probes, not a
    bisection over thousands), then held to its neighbour: the answer fits and the next batch does not."""
    at = lambda b: dataclasses.replace(base, layout="all", batch_size=b, micro_batches=1)  # noqa: E731
    first = min((o.point.batch_size for o in known if o.family == "all" and o.accumulation == 1), default=None)
    if first is None or not pred.verdict(at(first)).fits:
        return None
    limit = pred.limit.limit_bytes
    seen: dict[int, int] = {}

    def size(b: int) -> int:
        """What batch ``b`` needs, or where no figure is predicted (the allocator runs out first) its allocated
        peak and the context: what the secant steps on (never a verdict)."""
        if b not in seen:
            v = pred.verdict(at(b))
            seen[b] = v.needed_bytes if v.needed_bytes is not None else (v.allocated_bytes or 0) + \
                pred.card.context_bytes
        return seen[b]

    fits = lambda b: pred.verdict(at(b)).fits  # noqa: E731
    lo, hi = first, min(first * 2, MAX_BATCH_SEARCHED)  # lo fits; hi is the next probe
    for _ in range(_SECANT_STEPS):
        if hi <= lo:
            break
        if not fits(hi):
            break
        lo = hi
        slope = (size(hi) - size(first)) / (hi - first) if hi > first else 0.0
        guess = int(hi + (limit - size(hi)) / slope) if slope > 0 else hi * 2
        hi = max(lo + 1, min(guess, MAX_BATCH_SEARCHED))
        if lo >= MAX_BATCH_SEARCHED:
            hi = lo
            break
    else:
        hi = min(lo * 2, MAX_BATCH_SEARCHED)
    if hi > lo and fits(hi):  # the steps ran out or the cap was reached: the cap fits
        lo = hi
    elif hi > lo:
        # lo fits, hi does not: step down from a linear guess between them, then bisect what is left.
        slope = (size(hi) - size(lo)) / (hi - lo)
        guess = lo + int((limit - size(lo)) / slope) if slope > 0 else lo
        guess = min(max(guess, lo), hi - 1)
        if guess > lo and fits(guess):
            lo = guess
        elif guess > lo:
            hi = guess
        if hi - lo > 1:
            lo = largest(fits, lo, hi - 1) or lo
    return lo, pred.estimate(at(lo)), pred.verdict(at(lo))
