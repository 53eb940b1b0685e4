"""The typed answer to one claim: its parts, each with a verdict, the numbers and the points they rest on (pure).

A claim often bundles several statements ("saves more; expect 2x slower") or several forms ("8-bit
Adam; LoRA; mixed precision"). Each is a :class:`Part` with its own verdict; the claim's verdict
combines the parts that were settled, by measured points or, where none was measured, by predicted ones
(answers/predictions.py: exact memory predictions, fitted step times). A part that neither can settle is
``OPEN`` and names the GPU-campaign stage (``scripts/gpu_stages/``) that will measure it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from ckptbench.analysis.layer_series import CellSeries
from ckptbench.answers.evidence import Cite, Evidence
from ckptbench.answers.predictions import Pred, Predictions
from ckptbench.estimator.gpus import gpu_for_name
from ckptbench.results.store import Run
from ckptbench.units import fmt_bytes

# Stages of the GPU campaign (scripts/gpu_check.sh) that the open parts wait for.
STAGE_BATCH_MAX = "20-searches-batch-max"
STAGE_LAYOUT_FIT = "21-searches-layout-fit"
STAGE_CLAIMS = "22-claims-80g"
STAGE_SEQ = "23-searches-seq-80g"
STAGE_TUNE = "30 (tune and its technique axes)"
STAGE_ESTIMATOR = "50-estimator-13b-amp"


class Verdict(str, Enum):
    HOLDS = "holds"
    FAILS = "does not hold"
    ONLY_WHEN = "holds only when"
    OPEN = "not settled yet"


@dataclass(frozen=True)
class Pending:
    """A run that is not committed yet and what it would settle."""

    stage: str
    what: str


@dataclass(frozen=True)
class Part:
    """One statement of a claim, judged on its own."""

    label: str
    verdict: Verdict
    text: str  # the finding, with its numbers
    short: str = ""  # the deciding number in a few words, for the verdict table
    cites: tuple[Cite, ...] = ()
    pending: tuple[Pending, ...] = ()
    condition: str = ""  # for ONLY_WHEN: when it holds
    predicted: tuple[Pred, ...] = ()  # the predicted points (memory predicted, time fitted) it rests on


@dataclass(frozen=True)
class Answer:
    """A claim, its parts and what they add up to."""

    number: int
    claim: str
    parts: tuple[Part, ...]
    estimates: tuple[str, ...] = ()  # derived numbers, each labelled as an estimate in its text
    notes: tuple[str, ...] = field(default_factory=tuple)  # context that is not a measurement

    @property
    def summary(self) -> str:
        """The parts' deciding numbers in one line."""
        return "; ".join(p.short for p in self.parts if p.short)

    @property
    def verdict(self) -> Verdict:
        measured = [p.verdict for p in self.parts if p.verdict is not Verdict.OPEN]
        if not measured:
            return Verdict.OPEN
        if all(v is Verdict.HOLDS for v in measured):
            return Verdict.HOLDS
        if all(v is Verdict.FAILS for v in measured):
            return Verdict.FAILS
        return Verdict.ONLY_WHEN

    @property
    def condition(self) -> str:
        """When an ONLY_WHEN claim holds: the conditions of its parts that hold (or hold only when)."""
        if self.verdict is not Verdict.ONLY_WHEN:
            return ""
        good = [p.condition or p.label for p in self.parts if p.verdict in (Verdict.HOLDS, Verdict.ONLY_WHEN)]
        return "; ".join(good)

    @property
    def partly_open(self) -> bool:
        return any(p.verdict is Verdict.OPEN for p in self.parts)

    @property
    def cites(self) -> tuple[Cite, ...]:
        seen: dict[tuple[str, str], Cite] = {}
        for part in self.parts:
            for c in part.cites:
                seen.setdefault((c.run, c.record.key_id), c)
        return tuple(seen.values())

    @property
    def pending(self) -> tuple[Pending, ...]:
        return tuple(p for part in self.parts for p in part.pending)

    @property
    def predicted(self) -> tuple[Pred, ...]:
        seen: dict[str, Pred] = {}
        for part in self.parts:
            for p in part.predicted:
                seen.setdefault(p.point.key_id, p)
        return tuple(seen.values())

    @property
    def basis(self) -> str:
        """What the settled parts rest on: 'measured', 'predicted' (every settled part rests on predictions
        too) or 'partly predicted'."""
        settled = [p for p in self.parts if p.verdict is not Verdict.OPEN]
        with_pred = [p for p in settled if p.predicted]
        if not with_pred:
            return "measured"
        return "predicted" if len(with_pred) == len(settled) else "partly predicted"


@dataclass(frozen=True)
class Budget:
    """The card the claims are about: a budget less a headroom, judged as advise judges (results/fit.py): a point
    fits when its peak reserved plus the CUDA context is within the budget less the headroom. The runs' points
    recorded no context: the card's (``context_bytes``, its device model's figure) comes off the limit instead, so
    the limit is on peak reserved."""

    budget_bytes: int
    headroom_bytes: int
    context_bytes: int = 0  # the card's CUDA context, counted here for points that did not record their own

    @classmethod
    def for_runs(cls, budget_bytes: int, headroom_bytes: int, runs: Sequence[Run]) -> Budget:
        """The budget of these runs: the card's context counted when their points recorded none."""
        points = [p for run in runs for p in run.points if p.ok]
        card = gpu_for_name(runs[0].environment.gpu_name) if runs else None
        recorded = any(p.context_bytes is not None for p in points)
        return cls(budget_bytes, headroom_bytes, 0 if recorded or card is None else card.context_bytes)

    @property
    def limit_bytes(self) -> int:
        """The limit on a point's peak reserved (its context counted: the card's where it recorded none)."""
        return self.budget_bytes - self.headroom_bytes - self.context_bytes

    def describe(self) -> str:
        context = f", {fmt_bytes(self.context_bytes)} CUDA context" if self.context_bytes else ""
        return (f"{fmt_bytes(self.budget_bytes)} budget, {fmt_bytes(self.headroom_bytes)} headroom{context}: "
                f"peak reserved at most {fmt_bytes(self.limit_bytes)}")


@dataclass(frozen=True)
class Context:
    """What every claim function reads: the points, the budget, the per-layer series by batch size."""

    ev: Evidence
    budget: Budget
    series: dict[int, CellSeries]  # plain-training cells of the scope, by batch size
    pr: Predictions = field(default_factory=Predictions)  # what no run measured, predicted (may be empty)

    @property
    def limit(self) -> int:
        return self.budget.limit_bytes

    def predicted(self, layout: str, batch_size: int, **axes: Any) -> Pred | None:
        """The prediction of a point of the scope (plain training unless ``axes`` say otherwise), if made."""
        return self.pr.get(self.ev.scope.key(layout, batch_size, **axes))

    def point(self, layout: str, batch_size: int, **axes: Any) -> Cite | Pred | None:
        """The measured point where a run holds it (any status), else its prediction, else None."""
        found = self.ev.find(layout, batch_size, **axes)
        return found if found is not None else self.predicted(layout, batch_size, **axes)

    def timed(self, layout: str, batch_size: int, **axes: Any) -> Cite | Pred | None:
        """Like ``point``, but a measured point that did not run gives way to a prediction that has a step time
        (so a comparison of speed can still be made, labelled fitted)."""
        found = self.point(layout, batch_size, **axes)
        if isinstance(found, Cite) and not found.ok:
            pred = self.predicted(layout, batch_size, **axes)
            return pred if pred is not None and pred.step_s else found
        return found


def gib(n: float) -> str:
    return fmt_bytes(n)


def pct(x: float) -> str:
    return f"{x:.1%}"


def times(x: float) -> str:
    return f"{x:.2f}x"


def tok(c: Cite) -> str:
    return f"{c.tps:,.0f} tok/s"

