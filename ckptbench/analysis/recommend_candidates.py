"""A run's ok points reduced to what a recommendation needs (``Candidate``), memory counted as recommend's is."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ckptbench.estimate.gpus import gpu_for_name
from ckptbench.results.record import PointRecord
from ckptbench.results.store import Run

BREAKDOWN = (
    ("params_bytes", "params"),
    ("grads_bytes", "grads"),
    ("optimizer_state_bytes", "optimizer state"),
    ("activation_bytes", "activation"),
)


@dataclass(frozen=True)
class Candidate:
    """One ok point, reduced to what a recommendation needs."""

    index: int  # position in points.jsonl (stable tie-break)
    key: dict[str, Any]
    label: str
    memory_bytes: int  # peak reserved plus the context (analysis/recommend.py's docstring)
    peak_allocated_bytes: int
    peak_reserved_bytes: int | None
    tokens_per_s: float
    median_step_time_s: float
    step_time_iqr_s: float
    breakdown: dict[str, int]
    layers_checkpointed: str | None
    notes: tuple[str, ...] = ()
    context_bytes: int = 0  # outside the allocator, included in memory_bytes

    @property
    def layout(self) -> str:
        return str(self.key.get("layout"))

    @property
    def relative_spread(self) -> float:
        """Inter-quartile range of the step time over its median."""
        return self.step_time_iqr_s / self.median_step_time_s if self.median_step_time_s > 0 else 0.0

    def to_json(self, *, limit_bytes: int | None = None) -> dict[str, Any]:
        out = {
            "key": self.key,
            "label": self.label,
            "peak_allocated_bytes": self.peak_allocated_bytes,
            "peak_reserved_bytes": self.peak_reserved_bytes,
            "tokens_per_s": self.tokens_per_s,
            "median_step_time_s": self.median_step_time_s,
            "step_time_iqr_s": self.step_time_iqr_s,
            "memory": self.breakdown,
            "layers_checkpointed": self.layers_checkpointed,
            "notes": list(self.notes),
            "context_bytes": self.context_bytes,
        }
        if limit_bytes is not None:
            out["fits"] = self.memory_bytes <= limit_bytes
        return out


def point_label(key: dict[str, Any], *, extra: Sequence[str] = ()) -> str:
    """'every:4 b=4 s=2048', plus any other key axes named in ``extra`` (those that vary in the run)."""
    parts = [str(key.get("layout")), f"b={key.get('batch_size')}", f"s={key.get('seq_len')}"]
    parts += [f"{name}={key.get(name)}" for name in extra]
    return " ".join(parts)


def _varying_axes(keys: Sequence[dict[str, Any]]) -> list[str]:
    names = sorted({n for k in keys for n in k} - {"layout", "batch_size", "seq_len"})
    return [n for n in names if len({repr(k.get(n)) for k in keys}) > 1]


def candidates(run: Run, *, seq_len: int | None = None) -> list[Candidate]:
    """The run's ok points (optionally of one sequence length) with a throughput and a peak."""
    scope = [(i, r) for i, r in enumerate(run.points) if r.ok and (seq_len is None or seq_len_of(r) == seq_len)]
    extra = _varying_axes([r.key for _, r in scope])
    card = gpu_for_name(run.meta.get("environment", {}).get("gpu_name"))
    context = card.context_bytes if card is not None else 0
    found = (_candidate(i, r, extra=extra, context=context) for i, r in scope)
    return [c for c in found if c is not None]


def seq_len_of(rec: PointRecord) -> Any:
    return rec.key.get("seq_len")


def _candidate(index: int, rec: PointRecord, *, extra: Sequence[str], context: int = 0) -> Candidate | None:
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
    return Candidate(
        index=index,
        key=dict(rec.key),
        label=point_label(rec.key, extra=extra),
        memory_bytes=int(reserved if reserved is not None else alloc) + (rec.context_bytes or context),
        peak_allocated_bytes=int(alloc),
        peak_reserved_bytes=None if reserved is None else int(reserved),
        tokens_per_s=float(tokens_per_s),
        median_step_time_s=float(median),
        step_time_iqr_s=float(rec.step_time_iqr_s or 0.0),
        breakdown=breakdown,
        layers_checkpointed=rec.layers_checkpointed,
        notes=tuple(notes),
        context_bytes=rec.context_bytes or context,
    )
