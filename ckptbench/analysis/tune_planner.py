"""tune's decisions (pure): which candidate to measure next, which to drop and why, and the answer.

The search keeps one training semantics and looks for the highest measured tokens/s whose measured
peak reserved memory plus the CUDA context fits under the limit (budget minus headroom). Candidates are
taken in order of tokens per step (most first), then hardware FLOPs (least recomputation first), then
how many memory-saving techniques they use (fewest first). Before a candidate is measured it must
survive three prunes, each recorded with its reason:

1. **prediction**: ``predicted_fit`` (results/fit.py's rule for a prediction, with its reason) says
   it does not fit: never measured;
2. **a cheaper setup already wins**: a measured point that fits has the same tokens per step and
   speed class, no more hardware FLOPs and a subset of its memory savers: this candidate only adds
   recomputation or savers' overheads to it;
3. **it cannot beat the best**: even running its hardware FLOPs at ``RATE_SLACK`` times the best
   FLOP rate measured in its speed class, its tokens/s would not exceed the best fitting point's.

Every measurement is an ordinary point record; ``observe`` reads it. A measured point fits as every
command judges it (results/fit.py: ``measured_fits``); tune also requires its loss to match the plain
step's. The space searched is analysis/tune_space.py. Each decision's kind (``DecisionKind``) is set where it
is made; run.json keeps the decisions and their count per kind (analysis/tune_record.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from ckptbench.analysis.tune_record import Action, DecisionRecord, MarginRecord, MeasuredPoint, TuneRecord
from ckptbench.analysis.tune_space import layout_family, savers, semantic_changes, speed_class
from ckptbench.config.grid import Point, setup_label
from ckptbench.estimator.record import Estimate
from ckptbench.json_object import JsonObject
from ckptbench.results.fit import (
    measured_fits,
    measured_needed_bytes,
    measured_peak_bytes,
    predicted_fits,
    predicted_needed_bytes,
)
from ckptbench.results.record import PointRecord
from ckptbench.units import fmt_bytes

# A candidate may run faster per FLOP than anything measured so far (a larger batch fills the device
# better): its bound allows 10% more than the best rate of its speed class before it is ruled out.
RATE_SLACK = 1.10


@dataclass(frozen=True)
class TuneCandidate:
    """A point of the space with what the search needs to order and prune it."""

    point: Point
    hardware_flops: int
    estimate: Estimate

    @property
    def order(self) -> tuple[Any, ...]:
        p = self.point
        return (-p.tokens, p.compile, self.hardware_flops, len(savers(p)), p.key_id)

    @property
    def label(self) -> str:
        p = self.point
        extras = setup_label(p.key)
        return f"{p.layout} b={p.batch_size}" + (f" {extras}" if extras else "")


@dataclass(frozen=True)
class Measured:
    """A measured candidate: its record's numbers, and whether it is an answer (fits, and trains the same)."""

    candidate: TuneCandidate
    record: PointRecord
    fits: bool

    @property
    def tokens_per_s(self) -> float:
        return float(self.record.tokens_per_s or 0.0)

    @property
    def flop_rate(self) -> float:
        median = self.record.median_step_time_s
        return self.candidate.hardware_flops / median if median else 0.0

    def note(self, limit_bytes: int) -> str | None:
        """Why the point is no answer (another loss, over the limit, not ok: its record's reason); None if it is."""
        record = self.record
        if not record.ok:
            return record.reason
        if record.loss_mismatch:
            return "loss differs from the plain step's: not a candidate"
        if self.fits:
            return None
        ctx = record.context_bytes
        context = f" (peak reserved + {fmt_bytes(ctx)} CUDA context)" if ctx else ""
        return f"measured {fmt_bytes(measured_needed_bytes(record))}{context} > the {fmt_bytes(limit_bytes)} limit"

    def summary(self) -> MeasuredPoint:
        """What run.json keeps of a measured point that fits (the answer, a family's best)."""
        return MeasuredPoint(
            key=self.candidate.point.key, label=self.candidate.label, tokens_per_s=self.tokens_per_s,
            peak_reserved_bytes=measured_peak_bytes(self.record),
            peak_allocated_bytes=self.record.peak_allocated_bytes,
            layers_checkpointed=self.record.layers_checkpointed,
        )


class DecisionKind(Enum):
    """Why a candidate was measured or dropped, set where that is decided; the value is the name run.json
    counts it under (``counts``)."""

    MEASURED = "measured"
    PREDICTED_NOT_TO_FIT = "predicted not to fit"  # by its estimate, or by a smaller one that failed measured
    CHEAPER_WINS = "a cheaper setup wins"
    CANNOT_BEAT = "cannot beat the best"
    NOT_REACHED = "not reached"  # --max-points or --time-budget ran out first
    CANNOT_RUN = "cannot run here"  # its speed class was skipped (a technique not installed, or needing CUDA)


@dataclass(frozen=True)
class Reason:
    """A decision's kind and its sentence (computed from the figures it cites)."""

    kind: DecisionKind
    why: str


@dataclass(frozen=True)
class Decision:
    """One candidate decided: measured (``measured`` once its record is read) or dropped, and why."""

    candidate: TuneCandidate
    reason: Reason
    judged_bytes: int | None = None  # the predicted bytes judged against the limit, when there were some
    measured: Measured | None = None

    @property
    def kind(self) -> DecisionKind:
        return self.reason.kind

    @property
    def action(self) -> Action:
        if self.kind is not DecisionKind.MEASURED:
            return "dropped"
        return "measure" if self.measured is None else "measured"

    def stored(self, limit_bytes: int) -> DecisionRecord:
        """The decision as run.json keeps it: a measured one with what its record says. The fields given are
        those run.json has always held (tokens/s and peak reserved only for a point that ran; a note where it is
        no answer, null for a failed point that gave no reason)."""
        given: JsonObject = {"key": self.candidate.point.key, "label": self.candidate.label,
                                 "action": self.action, "why": self.reason.why}
        if self.judged_bytes is not None:
            given["judged_peak_bytes"] = self.judged_bytes
        m = self.measured
        if m is not None:
            given.update(status=m.record.status, fits=m.fits)
            if m.record.ok:
                given.update(tokens_per_s=m.record.tokens_per_s, peak_reserved_bytes=measured_peak_bytes(m.record))
            note = m.note(limit_bytes)
            if note is not None or not m.record.ok:
                given["note"] = note
        return DecisionRecord(**given)


@dataclass(frozen=True)
class Margin:
    """Peak reserved over peak allocated, as learned from the points measured so far."""

    ratio: float
    source: str

    @classmethod
    def learn(cls, records: Sequence[PointRecord]) -> Margin:
        ratios = [
            r.peak_reserved_bytes / r.peak_allocated_bytes
            for r in records
            if r.ok and r.peak_reserved_bytes and r.peak_allocated_bytes
        ]
        if not ratios:
            return cls(1.0, "no point measured yet, so no margin")
        return cls(max(1.0, max(ratios)), f"x{max(ratios):.4f}, the largest measured reserved/allocated of "
                   f"{len(ratios)} point(s)")


@dataclass(frozen=True)
class PredictedFit:
    """A prediction judged against the limit: fits (True/False, None when there is no prediction)."""

    fits: bool | None
    judged_bytes: int | None
    basis: str


def predicted_fit(estimate: Estimate, *, limit_bytes: int, margin: Margin) -> PredictedFit:
    """Whether a point is predicted to fit under ``limit_bytes`` of peak reserved memory plus the CUDA context.

    On CUDA the estimator replays the caching allocator on the card (``estimate.reserved``): its predicted
    peak reserved plus the card's context is judged, as a measured point is (``observe``), and a predicted
    out-of-memory does not fit. Without a replay (CPU; a point the replay cannot assemble) the predicted
    peak *allocated* times the margin learned from the measured points stands in.
    """
    reserved = estimate.reserved
    stand_in = f" ({estimate.note})" if estimate.note and estimate.note.startswith("stand-in") else ""
    if reserved is not None and reserved.oom is not None:
        oom = reserved.oom
        where = oom.get("where") or oom.get("segment") or "setup"
        return PredictedFit(False, None, f"predicted to run out of memory in {oom.get('phase')} ({where}) on the "
                            f"{reserved.gpu}{stand_in}")
    judged = predicted_needed_bytes(
        peak_reserved_bytes=None if reserved is None else reserved.peak_reserved_bytes,
        context_bytes=0 if reserved is None else reserved.context_bytes,
        peak_allocated_bytes=estimate.peak_bytes,
        margin=margin.ratio,
        # The reserved figure's upper bound, as estimate judges it (results/fit.py: one rule).
        bound_for=(estimate.point.layout, estimate.point.batch_size or 1) if estimate.bounded else None,
    )
    fits = predicted_fits(judged, limit_bytes, oom=False)
    if judged is None or fits is None:
        return PredictedFit(None, None, f"no prediction ({estimate.note or 'not estimated'})")
    if reserved is not None and reserved.peak_reserved_bytes is not None:
        bound = estimate.reserved_bound_bytes
        shown = f"reserved bound {fmt_bytes(bound)}" if bound is not None else (
            f"predicted peak reserved {fmt_bytes(reserved.peak_reserved_bytes)}")
        basis = (f"{shown} + "
                 f"{fmt_bytes(reserved.context_bytes)} CUDA context ({reserved.gpu}){stand_in}")
    else:
        basis = f"predicted peak allocated {fmt_bytes(estimate.peak_bytes or 0)} x margin {margin.ratio:.4f}{stand_in}"
    verdict = "fits" if fits else "does not fit"
    return PredictedFit(fits, judged, f"{basis} {verdict} the {fmt_bytes(limit_bytes)} limit")


@dataclass
class TunePlanner:
    """The search's state: candidates left, what was measured, and every decision with its reason."""

    candidates: list[TuneCandidate]
    limit_bytes: int
    max_points: int | None = None
    time_budget_s: float | None = None
    margin: Margin = field(default_factory=lambda: Margin.learn([]))
    measured: list[Measured] = field(default_factory=list)
    decided: list[Decision] = field(default_factory=list)  # every decision, in the order made
    stopped_by: str = "the space was exhausted"

    def __post_init__(self) -> None:
        self.candidates = sorted(self.candidates, key=lambda c: c.order)
        self._by_key = {c.point.key_id: c for c in self.candidates}

    # -- the loop -----------------------------------------------------------------------------
    def next(self, elapsed_s: float = 0.0) -> Point | None:
        """The next point to measure, or None when the search is over (the rest dropped, with reasons)."""
        while self.candidates:
            stop = self._limit_reached(elapsed_s)
            if stop is not None:
                self.stopped_by = stop
                for c in self.candidates:
                    self._decide(c, Reason(DecisionKind.NOT_REACHED, f"not reached: {stop}"))
                self.candidates = []
                return None
            c = self.candidates.pop(0)
            fit = predicted_fit(c.estimate, limit_bytes=self.limit_bytes, margin=self.margin)
            drop = _pruned(c, fit, measured=self.measured, limit_bytes=self.limit_bytes, best=self.best)
            if drop is not None:
                self._decide(c, drop, fit=fit)
                continue
            self._decide(c, Reason(DecisionKind.MEASURED, f"most tokens per step left; {fit.basis}"), fit=fit)
            return c.point
        return None

    def observe(self, point: Point, record: PointRecord) -> None:
        """Take in the measured record of the point ``next`` returned (or a resumed run's)."""
        c = self._by_key[point.key_id]
        # A point whose loss differs from the plain step's trains something else: it is no answer.
        fits = not record.loss_mismatch and measured_fits(record, self.limit_bytes)
        measured = Measured(c, record, fits)
        self.measured.append(measured)
        self.margin = Margin.learn([m.record for m in self.measured])
        self.decided[-1] = replace(self.decided[-1], measured=measured)
        if record.status == "skipped":
            self._drop_class(c, record.reason or "skipped")

    def _drop_class(self, skipped: TuneCandidate, reason: str) -> None:
        """A technique that cannot run here (not installed, needs CUDA) skips its whole speed class."""
        mine = speed_class(skipped.point)
        for c in [c for c in self.candidates if speed_class(c.point) == mine]:
            self._decide(c, Reason(DecisionKind.CANNOT_RUN, f"skipped like {skipped.label}: {reason}"))
        self.candidates = [c for c in self.candidates if speed_class(c.point) != mine]

    @property
    def spent_points(self) -> int:
        """Measurements that count against --max-points: a skipped point measured nothing."""
        return sum(1 for m in self.measured if m.record.status != "skipped")

    def _limit_reached(self, elapsed_s: float) -> str | None:
        if self.max_points is not None and self.spent_points >= self.max_points:
            return f"--max-points {self.max_points} reached"
        if self.time_budget_s is not None and elapsed_s >= self.time_budget_s:
            return f"--time-budget {self.time_budget_s / 60:g} min spent"
        return None

    # -- the answer ---------------------------------------------------------------------------
    @property
    def best(self) -> Measured | None:
        """The fastest measured point that fits (ties: less memory, then measured earlier)."""
        fitting = [m for m in self.measured if m.fits]
        return min(fitting, key=lambda m: (-m.tokens_per_s, measured_peak_bytes(m.record)), default=None)

    def family_best(self) -> dict[str, Measured]:
        """The fastest fitting point of every layout family, fastest family first."""
        out: dict[str, Measured] = {}
        for m in sorted((m for m in self.measured if m.fits), key=lambda m: -m.tokens_per_s):
            out.setdefault(layout_family(m.candidate.point.layout), m)
        return out

    def _decide(self, c: TuneCandidate, reason: Reason, *, fit: PredictedFit | None = None) -> None:
        self.decided.append(Decision(c, reason, None if fit is None else fit.judged_bytes))

    def outcome(self) -> TuneRecord:
        """What run.json keeps of the search (kind 'tune'), and what `tune` and `report` print."""
        best = self.best
        counts = Counter(d.kind.value for d in self.decided)
        return TuneRecord(
            kind="tune",
            limit_bytes=self.limit_bytes,
            answer=None if best is None else best.summary(),
            semantic_changes=[] if best is None else semantic_changes(best.candidate.point),
            family_best={f: m.summary() for f, m in self.family_best().items()},
            margin=MarginRecord(ratio=self.margin.ratio, source=self.margin.source),
            measured_points=self.spent_points,
            stopped_by=self.stopped_by,
            counts=dict(counts),
            decisions=[d.stored(self.limit_bytes) for d in self.decided],
        )


# -- prunes: why a candidate is dropped before it is measured (each rule returns its reason, or None) ---


def _pruned(
    c: TuneCandidate, fit: PredictedFit, *, measured: Sequence[Measured], limit_bytes: int, best: Measured | None
) -> Reason | None:
    """Why ``c`` is not measured (the first prune that drops it), or None when it must be measured."""
    if fit.fits is False:
        return Reason(DecisionKind.PREDICTED_NOT_TO_FIT, f"predicted not to fit: {fit.basis}")
    failed = _failed_below(c, measured=measured, limit_bytes=limit_bytes)
    if failed is not None:
        return Reason(
            DecisionKind.PREDICTED_NOT_TO_FIT,
            f"predicted not to fit: predicted peak allocated {fmt_bytes(c.estimate.peak_bytes or 0)}, no less "
            f"than {failed.candidate.label}'s, which did not fit when measured ({_outcome(failed.record)})",
        )
    winner = _cheaper_winner(c, measured=measured)
    if winner is not None:
        return Reason(
            DecisionKind.CHEAPER_WINS,
            f"a cheaper setup already fits at the same tokens per step: {winner.candidate.label} "
            f"({winner.tokens_per_s:,.0f} tokens/s) with no more recomputation or memory savers",
        )
    bound = _rate_bound(c, measured=measured)
    if bound is not None and best is not None and bound <= best.tokens_per_s:
        return Reason(
            DecisionKind.CANNOT_BEAT,
            f"cannot beat {best.candidate.label} ({best.tokens_per_s:,.0f} tokens/s): at most "
            f"{bound:,.0f} tokens/s even at {RATE_SLACK:g}x the best FLOP rate measured in its class",
        )
    return None


def _failed_below(c: TuneCandidate, *, measured: Sequence[Measured], limit_bytes: int) -> Measured | None:
    """A measured point that did not fit (out of memory, or over the limit) although predicted to need
    no more than this candidate: the allocator's overhead above the prediction is at least as large here."""
    mine = c.estimate.peak_bytes
    if mine is None:
        return None
    for m in measured:
        theirs = m.candidate.estimate.peak_bytes
        over = m.record.status == "oom" or (m.record.ok and not measured_fits(m.record, limit_bytes))
        if over and theirs is not None and theirs <= mine:
            return m
    return None


def _cheaper_winner(c: TuneCandidate, *, measured: Sequence[Measured]) -> Measured | None:
    """A measured point that fits with the same tokens per step and speed class, no more hardware FLOPs,
    a subset of the memory savers and no more micro-batches."""
    for m in measured:
        o = m.candidate
        if (
            m.fits
            and o.point.tokens == c.point.tokens
            and speed_class(o.point) == speed_class(c.point)
            and o.hardware_flops <= c.hardware_flops
            and savers(o.point) <= savers(c.point)
            and o.point.micro_batches <= c.point.micro_batches
        ):
            return m
    return None


def _rate_bound(c: TuneCandidate, *, measured: Sequence[Measured]) -> float | None:
    """The most tokens/s ``c`` could reach: its FLOPs at ``RATE_SLACK`` times its class's best measured rate."""
    mine = speed_class(c.point)
    rates = [m.flop_rate for m in measured if m.record.ok and speed_class(m.candidate.point) == mine]
    if not rates or not c.hardware_flops:
        return None
    return c.point.tokens * max(rates) * RATE_SLACK / c.hardware_flops


def _outcome(record: PointRecord) -> str:
    return "out of memory" if record.status == "oom" else f"{fmt_bytes(measured_peak_bytes(record))} peak reserved"
