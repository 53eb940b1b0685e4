"""tune's prunes: why a candidate is dropped before it is measured (each rule returns its reason, or None)."""

from __future__ import annotations

from collections.abc import Sequence

from ckptbench.analysis.tune_candidate import Candidate, Measured, needed, peak
from ckptbench.analysis.tune_fit import Fit
from ckptbench.analysis.tune_space import savers, speed_class
from ckptbench.results.record import PointRecord
from ckptbench.units import fmt_bytes

# A candidate may run faster per FLOP than anything measured so far (a larger batch fills the device
# better): its bound allows 10% more than the best rate of its speed class before it is ruled out.
RATE_SLACK = 1.10


def pruned(
    c: Candidate, fit: Fit, *, measured: Sequence[Measured], limit_bytes: int, best: Measured | None
) -> str | None:
    """Why ``c`` is not measured (the first prune that drops it), or None when it must be measured."""
    if fit.fits is False:
        return f"predicted not to fit: {fit.basis}"
    failed = failed_below(c, measured=measured, limit_bytes=limit_bytes)
    if failed is not None:
        return (
            f"predicted not to fit: predicted peak allocated {fmt_bytes(c.estimate.peak_bytes or 0)}, no less "
            f"than {failed.candidate.label}'s, which did not fit when measured ({_outcome(failed.record)})"
        )
    winner = cheaper_winner(c, measured=measured)
    if winner is not None:
        return (
            f"a cheaper setup already fits at the same tokens per step: {winner.candidate.label} "
            f"({winner.tokens_per_s:,.0f} tokens/s) with no more recomputation or memory savers"
        )
    bound = rate_bound(c, measured=measured)
    if bound is not None and best is not None and bound <= best.tokens_per_s:
        return (
            f"cannot beat {best.candidate.label} ({best.tokens_per_s:,.0f} tokens/s): at most "
            f"{bound:,.0f} tokens/s even at {RATE_SLACK:g}x the best FLOP rate measured in its class"
        )
    return None


def failed_below(c: Candidate, *, measured: Sequence[Measured], limit_bytes: int) -> Measured | None:
    """A measured point that did not fit (out of memory, or over the limit) although predicted to need
    no more than this candidate: the allocator's overhead above the prediction is at least as large here."""
    mine = c.estimate.peak_bytes
    if mine is None:
        return None
    for m in measured:
        theirs = m.candidate.estimate.peak_bytes
        over = m.record.status == "oom" or (m.record.ok and needed(m.record) > limit_bytes)
        if over and theirs is not None and theirs <= mine:
            return m
    return None


def cheaper_winner(c: Candidate, *, measured: Sequence[Measured]) -> Measured | None:
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


def rate_bound(c: Candidate, *, measured: Sequence[Measured]) -> float | None:
    """The most tokens/s ``c`` could reach: its FLOPs at ``RATE_SLACK`` times its class's best measured rate."""
    mine = speed_class(c.point)
    rates = [m.flop_rate for m in measured if m.record.ok and speed_class(m.candidate.point) == mine]
    if not rates or not c.hardware_flops:
        return None
    return c.point.tokens * max(rates) * RATE_SLACK / c.hardware_flops


def _outcome(record: PointRecord) -> str:
    return "out of memory" if record.status == "oom" else f"{fmt_bytes(peak(record))} peak reserved"
