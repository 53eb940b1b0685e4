"""What an estimate is: the predicted peak of one point and its parts (no torch, so renderers can read it)."""

from __future__ import annotations

from dataclasses import dataclass

from ckptbench.config.grid import Point
from ckptbench.json_object import JsonObject
from ckptbench.results.fit import predicted_fits, predicted_needed_bytes, reserved_upper_bound
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
class Reserved:
    """The caching-allocator replay of a point (estimator/replay.py) on one card: all estimates."""

    peak_reserved_bytes: int | None  # None when the point runs out of memory
    peak_allocated_bytes: int | None  # as the replay counts it (blocks as split: can exceed the byte model)
    num_alloc_retries: int
    # The replay's OomPrediction as JSON plus 'where' (phase, segment, where, request_bytes, allocated_bytes,
    # reserved_bytes): what a record's typed PredictedOom (results/record.py) is validated from.
    oom: JsonObject | None
    gpu: str  # the card's key (estimator/gpus.py)
    context_bytes: int  # memory the process holds outside the allocator on that card
    gpu_measured: bool  # whether the card's figures were measured (else they are estimates too)

    @property
    def fragmentation_bytes(self) -> int | None:
        """Reserved but unallocated at the peak: peak reserved minus peak allocated."""
        if self.peak_reserved_bytes is None or self.peak_allocated_bytes is None:
            return None
        return self.peak_reserved_bytes - self.peak_allocated_bytes


@dataclass(frozen=True)
class Estimate:
    """The predicted peak of one point and what it is made of (every number is an estimate).

    ``budget_bytes`` is a card's memory (``--budget``, ``--gpu``): the point fits when its peak
    reserved memory plus the memory outside the allocator (the CUDA context) stays within it; or the
    config's ``memory_cap_gib`` (``budget_is_cap``), which caps the allocator alone: the point fits
    when the replayed allocator does not run out. Without a replay (CPU target) the peak allocated
    memory is judged.
    """

    point: Point
    target: str
    method: str
    peak_bytes: int | None  # None when the point could not be estimated (see ``note``)
    breakdown: dict[str, int]  # bytes per category (CATEGORIES) at the peak; sums to peak_bytes
    static: dict[str, int]  # params_bytes, grads_bytes, optimizer_state_bytes of the whole model
    peak_at: str | None  # where in the step the peak happens
    budget_bytes: int | None
    note: str | None = None
    reserved: Reserved | None = None
    budget_is_cap: bool = False

    @property
    def bounded(self) -> bool:
        """Whether fits is judged on the reserved upper bound (results/fit.py): a CUDA card's replay."""
        return self.target == "cuda" and self.reserved is not None and self.reserved.peak_reserved_bytes is not None

    @property
    def reserved_bound_bytes(self) -> int | None:
        """The predicted peak reserved raised by the worst under-prediction seen for its kind (results/fit.py)."""
        if not self.bounded or self.reserved is None or self.reserved.peak_reserved_bytes is None:
            return None
        return reserved_upper_bound(self.reserved.peak_reserved_bytes, layout=self.point.layout,
                                    batch_size=self.point.batch_size or 1)

    @property
    def needed_bytes(self) -> int | None:
        """What must fit the budget: the reserved bound plus context (a card), the bound (a cap), else allocated."""
        r = self.reserved
        return predicted_needed_bytes(
            peak_reserved_bytes=None if r is None else r.peak_reserved_bytes,
            # A cap (memory_cap_gib) limits the allocator alone: the context is outside it.
            context_bytes=0 if r is None or self.budget_is_cap else r.context_bytes,
            peak_allocated_bytes=self.peak_bytes,
            bound_for=(self.point.layout, self.point.batch_size or 1) if self.bounded else None,
        )

    @property
    def fits(self) -> bool | None:
        """Whether the point fits the budget (None without a budget or estimate)."""
        oom = self.reserved is not None and self.reserved.oom is not None
        return predicted_fits(self.needed_bytes, self.budget_bytes, oom=oom)

    @property
    def dominant(self) -> str | None:
        """The category holding the most bytes at the peak."""
        return max(CATEGORIES, key=lambda k: self.breakdown[k]) if self.breakdown else None

    @property
    def reason(self) -> str | None:
        """Why a point does not fit, naming the part that dominates (None when it fits)."""
        if self.fits is not False or self.peak_bytes is None:
            return None
        name = self.dominant or "params"
        part = self.breakdown[name]
        largest = f"largest part: {PART_NAMES[name]} {fmt_bytes(part)} ({part / self.peak_bytes:.0%})"
        oom = self.reserved.oom if self.reserved is not None else None
        if oom is not None:
            return (
                f"runs out of memory in {oom['phase']} ({oom.get('where') or oom['segment'] or 'setup'}) allocating "
                f"{fmt_bytes(oom['request_bytes'])} with {fmt_bytes(oom['allocated_bytes'])} allocated and "
                f"{fmt_bytes(oom['reserved_bytes'])} reserved; {largest}"
            )
        needed, what = self.needed_bytes or 0, self._needed_words()
        return (
            f"needs {fmt_bytes(needed)} > {fmt_bytes(self.budget_bytes)} budget ({what}; "
            f"peak in the {self.peak_at}); {largest}"
        )

    def _needed_words(self) -> str:
        if self.reserved is None or self.reserved.peak_reserved_bytes is None:
            return "peak allocated"
        if self.budget_is_cap:
            return "reserved bound" if self.bounded else "peak reserved"
        r = self.reserved
        bound = self.reserved_bound_bytes
        shown = (f"reserved bound {fmt_bytes(bound)}" if bound is not None
                 else f"peak reserved {fmt_bytes(r.peak_reserved_bytes)}")
        return f"{shown} + context {fmt_bytes(r.context_bytes)}"

    def to_record(self) -> JsonObject:
        """JSON-ready: ``key``, the predicted peaks (allocated, reserved), the breakdown, fit and reason."""
        record = {
            "key": self.point.key,
            "estimate": True,
            "target": self.target,
            "method": self.method,
            "predicted_peak_allocated_bytes": self.peak_bytes,
            "breakdown": {f"{k}_bytes": v for k, v in self.breakdown.items()},
            "memory": dict(self.static),
            "peak_at": self.peak_at,
            "budget_bytes": self.budget_bytes,
            "budget_is_cap": self.budget_is_cap,
            "fits": self.fits,
            "reason": self.reason,
            "note": self.note,
        }
        r = self.reserved
        record.update({
            "predicted_peak_reserved_bytes": None if r is None else r.peak_reserved_bytes,
            "predicted_fragmentation_bytes": None if r is None else r.fragmentation_bytes,
            # What fits is judged on (results/fit.py): the reserved figure raised by the worst under-prediction seen.
            "predicted_peak_reserved_bound_bytes": self.reserved_bound_bytes,
            "predicted_num_alloc_retries": None if r is None else r.num_alloc_retries,
            "predicted_oom": None if r is None else r.oom,
            "gpu": None if r is None else r.gpu,
            "context_bytes": None if r is None else r.context_bytes,
            "gpu_figures_measured": None if r is None else r.gpu_measured,
        })
        return record
