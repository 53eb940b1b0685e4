"""The fastest measured point that fits a memory budget, and the memory/throughput Pareto front (pure).

Memory here is **peak reserved bytes**: what the caching allocator held from the device during the
measured steps (allocated tensors plus cached, fragmented blocks). That, not peak allocated, is what
must fit on the card next to other processes; allocated underestimates it by the allocator's cache.
Records without a reserved figure fall back to peak allocated (on CPU the two are equal). To that the
memory the process holds outside the allocator is added (the CUDA context): measured with the point
(``context_bytes``) or, for runs that did not record it, the device model's figure for the run's GPU
(estimate/gpus.py): a point fits a card when both fit.

A run's points become ``Candidate``s in analysis/recommend_candidates.py; the Pareto front is analysis/pareto.py.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ckptbench.analysis.pareto import pareto_front
from ckptbench.analysis.recommend_candidates import BREAKDOWN, Candidate, candidates, point_label, seq_len_of
from ckptbench.errors import ConfigError
from ckptbench.results.store import Run
from ckptbench.units import GIB_UNIT, SizeUnit

DEFAULT_HEADROOM = "5%"  # of the budget: room for fragmentation growth, the CUDA context, other processes
MEMORY_METRIC = "peak_reserved_bytes"

__all__ = [
    "BREAKDOWN", "DEFAULT_HEADROOM", "MEMORY_METRIC", "Candidate", "Recommendation", "candidates", "dominant_part",
    "explain", "pareto_front", "point_label", "recommend",
]


def _fastest(cands: Sequence[Candidate]) -> Candidate | None:
    # Highest tokens/s; ties go to less memory, then to the earlier point.
    return min(cands, key=lambda c: (-c.tokens_per_s, c.memory_bytes, c.index), default=None)


def _smallest(cands: Sequence[Candidate]) -> Candidate | None:
    return min(cands, key=lambda c: (c.memory_bytes, -c.tokens_per_s, c.index), default=None)


@dataclass
class Recommendation:
    """The answer for one budget: the winner (or None), runners-up per layout, the Pareto front."""

    run_name: str
    budget_bytes: int
    headroom_bytes: int
    seq_len: int | None
    best: Candidate | None
    runners_up: list[Candidate]
    no_fit_layouts: list[Candidate]  # the smallest point of each layout that has nothing under the limit
    pareto: list[Candidate]
    smallest: Candidate | None
    fastest: Candidate | None
    num_points: int
    why: str = ""
    # Runners-up whose speed gap to the best is inside the step-time spread.
    within_noise: list[Candidate] = field(default_factory=list)
    skipped_statuses: dict[str, int] = field(default_factory=dict)
    # The one unit of every size in the answer, its sentence and the report around it (units.py).
    size: SizeUnit = GIB_UNIT

    @property
    def limit_bytes(self) -> int:
        """The most peak reserved memory a point may have: the budget minus the headroom."""
        return self.budget_bytes - self.headroom_bytes

    def room(self, c: Candidate) -> str:
        """How far a point's peak reserved memory is under ('free') or over the limit (budget - headroom)."""
        gap = self.limit_bytes - c.memory_bytes
        return f"{self.size(gap)} free" if gap >= 0 else f"{self.size(-gap)} over"

    def to_json(self) -> dict[str, Any]:
        lim = self.limit_bytes

        def dump(c: Candidate | None) -> dict[str, Any] | None:
            return None if c is None else c.to_json(limit_bytes=lim)

        return {
            "run": self.run_name,
            "budget_bytes": self.budget_bytes,
            "headroom_bytes": self.headroom_bytes,
            "limit_bytes": lim,
            "memory_metric": MEMORY_METRIC,
            "seq_len": self.seq_len,
            "fits": self.best is not None,
            "best": dump(self.best),
            "runners_up": [dump(c) for c in self.runners_up],
            "no_fit_layouts": [dump(c) for c in self.no_fit_layouts],
            "smallest": dump(self.smallest),
            "fastest": dump(self.fastest),
            "pareto": [dump(c) for c in self.pareto],
            "num_points": self.num_points,
            "within_noise": [c.label for c in self.within_noise],
            "not_ok_points": self.skipped_statuses,
            "why": self.why,
        }


def recommend(
    run: Run, *, budget_bytes: int, headroom_bytes: int, seq_len: int | None = None
) -> Recommendation:
    """The fastest ok point whose peak reserved memory plus the headroom fits under the budget."""
    if seq_len is not None and not any(seq_len_of(r) == seq_len for r in run.points):
        have = sorted({seq_len_of(r) for r in run.points}, key=str)
        raise ConfigError(f"--seq-len: the run has no point with seq_len {seq_len} (it has {have})")
    cands = candidates(run, seq_len=seq_len)
    limit = budget_bytes - headroom_bytes
    best = _fastest([c for c in cands if c.memory_bytes <= limit])
    runners_up, no_fit = _per_layout(cands, limit=limit, best=best)
    scope = [r for r in run.points if seq_len is None or seq_len_of(r) == seq_len]
    not_ok = Counter(r.status for r in scope if not r.ok)
    rec = Recommendation(
        run_name=run.title, budget_bytes=budget_bytes, headroom_bytes=headroom_bytes, seq_len=seq_len,
        best=best, runners_up=runners_up, no_fit_layouts=no_fit, pareto=pareto_front(cands),
        smallest=_smallest(cands), fastest=_fastest(cands), num_points=len(scope),
        skipped_statuses=dict(sorted(not_ok.items())),
        size=SizeUnit.for_sizes([*run.sizes(), budget_bytes]),
    )
    rec.within_noise = [c for c in runners_up if best is not None and _within_noise(best, c)]
    rec.why = explain(rec)
    return rec


def _within_noise(best: Candidate, other: Candidate) -> bool:
    """The speed gap is no larger than the step-time spread of either point."""
    gap = (best.tokens_per_s - other.tokens_per_s) / best.tokens_per_s
    return gap <= max(best.relative_spread, other.relative_spread)


def _per_layout(
    cands: Sequence[Candidate], *, limit: int, best: Candidate | None
) -> tuple[list[Candidate], list[Candidate]]:
    """The fastest fitting point of every other layout, and the smallest point of layouts where none fits."""
    runners_up, no_fit = [], []
    for layout in dict.fromkeys(c.layout for c in cands):
        mine = [c for c in cands if c.layout == layout]
        top = _fastest([c for c in mine if c.memory_bytes <= limit])
        if top is None:
            no_fit.append(_smallest(mine))
        elif best is not None and layout != best.layout:
            runners_up.append(top)
    runners_up.sort(key=lambda c: (-c.tokens_per_s, c.memory_bytes, c.index))
    return runners_up, [c for c in no_fit if c is not None]


def dominant_part(c: Candidate) -> tuple[str, float]:
    """The largest part of the winner's peak allocated memory and its share of it."""
    name, value = max(((label, c.breakdown[f]) for f, label in BREAKDOWN), key=lambda t: t[1])
    return name, value / c.peak_allocated_bytes if c.peak_allocated_bytes else 0.0


def _what(c: Candidate, size: SizeUnit) -> str:
    """What a candidate's memory figure is made of."""
    return f"peak reserved + {size(c.context_bytes)} context" if c.context_bytes else "peak reserved"


def explain(rec: Recommendation) -> str:
    """One or two sentences: why this point (or why nothing fits). Its sizes are the tables' (``rec.room``)."""
    size = rec.size
    budget = size(rec.budget_bytes)
    limit = f"the {size(rec.limit_bytes)} limit" if rec.headroom_bytes else f"the {budget} budget"
    if rec.best is None:
        if rec.smallest is None:
            return f"Nothing fits under {budget}: no point of the run finished ok ({rec.num_points} points)."
        s = rec.smallest
        headroom = f" with {size(rec.headroom_bytes)} headroom" if rec.headroom_bytes else ""
        return (
            f"Nothing fits under {budget}{headroom}: the smallest point, "
            f"{s.label}, needs {size(s.memory_bytes)} {_what(s, size)}, {rec.room(s)} {limit}."
        )
    b = rec.best
    parts = ", ".join(f"{label} {size(b.breakdown[f])}" for f, label in BREAKDOWN)
    dom, share = dominant_part(b)
    asked = f" ({budget} budget minus {size(rec.headroom_bytes)} headroom)" if rec.headroom_bytes else ""
    text = (
        f"{b.label} is the fastest point that fits: {b.tokens_per_s:,.0f} tokens/s at "
        f"{size(b.memory_bytes)} {_what(b, size)} ({size(b.peak_allocated_bytes)} allocated: {parts}; "
        f"{dom} dominates with {share:.0%}), leaving {rec.room(b)} under {limit}{asked}."
    )
    if rec.runners_up:
        r = rec.runners_up[0]
        ratio = r.tokens_per_s / b.tokens_per_s
        text += f" The best other layout, {r.label}, reaches {ratio:.0%} of that speed."
    f = rec.fastest
    if f is not None and f is not b:
        text += f" The fastest point overall, {f.label}, needs {size(f.memory_bytes)}."
    return text
