"""tune's memory judgement of a prediction: the margin learned from measured points, and ``predicted_fit``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ckptbench.estimate.record import Estimate
from ckptbench.results.record import PointRecord
from ckptbench.units import fmt_bytes


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
class Fit:
    """A prediction judged against the limit: fits (True/False, None when there is no prediction)."""

    fits: bool | None
    judged_bytes: int | None
    basis: str


def predicted_fit(estimate: Estimate, *, limit_bytes: int, margin: Margin) -> Fit:
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
        return Fit(False, None, f"predicted to run out of memory in {oom.get('phase')} ({where}) on the "
                   f"{reserved.gpu}{stand_in}")
    if reserved is not None and reserved.peak_reserved_bytes is not None:
        judged = reserved.peak_reserved_bytes + reserved.context_bytes
        basis = (f"predicted peak reserved {fmt_bytes(reserved.peak_reserved_bytes)} + "
                 f"{fmt_bytes(reserved.context_bytes)} CUDA context ({reserved.gpu}){stand_in}")
    elif estimate.peak_bytes is not None:
        judged = int(estimate.peak_bytes * margin.ratio)
        basis = f"predicted peak allocated {fmt_bytes(estimate.peak_bytes)} x margin {margin.ratio:.4f}{stand_in}"
    else:
        return Fit(None, None, f"no prediction ({estimate.note or 'not estimated'})")
    verdict = "fits" if judged <= limit_bytes else "does not fit"
    return Fit(judged <= limit_bytes, judged, f"{basis} {verdict} the {fmt_bytes(limit_bytes)} limit")
