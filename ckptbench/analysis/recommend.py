"""The fastest measured point that fits a memory budget, and the memory/throughput Pareto front (pure).

Memory here is **peak reserved bytes**: what the caching allocator held from the device during the
measured steps (allocated tensors plus cached, fragmented blocks). That, not peak allocated, is what
must fit on the card next to other processes; allocated underestimates it by the allocator's cache.
Records without a reserved figure fall back to peak allocated (on CPU the two are equal). To that the
memory the process holds outside the allocator is added (the CUDA context): measured with the point
(``context_bytes``) or, for runs that did not record it, the device model's figure for the run's GPU
(estimator/gpus.py): a point fits a card when both fit.

Whether a point fits is results/fit.py's ``measured_fits``, as for every command. A run's ok points become
``RecommendCandidate``s (``candidates``); ``pareto_front`` is the memory/throughput front among them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ckptbench.analysis.tune_space import training_change
from ckptbench.config.grid import PointKey
from ckptbench.errors import ConfigError
from ckptbench.estimator.gpus import gpu_for_name
from ckptbench.json_object import JsonObject
from ckptbench.results.fit import measured_fits, measured_needed_bytes, measured_peak_bytes
from ckptbench.results.record import PointRecord
from ckptbench.results.store import Run
from ckptbench.units import GIB_UNIT, SizeUnit

# The figure a point must fit with (results/fit.py): its peak reserved plus the CUDA context. Tables name it
# "needed", apart from "peak reserved", the measured figure alone.
MEMORY_METRIC = "needed_bytes"
BREAKDOWN = (
    ("params_bytes", "params"),
    ("grads_bytes", "grads"),
    ("optimizer_state_bytes", "optimizer state"),
    ("activation_bytes", "activation"),
)


@dataclass(frozen=True)
class RecommendCandidate:
    """One ok point, reduced to what a recommendation needs."""

    index: int  # position in points.jsonl (stable tie-break)
    record: PointRecord = field(repr=False, compare=False)
    key: PointKey
    label: str
    memory_bytes: int  # "needed": what must fit, peak reserved plus the context (results/fit.py)
    peak_allocated_bytes: int
    peak_reserved_bytes: int | None
    tokens_per_s: float
    median_step_time_s: float
    step_time_iqr_s: float
    breakdown: dict[str, int]
    layers_checkpointed: str | None
    notes: tuple[str, ...] = ()
    context_bytes: int = 0  # outside the allocator, included in memory_bytes
    card_context_bytes: int = 0  # the run's card's context: counted for a record that did not measure its own

    @property
    def layout(self) -> str:
        return str(self.key.get("layout"))

    @property
    def relative_spread(self) -> float:
        """Inter-quartile range of the step time over its median."""
        return self.step_time_iqr_s / self.median_step_time_s if self.median_step_time_s > 0 else 0.0

    @property
    def reserved_bytes(self) -> int:
        """The measured peak reserved (peak allocated where none was recorded, as on CPU): results/fit.py."""
        return measured_peak_bytes(self.record)

    def fits(self, limit_bytes: int) -> bool:
        """Whether the point fits under ``limit_bytes`` (results/fit.py: ``measured_fits``)."""
        return measured_fits(self.record, limit_bytes, card_context_bytes=self.card_context_bytes)

    def to_json(self, *, limit_bytes: int | None = None) -> JsonObject:
        out = {
            "key": self.key,
            "label": self.label,
            "peak_allocated_bytes": self.peak_allocated_bytes,
            "peak_reserved_bytes": self.peak_reserved_bytes,
            "needed_bytes": self.memory_bytes,
            "tokens_per_s": self.tokens_per_s,
            "median_step_time_s": self.median_step_time_s,
            "step_time_iqr_s": self.step_time_iqr_s,
            "memory": self.breakdown,
            "layers_checkpointed": self.layers_checkpointed,
            "notes": list(self.notes),
            "context_bytes": self.context_bytes,
        }
        if limit_bytes is not None:
            out["fits"] = self.fits(limit_bytes)
        return out


def point_label(key: PointKey, *, extra: Sequence[str] = ()) -> str:
    """'every:4 b=4 s=2048', plus any other key axes named in ``extra`` (those that vary in the run)."""
    parts = [str(key.get("layout")), f"b={key.get('batch_size')}", f"s={key.get('seq_len')}"]
    parts += [f"{name}={key.get(name)}" for name in extra]
    return " ".join(parts)


def _varying_axes(keys: Sequence[PointKey]) -> list[str]:
    names = sorted({n for k in keys for n in k} - {"layout", "batch_size", "seq_len"})
    return [n for n in names if len({repr(k.get(n)) for k in keys}) > 1]


def run_optimizer(run: Run) -> str:
    """The optimizer the run trains with (its config's): what 'the same training' means for its points."""
    return str(run.config.get("optimizer") or "adamw_fused")


def changes_training(run: Run, rec: PointRecord, allow: Sequence[str]) -> tuple[str, str] | None:
    """(the --allow name, why) when the point trains something else (analysis/tune_space.py
    ``training_change``) and ``allow`` does not name it; None: a candidate."""
    change = training_change(rec.key, optimizer=run_optimizer(run))
    return change if change is not None and change[0] not in allow else None


def candidates(run: Run, *, seq_len: int | None = None, allow: Sequence[str] = ()) -> list[RecommendCandidate]:
    """The run's ok points (optionally of one sequence length) with a throughput and a peak; points that
    train something other than full fine-tuning only when ``allow`` names their technique."""
    scope = [(i, r) for i, r in enumerate(run.points) if r.ok and (seq_len is None or seq_len_of(r) == seq_len)]
    extra = _varying_axes([r.key for _, r in scope])  # labels name what varies, left-out points included
    scope = [(i, r) for i, r in scope if changes_training(run, r, allow) is None]
    card = gpu_for_name(run.environment.gpu_name)
    context = card.context_bytes if card is not None else 0
    found = (_candidate(i, r, extra=extra, context=context) for i, r in scope)
    return [c for c in found if c is not None]


def seq_len_of(rec: PointRecord) -> Any:
    return rec.key.get("seq_len")


def _candidate(index: int, rec: PointRecord, *, extra: Sequence[str], context: int = 0) -> RecommendCandidate | None:
    alloc, reserved = rec.peak_allocated_bytes, rec.peak_reserved_bytes
    tokens_per_s, median = rec.tokens_per_s, rec.median_step_time_s
    if tokens_per_s is None or median is None or alloc is None:
        return None
    breakdown = {name: int(getattr(rec.memory, name) or 0) for name, _ in BREAKDOWN[:3]}
    breakdown["activation_bytes"] = int(rec.activation_bytes or 0)
    notes = []
    if rec.loss_mismatch:
        notes.append("loss differs from its reference (loss_check)")
    if rec.leaked:
        notes.append("memory leaked after the point")
    return RecommendCandidate(
        index=index,
        record=rec,
        key=dict(rec.key),
        label=point_label(rec.key, extra=extra),
        memory_bytes=measured_needed_bytes(rec, card_context_bytes=context),
        peak_allocated_bytes=int(alloc),
        peak_reserved_bytes=None if reserved is None else int(reserved),
        tokens_per_s=float(tokens_per_s),
        median_step_time_s=float(median),
        step_time_iqr_s=float(rec.step_time_iqr_s or 0.0),
        breakdown=breakdown,
        layers_checkpointed=rec.layers_checkpointed,
        notes=tuple(notes),
        context_bytes=rec.context_bytes or context,
        card_context_bytes=context,
    )


def pareto_front(cands: Sequence[RecommendCandidate]) -> list[RecommendCandidate]:
    """Points no other point beats on both axes (less or equal memory and more or equal tokens/s,
    one of them strictly), by memory ascending. Exact duplicates both stay."""

    def dominated(c: RecommendCandidate) -> bool:
        return any(
            o.memory_bytes <= c.memory_bytes
            and o.tokens_per_s >= c.tokens_per_s
            and (o.memory_bytes < c.memory_bytes or o.tokens_per_s > c.tokens_per_s)
            for o in cands
        )

    return sorted((c for c in cands if not dominated(c)), key=lambda c: (c.memory_bytes, c.index))


def _fastest(cands: Sequence[RecommendCandidate]) -> RecommendCandidate | None:
    # Highest tokens/s; ties go to less memory, then to the earlier point.
    return min(cands, key=lambda c: (-c.tokens_per_s, c.memory_bytes, c.index), default=None)


def _smallest(cands: Sequence[RecommendCandidate]) -> RecommendCandidate | None:
    return min(cands, key=lambda c: (c.memory_bytes, -c.tokens_per_s, c.index), default=None)


@dataclass
class Recommendation:
    """The answer for one budget: the winner (or None), runners-up per layout, the Pareto front."""

    run_name: str
    budget_bytes: int
    headroom_bytes: int
    seq_len: int | None
    best: RecommendCandidate | None
    runners_up: list[RecommendCandidate]
    no_fit_layouts: list[RecommendCandidate]  # the smallest point of each layout that has nothing under the limit
    pareto: list[RecommendCandidate]
    smallest: RecommendCandidate | None
    fastest: RecommendCandidate | None
    num_points: int
    why: str = ""
    # Runners-up whose speed gap to the best is inside the step-time spread.
    within_noise: list[RecommendCandidate] = field(default_factory=list)
    skipped_statuses: dict[str, int] = field(default_factory=dict)
    # Points left out because they train something else (LoRA, another optimizer): label -> why.
    other_training: dict[str, str] = field(default_factory=dict)
    other_training_allow: tuple[str, ...] = ()  # the --allow names that would include them
    # The one unit of every size in the answer, its sentence and the report around it (units.py).
    size: SizeUnit = GIB_UNIT

    @property
    def limit_bytes(self) -> int:
        """The most a point may need (peak reserved + context): the budget minus the headroom."""
        return self.budget_bytes - self.headroom_bytes

    def room(self, c: RecommendCandidate) -> str:
        """How far what a point needs is under ('free') or over the limit (budget - headroom)."""
        gap = self.limit_bytes - c.memory_bytes
        return f"{self.size(gap)} free" if gap >= 0 else f"{self.size(-gap)} over"

    def to_json(self) -> JsonObject:
        lim = self.limit_bytes

        def dump(c: RecommendCandidate | None) -> JsonObject | None:
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
            "other_training": self.other_training,
            "why": self.why,
        }


def recommend(
    run: Run, *, budget_bytes: int, headroom_bytes: int, seq_len: int | None = None, allow: Sequence[str] = ()
) -> Recommendation:
    """The fastest ok point whose needed memory (peak reserved + context) fits under the budget minus the
    headroom; a point that trains something other than full fine-tuning only when ``allow`` names it."""
    if seq_len is not None and not any(seq_len_of(r) == seq_len for r in run.points):
        have = sorted({seq_len_of(r) for r in run.points}, key=str)
        raise ConfigError(f"--seq-len: the run has no point with seq_len {seq_len} (it has {have})")
    cands = candidates(run, seq_len=seq_len, allow=allow)
    limit = budget_bytes - headroom_bytes
    best = _fastest([c for c in cands if c.fits(limit)])
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
    extra = _varying_axes([r.key for r in scope if r.ok])
    left_out = [(r, change) for r in scope if r.ok and (change := changes_training(run, r, allow))]
    rec.other_training = {point_label(r.key, extra=extra): why for r, (_, why) in left_out}
    rec.other_training_allow = tuple(sorted({name for _, (name, _) in left_out}))
    rec.within_noise = [c for c in runners_up if best is not None and _within_noise(best, c)]
    rec.why = explain(rec)
    return rec


def _within_noise(best: RecommendCandidate, other: RecommendCandidate) -> bool:
    """The speed gap is no larger than the step-time spread of either point."""
    gap = (best.tokens_per_s - other.tokens_per_s) / best.tokens_per_s
    return gap <= max(best.relative_spread, other.relative_spread)


def _per_layout(
    cands: Sequence[RecommendCandidate], *, limit: int, best: RecommendCandidate | None
) -> tuple[list[RecommendCandidate], list[RecommendCandidate]]:
    """The fastest fitting point of every other layout, and the smallest point of layouts where none fits."""
    runners_up, no_fit = [], []
    for layout in dict.fromkeys(c.layout for c in cands):
        mine = [c for c in cands if c.layout == layout]
        top = _fastest([c for c in mine if c.fits(limit)])
        if top is None:
            no_fit.append(_smallest(mine))
        elif best is not None and layout != best.layout:
            runners_up.append(top)
    runners_up.sort(key=lambda c: (-c.tokens_per_s, c.memory_bytes, c.index))
    return runners_up, [c for c in no_fit if c is not None]


def dominant_part(c: RecommendCandidate) -> tuple[str, float]:
    """The largest part of the winner's peak allocated memory and its share of it."""
    name, value = max(((label, c.breakdown[f]) for f, label in BREAKDOWN), key=lambda t: t[1])
    return name, value / c.peak_allocated_bytes if c.peak_allocated_bytes else 0.0


def _what(c: RecommendCandidate, size: SizeUnit) -> str:
    """A candidate's two memory figures: '63.22 GiB peak reserved, 63.96 GiB needed with the 0.74 GiB CUDA
    context' (one figure where there is no context)."""
    if not c.context_bytes:
        return f"{size(c.reserved_bytes)} peak reserved"
    return (f"{size(c.reserved_bytes)} peak reserved, {size(c.memory_bytes)} needed with the "
            f"{size(c.context_bytes)} CUDA context")


def _needs(c: RecommendCandidate, size: SizeUnit) -> str:
    """'63.96 GiB (63.22 GiB peak reserved + 0.74 GiB CUDA context)', or '53.48 GiB peak reserved' without a context."""
    if not c.context_bytes:
        return f"{size(c.reserved_bytes)} peak reserved"
    return f"{size(c.memory_bytes)} ({size(c.reserved_bytes)} peak reserved + {size(c.context_bytes)} CUDA context)"


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
            f"{s.label}, needs {_needs(s, size)}, {rec.room(s)} {limit}."
        )
    b = rec.best
    parts = ", ".join(f"{label} {size(b.breakdown[f])}" for f, label in BREAKDOWN)
    dom, share = dominant_part(b)
    asked = f" ({budget} budget minus {size(rec.headroom_bytes)} headroom)" if rec.headroom_bytes else ""
    text = (
        f"{b.label} is the fastest point that fits: {b.tokens_per_s:,.0f} tokens/s at "
        f"{_what(b, size)} ({size(b.peak_allocated_bytes)} allocated: {parts}; "
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
