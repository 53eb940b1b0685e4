"""tune's decisions (pure): which candidate to measure next, which to drop and why, and the answer.

The search keeps one training semantics and looks for the highest measured tokens/s whose measured
peak reserved memory plus the CUDA context fits under the limit (budget minus headroom). Candidates are
taken in order of tokens per step (most first), then hardware FLOPs (least recomputation first), then
how many memory-saving techniques they use (fewest first). Before a candidate is measured it must
survive three prunes, each recorded with its reason:

1. **prediction**: ``predicted_fit`` (the one place an estimate is judged against the budget) says
   it does not fit: never measured;
2. **a cheaper setup already wins**: a measured point that fits has the same tokens per step and
   speed class, no more hardware FLOPs and a subset of its memory savers: this candidate only adds
   recomputation or savers' overheads to it;
3. **it cannot beat the best**: even running its hardware FLOPs at ``RATE_SLACK`` times the best
   FLOP rate measured in its speed class, its tokens/s would not exceed the best fitting point's.

Every measurement is an ordinary point record; ``observe`` reads it. ``predicted_fit`` and the margin live
in analysis/tune_fit.py, the prunes in analysis/tune_prune.py, ``Candidate`` and ``Measured`` in
analysis/tune_candidate.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ckptbench.analysis.tune_candidate import Candidate, Measured, needed, peak
from ckptbench.analysis.tune_fit import Fit, Margin, predicted_fit
from ckptbench.analysis.tune_prune import RATE_SLACK, pruned
from ckptbench.analysis.tune_space import layout_family, semantic_changes, speed_class
from ckptbench.config.grid import Point
from ckptbench.results.record import PointRecord
from ckptbench.units import fmt_bytes

__all__ = ["RATE_SLACK", "Candidate", "Fit", "Margin", "Measured", "TunePlanner", "predicted_fit"]


@dataclass
class TunePlanner:
    """The search's state: candidates left, what was measured, and every decision with its reason."""

    candidates: list[Candidate]
    limit_bytes: int
    max_points: int | None = None
    time_budget_s: float | None = None
    margin: Margin = field(default_factory=lambda: Margin.learn([]))
    measured: list[Measured] = field(default_factory=list)
    decisions: list[dict[str, Any]] = field(default_factory=list)
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
                    self._decide(c, "dropped", f"not reached: {stop}")
                self.candidates = []
                return None
            c = self.candidates.pop(0)
            fit = predicted_fit(c.estimate, limit_bytes=self.limit_bytes, margin=self.margin)
            why = self._pruned(c, fit)
            if why is not None:
                self._decide(c, "dropped", why, fit=fit)
                continue
            self._decide(c, "measure", f"most tokens per step left; {fit.basis}", fit=fit)
            return c.point
        return None

    def observe(self, point: Point, record: PointRecord) -> None:
        """Take in the measured record of the point ``next`` returned (or a resumed run's)."""
        c = self._by_key[point.key_id]
        fits = record.ok and not record.loss_mismatch and needed(record) <= self.limit_bytes
        self.measured.append(Measured(c, record, fits))
        self.margin = Margin.learn([m.record for m in self.measured])
        self.decisions[-1].update(_measured_fields(record, fits, self.limit_bytes))
        if record.status == "skipped":
            self._drop_class(c, record.reason or "skipped")

    def _drop_class(self, skipped: Candidate, reason: str) -> None:
        """A technique that cannot run here (not installed, needs CUDA) skips its whole speed class."""
        mine = speed_class(skipped.point)
        for c in [c for c in self.candidates if speed_class(c.point) == mine]:
            self._decide(c, "dropped", f"skipped like {skipped.label}: {reason}")
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

    # -- prunes (analysis/tune_prune.py) ---------------------------------------------------------
    def _pruned(self, c: Candidate, fit: Fit) -> str | None:
        return pruned(c, fit, measured=self.measured, limit_bytes=self.limit_bytes, best=self.best)

    # -- the answer ---------------------------------------------------------------------------
    @property
    def best(self) -> Measured | None:
        """The fastest measured point that fits (ties: less memory, then measured earlier)."""
        fitting = [m for m in self.measured if m.fits]
        return min(fitting, key=lambda m: (-m.tokens_per_s, peak(m.record)), default=None)

    def family_best(self) -> dict[str, Measured]:
        """The fastest fitting point of every layout family, fastest family first."""
        out: dict[str, Measured] = {}
        for m in sorted((m for m in self.measured if m.fits), key=lambda m: -m.tokens_per_s):
            out.setdefault(layout_family(m.candidate.point.layout), m)
        return out

    def _decide(self, c: Candidate, action: str, why: str, *, fit: Fit | None = None) -> None:
        entry: dict[str, Any] = {"key": c.point.key, "label": c.label, "action": action, "why": why}
        if fit is not None and fit.judged_bytes is not None:
            entry["judged_peak_bytes"] = fit.judged_bytes
        self.decisions.append(entry)

    def outcome(self) -> dict[str, Any]:
        """What run.json keeps of the search (kind 'tune'), and what `tune` and `report` print."""
        best = self.best
        counts: dict[str, int] = {}
        for d in self.decisions:
            counts[_reason_kind(d)] = counts.get(_reason_kind(d), 0) + 1
        return {
            "kind": "tune",
            "limit_bytes": self.limit_bytes,
            "answer": None if best is None else _summary(best),
            "semantic_changes": [] if best is None else semantic_changes(best.candidate.point),
            "family_best": {f: _summary(m) for f, m in self.family_best().items()},
            "margin": {"ratio": self.margin.ratio, "source": self.margin.source},
            "measured_points": self.spent_points,
            "stopped_by": self.stopped_by,
            "counts": counts,
            "decisions": self.decisions,
        }


def _measured_fields(record: PointRecord, fits: bool, limit: int) -> dict[str, Any]:
    out: dict[str, Any] = {"action": "measured", "status": record.status, "fits": fits}
    if record.ok:
        out.update(tokens_per_s=record.tokens_per_s, peak_reserved_bytes=peak(record))
        if record.loss_mismatch:
            out["note"] = "loss differs from the plain step's: not a candidate"
        elif not fits:
            ctx = record.context_bytes
            context = f" (peak reserved + {fmt_bytes(ctx)} CUDA context)" if ctx else ""
            out["note"] = f"measured {fmt_bytes(needed(record))}{context} > the {fmt_bytes(limit)} limit"
    else:
        out["note"] = record.reason
    return out


def _summary(m: Measured) -> dict[str, Any]:
    return {
        "key": m.candidate.point.key,
        "label": m.candidate.label,
        "tokens_per_s": m.tokens_per_s,
        "peak_reserved_bytes": peak(m.record),
        "peak_allocated_bytes": m.record.peak_allocated_bytes,
        "layers_checkpointed": m.record.layers_checkpointed,
    }


def _reason_kind(decision: dict[str, Any]) -> str:
    why = str(decision["why"])
    if decision["action"] != "dropped":
        return "measured"
    for prefix, kind in (("predicted not", "predicted not to fit"), ("a cheaper", "a cheaper setup wins"),
                         ("cannot beat", "cannot beat the best"), ("not reached", "not reached"),
                         ("skipped like", "cannot run here")):
        if why.startswith(prefix):
            return kind
    return "dropped"
