"""Points the claims need but no run measured: exact memory predictions and fitted step times, as plain data (pure).

The estimator (estimator/estimator.py) imports torch, so the answers room never runs it: a room above
(advise/answers_predictions.py) predicts the points :func:`wanted` names, runs the :class:`Search` es it lists,
and hands the results in as :class:`Predictions` (a mapping point key -> :class:`PredictedPoint`, and the
step-time model of analysis/step_time.py fitted to the same runs). A claim reads a measured point where
one exists and a :class:`Pred` otherwise; every number a Pred gives is labelled *predicted* (memory: the
estimator's allocated bytes are exact, its reserved bytes replay the card's caching allocator in a
fresh process), *fitted* (a step time from the time model inside a measured cell, with its leave-one-out error
bound) or *modelled* (another cell, from the point's op costs, with the op model's leave-one-cell-out bound).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ckptbench.analysis.step_time import StepTimeModel, StepTimePrediction
from ckptbench.answers.evidence import Scope, key_label, key_short
from ckptbench.config.grid import PointKey, key_id, point_of
from ckptbench.results.fit import predicted_fits, predicted_needed_bytes
from ckptbench.train.flops import OpCosts
from ckptbench.units import fmt_bytes

PREDICTED, FITTED, MODELLED = "predicted", "fitted", "modelled"


@dataclass(frozen=True)
class OomFigures:
    """Where a replayed step runs out of memory, as PyTorch's message would say it."""

    where: str  # 'warm-up step 2, forward of the loss and logits'
    request_bytes: int
    allocated_bytes: int
    reserved_bytes: int


@dataclass(frozen=True)
class PredictedPoint:
    """The estimator's prediction of one point (every byte a prediction)."""

    key: PointKey
    peak_allocated_bytes: int | None  # None: not estimated (``note`` says why)
    peak_reserved_bytes: int | None  # None: the replay ran out of memory (``oom``), or no replay
    oom: OomFigures | None = None
    params_bytes: int | None = None
    grads_bytes: int | None = None
    optimizer_state_bytes: int | None = None
    note: str | None = None
    ops: OpCosts | None = None  # its step's op costs (Estimator.op_costs), for a modelled step time; None: not given

    @property
    def key_id(self) -> str:
        return key_id(self.key)

    @property
    def static_bytes(self) -> int | None:
        parts = (self.params_bytes, self.grads_bytes, self.optimizer_state_bytes)
        return None if any(p is None for p in parts) else sum(p or 0 for p in parts)


@dataclass(frozen=True)
class Pred:
    """A predicted point as the claims quote it: the same questions a measured ``Cite`` answers, labelled."""

    point: PredictedPoint
    time: StepTimePrediction | None
    tag: str = PREDICTED
    run: str = "(predicted)"

    @property
    def key(self) -> PointKey:
        return dict(self.point.key)

    @property
    def label(self) -> str:
        return key_label(self.key)

    @property
    def short(self) -> str:
        return key_short(self.key)

    @property
    def ok(self) -> bool:
        """Estimated, and the replay did not run out of memory."""
        return self.point.peak_allocated_bytes is not None and self.point.oom is None

    @property
    def known(self) -> bool:
        """Estimated (its memory, or where it runs out of memory, is predicted)."""
        return self.point.peak_allocated_bytes is not None

    @property
    def needed(self) -> int | None:
        """What must fit, as advise judges it (results/fit.py): the replayed peak reserved raised to its bound for
        its kind of layout; the context is the budget's (answers/verdicts.py: ``Budget``)."""
        p = self.point
        key = p.key
        return predicted_needed_bytes(peak_reserved_bytes=p.peak_reserved_bytes, context_bytes=0,
                                      peak_allocated_bytes=p.peak_allocated_bytes,
                                      bound_for=(str(key["layout"]), int(key["batch_size"])))

    @property
    def mem(self) -> int:
        return (self.needed or 0) if self.ok else 0

    @property
    def alloc(self) -> int:
        return self.point.peak_allocated_bytes or 0

    @property
    def step_s(self) -> float | None:
        return self.time.step_time_s if self.time is not None else None

    @property
    def tps(self) -> float | None:
        return self.time.tokens_per_s if self.time is not None else None

    def fits(self, limit_bytes: int) -> bool:
        return predicted_fits(self.needed, limit_bytes, oom=self.point.oom is not None) is True

    def gib(self) -> str:
        """'59.91 GiB (predicted)', 'OOM (predicted)' or 'not estimated'."""
        if not self.known:
            return "not estimated"
        return f"{fmt_bytes(self.mem)} ({PREDICTED})" if self.ok else f"OOM ({PREDICTED})"

    def gb(self) -> str:
        return f"{self.mem / 1e9:.1f} GB ({PREDICTED})"


@dataclass(frozen=True)
class Search:
    """A boundary the claims need: the smallest layout of a family, or the largest batch, that fits the limit.

    ``key`` is the point searched; ``vary`` is 'batch_size', or a layout family ('first') whose count of layers
    varies from ``lo`` to ``hi``. Fitting is monotone along the axis, so a bisection finds the boundary.
    """

    name: str
    key: PointKey
    vary: str
    lo: int
    hi: int
    want: Literal["smallest", "largest"]

    def at(self, value: int) -> PointKey:
        if self.vary == "batch_size":
            return {**self.key, "batch_size": value}
        return {**self.key, "layout": f"{self.vary}:{value}"}


@dataclass(frozen=True)
class Found:
    """The boundary of a search: the value that fits and, beside it, the one that does not (None: the range's
    end fits, so the boundary lies beyond ``Search.hi`` for 'largest')."""

    search: Search
    value: int
    at: Pred
    beyond: Pred | None


@dataclass(frozen=True)
class Wanted:
    """What the claims ask the estimator for: single points and searches."""

    points: tuple[PointKey, ...]
    searches: tuple[Search, ...]


MIDDLE = "range:8-12"
BATCH_UP_TO = 6
SEQS = (1024, 512)  # the thread's shorter sequence lengths (claim 10)
OFFLOAD_LAYOUTS = ("first:8", "every:4")  # offloading with 4-8 checkpointed layers (claim 8)
BIG_BATCH = 8  # the larger batch of the thread's claims (1, 8, 11, 13)


def searches(scope: Scope) -> dict[str, Search]:
    """Every search the claims ask for, by name."""
    n, s = scope.num_layers, scope.seq_len
    found = {
        f"fewest first:k b={BIG_BATCH}": Search(f"the fewest first:k that fit at batch {BIG_BATCH}",
                                                scope.key("first:1", BIG_BATCH), "first", 1, n, "smallest"),
        "largest batch range:8-12": Search(f"the largest batch of {MIDDLE} that fits", scope.key(MIDDLE, 2),
                                           "batch_size", 2, 8, "largest"),
    }
    for seq in SEQS:
        # More tokens per step than batch 2 at the scope's length is the smallest batch worth asking about.
        lo = 2 * s // seq
        found[f"largest batch none s={seq}"] = Search(
            f"the largest batch of none that fits at sequence {seq}", {**scope.key("none", lo), "seq_len": seq},
            "batch_size", lo, 3 * lo, "largest")
    return found


def wanted(scope: Scope) -> Wanted:
    """The points the claims quote when no run measured them, and the searches they need (LLaMA-7B's thread)."""
    k = scope.key
    points = [
        k("none", 2), k("all", 2), k(MIDDLE, 2), k(MIDDLE, BATCH_UP_TO), k("last:4", 2), k("last:6", 2),
        k("none", 4), k("none", BIG_BATCH), k("all", BIG_BATCH), k("none", 1, micro_batches=BIG_BATCH),
        k("none", 2, precision="amp_bf16"), k("all", 2, precision="amp_bf16"),
        *(k(layout, BIG_BATCH, **axes) for layout in OFFLOAD_LAYOUTS for axes in ({}, {"offload": "all"})),
    ]
    return Wanted(tuple(points), tuple(searches(scope).values()))


@dataclass(frozen=True)
class Predictions:
    """What the estimator predicted (by key) and the step-time model, for the claims to quote, labelled."""

    points: Mapping[str, PredictedPoint] = field(default_factory=dict)
    card: str = ""  # the card whose caching allocator was replayed ('NVIDIA H200')
    card_total_bytes: int | None = None
    context_bytes: int | None = None  # held outside the allocator on that card (its device model)
    source: str = ""  # how the memory was predicted, in one sentence
    times: StepTimeModel | None = None

    def memory(self, key: Mapping[str, Any]) -> PredictedPoint | None:
        return self.points.get(key_id(key))

    def time(self, key: Mapping[str, Any]) -> StepTimePrediction | None:
        """The step time of the point on the card the runs were measured on: fitted inside a measured cell, else
        modelled from its op costs where its prediction carries them; None where the time model cannot say (no
        measured point of its cell and no op costs, or the cell's points do not determine it)."""
        point = point_of(key)
        if self.times is None or point is None:
            return None
        memory = self.memory(key)
        found = self.times.predict(point, ops=memory.ops if memory is not None else None)
        return found if found is not None and found.label in (FITTED, MODELLED) else None

    def why_no_time(self, key: Mapping[str, Any]) -> str:
        point = point_of(key)
        if self.times is None or point is None:
            return "no step-time model"
        return self.times.why_not(point)

    def get(self, key: Mapping[str, Any]) -> Pred | None:
        found = self.memory(key)
        return None if found is None else Pred(found, self.time(key))

    def search(self, search: Search, limit_bytes: int) -> Found | None:
        """The boundary of ``search`` among the predicted points (None when they do not bracket it): walking from
        the end that fits (the most layers; the smallest batch), the last value before the first that does not
        fit, so that a smaller count that fits alone, past one that does not, is never the answer."""
        probed = {v: p for v in range(search.lo, search.hi + 1) if (p := self.get(search.at(v))) is not None}
        fits = {v for v, p in probed.items() if p.known and p.fits(limit_bytes)}
        smallest = search.want == "smallest"
        best = None
        for v in sorted(probed, reverse=smallest):
            if v not in fits:
                break
            best = v
        if best is None:
            return None
        beyond = best - 1 if smallest else best + 1
        if beyond in probed or best == (search.lo if smallest else search.hi):
            return Found(search, best, probed[best], probed.get(beyond))
        return None

    def search_named(self, scope: Scope, name: str, limit_bytes: int) -> Found | None:
        """The boundary of the search of that name (``searches``); None when there is none or it was not run."""
        found = searches(scope).get(name)
        return None if found is None else self.search(found, limit_bytes)

    @property
    def time_source(self) -> str | None:
        """The source of the fitted times of the scope's main cell (the one with the most points)."""
        if self.times is None or not self.times.cells:
            return None
        cell = max(self.times.cells, key=lambda c: len(c.observations))
        return cell.source()


def time_label(c: Any) -> str:
    """How a cited point's step time is labelled: 'measured', or its prediction's own label ('fitted', 'modelled')."""
    if c.tag != PREDICTED:
        return str(c.tag)
    time = getattr(c, "time", None)
    return time.label if time is not None else FITTED


def fmt_time(c: Any) -> str:
    """'418.5 ms/step (fitted)', '512.0 ms/step (modelled)' or '388.3 ms/step (measured)'; 'step time not
    predicted' without one."""
    s = c.step_s
    if not s:
        return "step time not predicted"
    return f"{s * 1e3:.1f} ms/step ({time_label(c)})"


def fmt_tok(c: Any) -> str:
    t = c.tps
    if not t:
        return "tokens/s not predicted"
    return f"{t:,.0f} tok/s ({time_label(c)})"


def fmt_mem(c: Any) -> str:
    """'59.91 GiB (predicted)' or '63.22 GiB (measured)' (peak reserved, what must fit); the status when it did
    not run."""
    if c.tag == PREDICTED:
        return str(c.gib())
    return f"{fmt_bytes(c.mem)} (measured)" if c.ok else f"{c.record.status.upper()} (measured)"


def fmt_alloc(c: Any) -> str:
    return f"{fmt_bytes(c.alloc)} ({c.tag})"


def fmt_gb(c: Any) -> str:
    """'64.3 GB (59.91 GiB, predicted)': decimal GB as quoted from nvidia-smi, then GiB and the label."""
    return f"{c.mem / 1e9:.1f} GB ({fmt_bytes(c.mem)}, {c.tag})"
