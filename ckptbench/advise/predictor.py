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
# How far from a probe the largest-batch search looks for a batch traced already (another card's, another headroom's
# answer near the same boundary): probed instead, it costs a replay, not a trace (and not torch's import).
FREE_WINDOW = 4


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
        self.estimator.predict_many([p for p in points if not self.over_by_allocation(p)],
                                    budget_bytes=self.card.total_bytes)

    def warm_rows(self, points: Sequence[Point], counts: Sequence[Point] = ()) -> None:
        """Predict ``points`` side by side, every one: the rows of a table, whose estimates it shows (reserved bytes,
        where the allocator runs out) whether they fit or not, so ``warm``'s shortcut would only leave their replays
        to be run one by one after; and with them, in the same replays, ``counts`` as ``warm`` predicts them."""
        self.prime([*points, *counts])
        needed = [p for p in counts if not self.over_by_allocation(p)]
        self.estimator.predict_many([*points, *needed], budget_bytes=self.card.total_bytes)

    def over_by_allocation(self, point: Point) -> bool:
        """Whether the point's allocated peak alone exceeds the limit (its traces must have run): it does not fit,
        known without a replay."""
        allocated = self.estimator.allocated_peak(point)
        return allocated is not None and judge_allocated(allocated, self.limit) is not None

    def traced(self, point: Point) -> bool:
        """Whether the point's traces ran (here, or kept on disk by an earlier command): estimating it costs no
        trace."""
        return not self.estimator.jobs([point])

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
    warm_tables(pred, [base])  # (nothing to replay where the question's tables were warmed together)
    rows = [pred.option("none", at("none")), pred.option("all", at("all"))]
    if not rows[0].fits:
        for family in FAMILIES:
            scan = pred.scan(base, family)
            robust = scan.robust
            if robust is not None:
                rows.append(pred.option(f"{family}:{'n' if family == 'every' else 'k'}", at(scan.layout(robust)), scan))
    rows += [pred.option(g, at(g)) for g in GRANULAR]
    return _distinct(rows, pred.cfg.model.num_layers)


def warm_tables(pred: Predictor, bases: Sequence[Point]) -> None:
    """The replays ``family_rows`` asks for at each of ``bases``, side by side across them: every row of each table,
    and with them every family count of the tables whose no-checkpointing row exceeds the limit by its allocated peak
    alone (known from the traces, before any replay); then the family counts of the other tables where no
    checkpointing does not fit (one batch of replays in all for most questions, at most two, rather than up to two a
    table)."""
    n = pred.cfg.model.num_layers

    def counts(base: Point) -> list[Point]:
        return [dataclasses.replace(base, layout=f"{family}:{c}") for family in FAMILIES for c in range(1, n + 1)]

    rows = [dataclasses.replace(b, layout=layout) for b in bases for layout in PRIMED]
    pred.prime(rows)
    over = [b for b in bases if pred.over_by_allocation(dataclasses.replace(b, layout="none"))]
    pred.warm_rows(rows, [p for b in over for p in counts(b)])
    pred.warm([p for b in bases if b not in over and not pred.verdict(dataclasses.replace(b, layout="none")).fits
               for p in counts(b)])


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
    """The largest batch that fits with every layer checkpointed ('all'), held to its neighbour: the answer fits and
    the next batch does not. A new batch costs a new trace, so the probes are few: above every batch known (the
    question's own batches first: their traces ran already) the line through the two largest puts the next probe at
    the limit, at most at twice the largest batch that fits (at small batches the need hardly grows, the optimizer's
    peak or the first layer's backward being the step's, and its line overshot: LLaMA-7B at sequence 2048 on an
    A100-80GB probed 53 for 19, on an H200 204 for 54); once a batch that does not fit is known, regula falsi between
    the two (the thread's question: 4 probes; doubling and bisection took 8, the uncapped line 5; on the H200 6, 9
    uncapped); a bisection settles what is left. A batch within FREE_WINDOW of a
    probe, inside the bracket, whose traces ran already (asked before for another card or headroom) is probed
    instead: the bracket narrows as much for a replay. The answer is the same where fitting is monotone in the batch,
    which the search assumes."""
    at = lambda b: dataclasses.replace(base, layout="all", batch_size=b, micro_batches=1)  # noqa: E731
    asked = sorted({o.point.batch_size for o in known if o.family == "all" and o.accumulation == 1})
    if not asked:
        return None
    limit = pred.limit.limit_bytes
    seen: dict[int, int] = {}

    def size(b: int) -> int:
        """What batch ``b`` needs, or where no figure is predicted (the allocator runs out first) its allocated
        peak and the context: what the line is drawn through (never a verdict)."""
        if b not in seen:
            v = pred.verdict(at(b))
            seen[b] = v.needed_bytes if v.needed_bytes is not None else (v.allocated_bytes or 0) + \
                pred.card.context_bytes
        return seen[b]

    probed: list[int] = []

    def fits(b: int) -> bool:
        probed.append(b)
        return pred.verdict(at(b)).fits

    def ask(guess: int, lo: int, hi: int | None) -> tuple[int, bool]:
        """(the batch probed for ``guess``, whether it fits): the nearest batch to it within FREE_WINDOW, strictly
        inside the bracket (lo fits, hi does not), whose traces ran already, else ``guess`` itself."""
        top = hi if hi is not None else guess + FREE_WINDOW + 1
        if not pred.traced(at(guess)):
            for b in sorted(range(guess - FREE_WINDOW, guess + FREE_WINDOW + 1), key=lambda b: (abs(b - guess), b)):
                if lo < b < top and b not in probed and pred.traced(at(b)):
                    return b, fits(b)
        return guess, fits(guess)

    if not fits(asked[0]):
        return None
    lo, hi = asked[0], None  # lo fits; hi (once known) does not
    for b in asked[1:]:
        if fits(b):
            lo = b
        else:
            hi = b
            break
    steps = 0
    while hi is None and steps < _SECANT_STEPS and lo < MAX_BATCH_SEARCHED:  # above every batch known: extrapolate
        steps += 1
        below = [b for b in dict.fromkeys(probed) if b < lo]
        near = max(below, default=None)
        slope = (size(lo) - size(near)) / (lo - near) if near is not None else 0.0
        guess = lo + int((limit - size(lo)) / slope) if slope > 0 else lo * 2
        guess = min(max(guess, lo + 1), 2 * lo, MAX_BATCH_SEARCHED)  # at most double the largest that fits
        b, ok = ask(guess, lo, hi)
        if ok:
            lo = b
        else:
            hi = b
    # Between a batch that fits and one that does not: regula falsi, Illinois' variant (the end kept twice in a row
    # counts half), as the need is convex in the batch (the optimizer's peak first, then the activations' growing).
    f_lo = f_hi = 0.0
    if hi is not None:
        f_lo, f_hi = size(lo) - limit, size(hi) - limit
    kept = 0
    while hi is not None and hi - lo > 1 and steps < 2 * _SECANT_STEPS:
        steps += 1
        # (a batch that runs out of memory only through fragmentation may show a figure under the limit: f_hi <= 0,
        # which would put regula falsi's guess past hi: such a bracket is bisected)
        guess = lo + int((hi - lo) * -f_lo / (f_hi - f_lo)) if f_hi > 0 > f_lo else (lo + hi) // 2
        guess = min(max(guess, lo + 1), hi - 1)
        b, ok = ask(guess, lo, hi)
        if ok:
            lo, f_lo = b, size(b) - limit
            f_hi, kept = (f_hi / 2, -1) if kept == -1 else (f_hi, -1)
        else:
            hi, f_hi = b, size(b) - limit
            f_lo, kept = (f_lo / 2, 1) if kept == 1 else (f_lo, 1)
    if hi is None and lo < MAX_BATCH_SEARCHED:  # the probes ran out below the boundary
        if fits(lo + 1):
            lo = largest(fits, lo + 1, MAX_BATCH_SEARCHED) or lo  # bisect up to the cap
        else:
            hi = lo + 1
    if hi is not None and hi - lo > 1:
        lo = largest(fits, lo, hi - 1) or lo
    return lo, pred.estimate(at(lo)), pred.verdict(at(lo))
