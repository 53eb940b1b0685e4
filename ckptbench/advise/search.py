"""The layouts of a question, predicted: every family's row, the smallest k that fits found by bisection with
the estimator, and the largest batch that fits with checkpointing."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from ckptbench.advise.record import Option
from ckptbench.analysis.step_time import StepTimeModel
from ckptbench.config.grid import Point
from ckptbench.config.schema import SweepConfig
from ckptbench.estimator.api import Estimator
from ckptbench.estimator.gpus import GpuModel
from ckptbench.estimator.record import Estimate, EstimateProgress

# Layouts whose classes every question needs traced together (one short model per shape holds them all).
GRANULAR = ("all@attn", "all@mlp", "all@attn+mlp", "all@selective")
PRIMED = ("none", "all", *GRANULAR)
MAX_BATCH_SEARCHED = 4096
_STEPS = 4  # single steps from the linear guess before bisecting


class Predictor:
    """The estimator of one question on one card: each trace runs once, each point is estimated once."""

    def __init__(self, cfg: SweepConfig, card: GpuModel, times: StepTimeModel | None,
                 on_progress: Callable[[EstimateProgress], None] | None = None) -> None:
        self.cfg, self.card, self.times, self.on_progress = cfg, card, times, on_progress
        self.estimator = Estimator(cfg, target="cuda", gpu=card)
        self._done: dict[Point, Estimate] = {}
        self.count = 0

    def prime(self, points: Sequence[Point]) -> None:
        """Run the traces ``points`` need (together: one short model per shape covers every layer class)."""
        run_traces(self.estimator, points, self.on_progress)

    def estimate(self, point: Point) -> Estimate:
        if point not in self._done:
            self.prime([point])  # nothing to run when its traces ran (jobs also registers a new shape)
            self._done[point] = self.estimator.estimate(point, budget_bytes=self.card.total_bytes)
            self.count += 1
        return self._done[point]

    def fits(self, point: Point) -> bool:
        return self.estimate(point).fits is True

    def option(self, family: str, point: Point, searched: str | None = None) -> Option:
        time = self.times.predict(point, gpu=self.card) if self.times is not None else None
        return Option(family, self.estimate(point), time, searched)


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


def options(pred: Predictor, base: Point) -> list[Option]:
    """Every family's row at ``base``'s batch and sequence length: none, all, the fewest first:k and last:k that
    fit, the sparsest every:n that fits, and each granularity of all layers."""
    n = pred.cfg.model.num_layers
    at = lambda layout: dataclasses.replace(base, layout=layout)  # noqa: E731
    rows = [pred.option("none", at("none")), pred.option("all", at("all"))]
    for family in ("first", "last"):
        before = pred.count
        def fits(k: int, f: str = family) -> bool:
            return pred.fits(at(f"{f}:{k}"))

        k = smallest(fits, 1, n)
        layout = f"{family}:{k if k is not None else n}"
        how = f"smallest k of 1..{n} that fits, {pred.count - before} predictions" if k else f"no k of 1..{n} fits"
        rows.append(pred.option(f"{family}:k", at(layout), how))
    before = pred.count
    every = largest(lambda m: pred.fits(at(f"every:{m}")), 1, n)
    how = (f"largest n of 1..{n} that fits, {pred.count - before} predictions" if every
           else "not even every:1 (all) fits")
    rows.append(pred.option("every:n", at(f"every:{every or 1}"), how))
    rows += [pred.option(g, at(g)) for g in GRANULAR]
    return rows


def largest_batch(pred: Predictor, base: Point, known: Sequence[Option]) -> tuple[int, Estimate] | None:
    """The largest batch that fits with every layer checkpointed ('all'): extrapolated from the batches already
    predicted (memory grows linearly in the batch), then checked and stepped by prediction."""
    alls = sorted((o.estimate.point.batch_size, o.estimate.needed_bytes or 0) for o in known
                  if o.family == "all" and o.estimate.needed_bytes is not None)
    at = lambda b: dataclasses.replace(base, layout="all", batch_size=b)  # noqa: E731
    if not alls or not pred.fits(at(alls[0][0])):
        return None
    if len(alls) >= 2 and alls[-1][1] > alls[0][1]:
        (b0, n0), (b1, n1) = alls[0], alls[-1]
        slope = (n1 - n0) / (b1 - b0)
        guess = int(b0 + (pred.card.total_bytes - n0) / slope)
    else:
        guess = alls[0][0] * 2
    guess = max(1, min(guess, MAX_BATCH_SEARCHED))
    # Step from the guess, one batch at a time (a linear guess is a step or two off); bisect if it is further.
    fits = lambda b: pred.fits(at(b))  # noqa: E731
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
    return best, pred.estimate(at(best))
