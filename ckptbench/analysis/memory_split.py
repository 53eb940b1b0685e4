"""Where the memory goes at each batch: the static part, the activation part and the allocator's cache (pure).

Measured per point: parameters, gradients and optimizer state (the static part, recorded by the
runner), the activation part (peak allocated above the static part: a lower bound, since at the peak
the gradients are usually only partly allocated) and what the caching allocator reserved on top of
the peak allocated bytes. One row per cell for the reference layouts: ``none`` (or, where it did not
run, the whole-layer layout with the fewest checkpointed layers that did) and ``all``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ckptbench.analysis.layer_series import cell_key, cell_label, layer_series
from ckptbench.results.fit import measured_peak_bytes
from ckptbench.results.record import PointRecord
from ckptbench.results.store import Run


@dataclass(frozen=True)
class MemorySplit:
    """The measured parts of one point's peak."""

    cell: str
    layout: str
    batch_size: int
    seq_len: int
    params_bytes: int
    grads_bytes: int
    optimizer_state_bytes: int
    activation_bytes: int
    peak_allocated_bytes: int
    peak_reserved_bytes: int

    @property
    def static_bytes(self) -> int:
        return self.params_bytes + self.grads_bytes + self.optimizer_state_bytes

    @property
    def cache_bytes(self) -> int:
        """Reserved but not allocated at the peak: the allocator's cached, fragmented blocks."""
        return max(0, self.peak_reserved_bytes - self.peak_allocated_bytes)

    @property
    def activation_share(self) -> float:
        return self.activation_bytes / self.peak_allocated_bytes if self.peak_allocated_bytes else 0.0


def split_of(rec: PointRecord) -> MemorySplit | None:
    """The point's split, or None when it did not run or its static part was not measured."""
    m = rec.memory
    if not rec.ok or rec.peak_allocated_bytes is None or m.static_bytes is None:
        return None
    reserved = measured_peak_bytes(rec)
    return MemorySplit(
        cell=cell_label(cell_key(rec.key)), layout=str(rec.key.get("layout")),
        batch_size=int(rec.key.get("batch_size", 0)), seq_len=int(rec.key.get("seq_len", 0)),
        params_bytes=m.params_bytes or 0, grads_bytes=m.grads_bytes or 0,
        optimizer_state_bytes=m.optimizer_state_bytes or 0, activation_bytes=rec.activation_bytes or 0,
        peak_allocated_bytes=rec.peak_allocated_bytes, peak_reserved_bytes=reserved,
    )


def memory_splits(run: Run) -> list[MemorySplit]:
    """Per cell, the least-checkpointed whole-layer point that ran and the most (``all``), by batch."""
    by_key = {r.key_id: r for r in run.points}
    rows: list[MemorySplit] = []
    for cell in layer_series(run):
        ran = {p.k: p for s in cell.series for p in s.points}
        ran.update({p.k: p for p in (cell.none, cell.all) if p is not None})
        for k in dict.fromkeys((min(ran), max(ran))):
            split = split_of(by_key[ran[k].key_id])
            if split is not None:
                rows.append(split)
    return sorted(rows, key=lambda r: (r.seq_len, r.batch_size, r.cell, -r.peak_allocated_bytes))
