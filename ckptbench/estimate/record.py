"""What an estimate is: the predicted peak of one point and its parts (no torch, so renderers can read it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ckptbench.config.grid import Point
from ckptbench.units import fmt_bytes

# Categories of live bytes, in the order of the tracker's byte vectors.
CATEGORIES: tuple[str, ...] = (
    "params",
    "grads",
    "optimizer_state",
    "activations",
    "logits_loss",
    "transient",
    "other",
)
PART_NAMES: dict[str, str] = {
    "params": "parameters",
    "grads": "gradients",
    "optimizer_state": "optimizer state",
    "activations": "saved activations",
    "logits_loss": "logits and loss",
    "transient": "transient buffers",
    "other": "inputs, buffers, workspaces",
}


@dataclass(frozen=True)
class EstimateProgress:
    """Progress of an estimate: ``done`` of ``total`` traces finished; ``label`` names the current one."""

    done: int
    total: int
    label: str


@dataclass(frozen=True)
class Estimate:
    """The predicted peak of one point and what it is made of (every number is an estimate)."""

    point: Point
    target: str
    method: str
    peak_bytes: int | None  # None when the point could not be estimated (see ``note``)
    breakdown: dict[str, int]  # bytes per category (CATEGORIES) at the peak; sums to peak_bytes
    static: dict[str, int]  # params_bytes, grads_bytes, optimizer_state_bytes of the whole model
    peak_at: str | None  # where in the step the peak happens
    budget_bytes: int | None
    note: str | None = None

    @property
    def fits(self) -> bool | None:
        """Whether the predicted peak stays within the budget (None without a budget or estimate)."""
        if self.budget_bytes is None or self.peak_bytes is None:
            return None
        return self.peak_bytes <= self.budget_bytes

    @property
    def dominant(self) -> str | None:
        """The category holding the most bytes at the peak."""
        return max(CATEGORIES, key=lambda k: self.breakdown[k]) if self.breakdown else None

    @property
    def reason(self) -> str | None:
        """Why a point does not fit, naming the part that dominates (None when it fits)."""
        if self.fits is not False or self.peak_bytes is None or self.budget_bytes is None:
            return None
        part = self.breakdown[self.dominant or "params"]
        return (
            f"needs {fmt_bytes(self.peak_bytes)} > {fmt_bytes(self.budget_bytes)} budget "
            f"(peak in the {self.peak_at}); largest part: {PART_NAMES[self.dominant or 'params']} "
            f"{fmt_bytes(part)} ({part / self.peak_bytes:.0%})"
        )

    def to_record(self) -> dict[str, Any]:
        """JSON-ready: ``key``, ``predicted_peak_allocated_bytes``, the breakdown, fit and reason."""
        return {
            "key": self.point.key,
            "estimate": True,
            "target": self.target,
            "method": self.method,
            "predicted_peak_allocated_bytes": self.peak_bytes,
            "breakdown": {f"{k}_bytes": v for k, v in self.breakdown.items()},
            "memory": dict(self.static),
            "peak_at": self.peak_at,
            "budget_bytes": self.budget_bytes,
            "fits": self.fits,
            "reason": self.reason,
            "note": self.note,
        }
