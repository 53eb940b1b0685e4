"""The layouts of a question, predicted: every count of every layout family (fitting is not always monotone in the
number of checkpointed layers near the limit: the caching allocator decides), the fewest layers that one more
layer cannot break, and the largest batch that fits with checkpointing."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from ckptbench.advise.arithmetic import by_arithmetic, plain_point
from ckptbench.advise.record import FamilyScan, Option
from ckptbench.advise.verdict import Limit, Verdict, judge, judge_allocated
from ckptbench.analysis.step_time import StepTimeModel, StepTimePrediction
from ckptbench.config.grid import Point
from ckptbench.config.layouts import parse_layout
from ckptbench.config.schema import SweepConfig
from ckptbench.estimator.api import Estimator
from ckptbench.estimator.gpus import GpuModel
from ckptbench.estimator.record import Estimate, EstimateProgress

# Layouts whose classes every question needs traced together (one short model per shape holds them all).
GRANULAR = ("all@attn", "all@mlp", "all@attn+mlp", "all@selective")
PRIMED = ("none", "all", *GRANULAR)
FAMILIES = ("first", "last", "every")
MAX_BATCH_SEARCHED = 4096
_STEPS = 4  # single steps from the linear guess before bisecting


class Predictor:
    """The estimator of one question on one card: each trace runs once, each point is estimated once, each
    estimate judged against the limit."""

    def __init__(self, cfg: SweepConfig, limit: Limit, times: StepTimeModel | None,
                 on_progress: Callable[[EstimateProgress], None] | None = None,
                 estimator: Estimator | None = None) -> None:
        self.cfg, self.limit, self.times, self.on_progress = cfg, limit, times, on_progress
        self.estimator = estimator if estimator is not None else Estimator(cfg, target="cuda", gpu=limit.card)
        self._done: dict[Point, Estimate] = {}
        self.count = 0

    @property
    def card(self) -> GpuModel:
        return self.limit.card

    def prime(self, points: Sequence[Point]) -> None:
        """Run the traces ``points`` need (together: one short model per shape covers every layer class)."""
        run_traces(self.estimator, points, self.on_progress)

    def estimate(self, point: Point) -> Estimate:
        if point not in self._done:
            self.prime([point])  # nothing to run when its traces ran (jobs also registers a new shape)
            self._done[point] = self.estimator.estimate(point, budget_bytes=self.card.total_bytes)
            self.count += 1
        return self._done[point]

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
        return self.times.predict(point, gpu=self.card) if self.times is not None else None

    def option(self, family: str, point: Point, scan: FamilyScan | None = None) -> Option:
        return Option(family, self.estimate(point), self.verdict(point), self.time(point), self.cfg.model.num_layers,
                      scan)

    def quick_verdict(self, point: Point) -> Verdict:
        """``verdict``, without replaying the allocator where the allocated peak alone already exceeds the limit."""
        self.prime([point])
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


def run_traces(
    estimator: Estimator, points: Sequence[Point], on_progress: Callable[[EstimateProgress], None] | None
) -> None:
    """Run the traces ``points`` need, together, reporting each (a trace that ran is not run again), spread
    over the cores."""
    estimator.run_traces(points, on_progress=on_progress)


def smallest(fits: Callable[[int], bool], lo: int, hi: int) -> int | None:
    """The smallest k in lo..hi with ``fits(k)``, by bisection (fitting is monotone in k); None if hi does not."""
    if not fits(hi):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def largest(fits: Callable[[int], bool], lo: int, hi: int) -> int | None:
    """The largest k in lo..hi with ``fits(k)``, by bisection (monotone); None if lo does not fit."""
    if not fits(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def family_rows(pred: Predictor, base: Point) -> list[Option]:
    """Every family's row at ``base``'s batch, sequence length and micro-batches: none and all; when no
    checkpointing does not fit, the fewest-layers robust count of first:k, last:k and every:n (every count
    predicted); then each granularity of all layers. Rows that checkpoint the same layers as an earlier row
    (every:1, first:n, last:n are all) are left out."""
    at = lambda layout: dataclasses.replace(base, layout=layout)  # noqa: E731
    rows = [pred.option("none", at("none")), pred.option("all", at("all"))]
    if not rows[0].fits:
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
    """The largest batch that fits with every layer checkpointed ('all'): extrapolated from the batches already
    predicted (memory grows linearly in the batch), then checked and stepped by prediction."""
    alls = sorted((o.point.batch_size, o.verdict.needed_bytes) for o in known
                  if o.family == "all" and o.accumulation == 1 and o.verdict.needed_bytes is not None)
    at = lambda b: dataclasses.replace(base, layout="all", batch_size=b, micro_batches=1)  # noqa: E731
    if not alls or not pred.verdict(at(alls[0][0])).fits:
        return None
    limit = pred.limit.limit_bytes
    if len(alls) >= 2 and (alls[-1][1] or 0) > (alls[0][1] or 0):
        (b0, n0), (b1, n1) = alls[0], alls[-1]
        slope = ((n1 or 0) - (n0 or 0)) / (b1 - b0)
        guess = int(b0 + (limit - (n0 or 0)) / slope)
    else:
        guess = alls[0][0] * 2
    guess = max(1, min(guess, MAX_BATCH_SEARCHED))
    # Step from the guess, one batch at a time (a linear guess is a step or two off); bisect if it is further.
    fits = lambda b: pred.verdict(at(b)).fits  # noqa: E731
    low = alls[0][0]
    if fits(guess):
        best = guess
        for _ in range(_STEPS):
            if best >= MAX_BATCH_SEARCHED or not fits(best + 1):
                break
            best += 1
        else:
            best = largest(fits, best, MAX_BATCH_SEARCHED) or best
    else:
        best = guess - 1
        for _ in range(_STEPS):
            if best <= low or fits(best):
                break
            best -= 1
        else:
            best = largest(fits, low, best) or low
    return best, pred.estimate(at(best)), pred.verdict(at(best))
