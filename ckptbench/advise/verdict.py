"""What "fits" means for an answer: the limit (the budget less the headroom) and each prediction's verdict against
it, with its reason computed from the numbers it cites (no torch).

A prediction needs its replayed peak reserved raised to its bound plus the card's context (results/fit.py:
``Estimate.needed_bytes``). It fits when the replayed allocator does not run out of memory on the card and what it
needs is within the limit; the margin is the limit less what it needs, and a choice with less than ``TIGHT_BYTES``
of margin is tight. A verdict that does not fit says why, once, from its own figures: the replayed allocator runs
out (at which request, with what reserved), or what it needs lies above the card's usable memory, or above the
limit only (the headroom), or nothing was predicted (and why not).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from ckptbench.estimator.gpus import GpuModel
from ckptbench.estimator.record import Estimate
from ckptbench.results.fit import predicted_fits
from ckptbench.units import GIB

TIGHT_BYTES = GIB  # a choice with less margin than this is tight: the next safer one is named beside it
# The label of a figure without the allocator's replay (a sharded point: its request stream is not re-assembled).
ALLOCATED_ONLY = "predicted: allocated peak + context, the allocator not replayed"


def gib(n: float | None) -> str:
    """A size as every advise output shows it: GiB with two decimals."""
    return "-" if n is None else f"{n / GIB:.2f} GiB"


@dataclass(frozen=True)
class Limit:
    """The memory an answer must stay within: the budget (the card's usable memory, or ``--budget``) less the
    headroom (``--headroom``: a share of the budget or a size)."""

    card: GpuModel
    budget_bytes: int
    headroom_bytes: int
    headroom_text: str  # as given: '5%' or '2GiB'
    budget_given: bool = False  # --budget (else the card's usable memory)

    @property
    def limit_bytes(self) -> int:
        return self.budget_bytes - self.headroom_bytes

    @property
    def budget_words(self) -> str:
        if self.budget_given:
            return f"the {gib(self.budget_bytes)} budget"
        return f"{self.card.key}'s {gib(self.budget_bytes)} usable"

    def describe(self) -> str:
        """'75.29 GiB limit (a100-80gb's 79.25 GiB usable less 5% headroom, 3.96 GiB)'."""
        if not self.headroom_bytes:
            return f"{gib(self.limit_bytes)} limit ({self.budget_words}, no headroom)"
        return (f"{gib(self.limit_bytes)} limit ({self.budget_words} less {self.headroom_text} headroom, "
                f"{gib(self.headroom_bytes)})")


class Outcome(Enum):
    """How a prediction stands against the limit."""

    FITS = "fits"
    ABOVE_LIMIT = "above the limit"  # within the card (or budget), not within the headroom
    ABOVE_BUDGET = "above the budget"  # what it needs exceeds the card's usable memory (or the budget)
    ALLOCATOR_OOM = "out of memory"  # the replayed caching allocator runs out on the card
    ALLOCATED_ABOVE = "allocated above the limit"  # its allocated peak alone exceeds the limit (not replayed)
    NOT_PREDICTED = "not predicted"  # the estimator could not trace it (a missing library), see ``note``


@dataclass(frozen=True)
class Verdict:
    """One prediction judged against the limit: what it needs, whether it fits, its margin and why not."""

    outcome: Outcome
    limit: Limit
    needed_bytes: int | None  # None when the allocator runs out first (or nothing was predicted)
    allocated_bytes: int | None  # the predicted peak allocated (the byte model), when traced
    label: str = "predicted"  # or 'predicted by arithmetic: ...' where the estimator could not trace the point
    oom_request_bytes: int | None = None
    oom_reserved_bytes: int | None = None
    oom_where: str | None = None
    note: str | None = None  # why nothing was predicted

    @property
    def fits(self) -> bool:
        return self.outcome is Outcome.FITS

    @property
    def predicted(self) -> bool:
        return self.outcome is not Outcome.NOT_PREDICTED

    @property
    def margin_bytes(self) -> int | None:
        """The limit less what the prediction needs (negative above the limit)."""
        return None if self.needed_bytes is None else self.limit.limit_bytes - self.needed_bytes

    @property
    def tight(self) -> bool:
        """Fits with less than TIGHT_BYTES to spare."""
        m = self.margin_bytes
        return self.fits and m is not None and m < TIGHT_BYTES

    def needs(self) -> str:
        """What it needs against the limit, as a comparison that reads its own numbers."""
        limit = self.limit.limit_bytes
        if self.needed_bytes is None:
            return self.reason()
        margin = self.margin_bytes or 0
        if margin >= 0:
            return f"needs {gib(self.needed_bytes)}, {gib(margin)} below the {gib(limit)} limit"
        return f"needs {gib(self.needed_bytes)}, {gib(-margin)} above the {gib(limit)} limit"

    def reason(self) -> str:
        """Why it does not fit (or that it does), computed from its own figures."""
        card = self.limit.card
        if self.outcome is Outcome.NOT_PREDICTED:
            return f"not predicted: {self.note or 'the estimator could not trace it'}"
        if self.outcome is Outcome.ALLOCATOR_OOM:
            alloc = self.allocated_bytes or 0
            whole = (f"its allocated peak alone would be {gib(alloc)}, above the card's {gib(card.total_bytes)}"
                     if alloc > card.total_bytes else
                     f"its allocated peak {gib(alloc)} is below the card's {gib(card.total_bytes)}, but the cached "
                     "blocks leave no free block large enough")
            return (f"the replayed caching allocator runs out of memory on the {card.key} allocating "
                    f"{gib(self.oom_request_bytes)} with {gib(self.oom_reserved_bytes)} reserved"
                    f"{f' ({self.oom_where})' if self.oom_where else ''}: {whole}")
        if self.outcome is Outcome.ALLOCATED_ABOVE:
            return (f"its allocated peak alone is {gib(self.allocated_bytes)}, "
                    f"{gib((self.allocated_bytes or 0) - self.limit.limit_bytes)} above the "
                    f"{gib(self.limit.limit_bytes)} limit")
        if self.outcome is Outcome.ABOVE_BUDGET:
            return (f"needs {gib(self.needed_bytes)}, {gib((self.needed_bytes or 0) - self.limit.budget_bytes)} "
                    f"above {self.limit.budget_words}")
        return self.needs()


def judge(estimate: Estimate, limit: Limit) -> Verdict:
    """The verdict of one estimate (replayed on ``limit.card``) against ``limit``."""
    if estimate.peak_bytes is None:
        return Verdict(Outcome.NOT_PREDICTED, limit, None, None, note=_note(estimate.note))
    r = estimate.reserved
    if r is not None and r.oom is not None:
        return Verdict(Outcome.ALLOCATOR_OOM, limit, None, estimate.peak_bytes,
                       oom_request_bytes=int(r.oom["request_bytes"]), oom_reserved_bytes=int(r.oom["reserved_bytes"]),
                       oom_where=_where(r.oom))
    if r is None or r.peak_reserved_bytes is None:
        # No replay of the allocator for this setup (estimate.note says why): its allocated peak and the card's
        # context, labelled so: the cached-but-free blocks are not in it.
        needed = estimate.peak_bytes + limit.card.context_bytes
        return _by_needed(needed, estimate.peak_bytes, limit, ALLOCATED_ONLY)
    return _by_needed(estimate.needed_bytes, estimate.peak_bytes, limit, "predicted")


def judge_allocated(allocated_bytes: int, limit: Limit) -> Verdict | None:
    """The verdict of a point from its allocated peak alone, when that already exceeds the limit (what it needs is
    at least that: no replay can make it fit); None when it does not."""
    if allocated_bytes <= limit.limit_bytes:
        return None
    return Verdict(Outcome.ALLOCATED_ABOVE, limit, None, allocated_bytes)


def judge_needed(needed_bytes: int, limit: Limit, *, label: str) -> Verdict:
    """The verdict of a figure worked out by arithmetic (labelled so) rather than by the estimator."""
    return _by_needed(needed_bytes, None, limit, label)


def _by_needed(needed: int | None, allocated: int | None, limit: Limit, label: str) -> Verdict:
    if needed is None:
        return Verdict(Outcome.NOT_PREDICTED, limit, None, allocated, label, note="no figure to judge")
    if predicted_fits(needed, limit.limit_bytes, oom=False):
        outcome = Outcome.FITS
    elif needed > limit.budget_bytes:
        outcome = Outcome.ABOVE_BUDGET
    else:
        outcome = Outcome.ABOVE_LIMIT
    return Verdict(outcome, limit, needed, allocated, label)


def _note(note: str | None) -> str:
    return (note or "the estimator could not trace it").removeprefix("not estimated: ")


def _where(oom: dict[str, object]) -> str | None:
    phase, where = oom.get("phase"), oom.get("where") or oom.get("segment")
    parts = [str(p) for p in (phase, where) if p]
    return ", ".join(parts) or None
