"""What "fits" means, once: for a measured point and for a prediction (pure; no torch).

A card runs out of memory on *reserved* memory, so what must fit is the peak reserved bytes (peak
allocated where no reserved figure exists, as on CPU, where the two are equal) plus the memory the
process holds outside the caching allocator (the CUDA context). Every command judges with these
functions; what it compares against is its own limit (a budget, or a budget minus a headroom).
"""

from __future__ import annotations

from ckptbench.results.record import PointRecord


def measured_peak_bytes(record: PointRecord) -> int:
    """The point's peak reserved bytes (peak allocated where none was recorded; 0 when neither was)."""
    reserved = record.peak_reserved_bytes
    return int(reserved if reserved is not None else record.peak_allocated_bytes or 0)


def measured_needed_bytes(record: PointRecord, *, card_context_bytes: int = 0) -> int:
    """What must fit: the peak (``measured_peak_bytes``) plus the CUDA context measured with the point, or,
    for a record that did not measure it (runs written before it was recorded), ``card_context_bytes``
    (the card's figure from the device model; 0: none)."""
    return measured_peak_bytes(record) + (record.context_bytes or card_context_bytes)


def measured_fits(record: PointRecord, limit_bytes: int | None, *, card_context_bytes: int = 0) -> bool:
    """A measured point fits when it ran and what it needs (``measured_needed_bytes``) is within the limit
    (no limit: when it ran)."""
    if not record.ok:
        return False
    needed = measured_needed_bytes(record, card_context_bytes=card_context_bytes)
    return limit_bytes is None or needed <= limit_bytes


def predicted_needed_bytes(
    *, peak_reserved_bytes: int | None, context_bytes: int, peak_allocated_bytes: int | None, margin: float = 1.0
) -> int | None:
    """What a prediction needs: the replayed allocator's peak reserved plus the card's context; without a
    replay, the predicted peak allocated times ``margin`` (reserved over allocated, where it was learned);
    None without a prediction."""
    if peak_reserved_bytes is not None:
        return peak_reserved_bytes + context_bytes
    if peak_allocated_bytes is not None:
        return int(peak_allocated_bytes * margin)
    return None


def predicted_fits(needed_bytes: int | None, limit_bytes: int | None, *, oom: bool) -> bool | None:
    """A prediction fits when no out-of-memory error is predicted and what it needs
    (``predicted_needed_bytes``) is within the limit; None without a limit or a prediction."""
    if oom:
        return False
    if needed_bytes is None or limit_bytes is None:
        return None
    return needed_bytes <= limit_bytes
