"""What "fits" means, once: for a measured point and for a prediction (pure; no torch).

A card runs out of memory on *reserved* memory, so what must fit is the peak reserved bytes (peak
allocated where no reserved figure exists, as on CPU, where the two are equal) plus the memory the
process holds outside the caching allocator (the CUDA context). Every command judges with these
functions; what it compares against is its own limit (a budget, or a budget minus a headroom).
"""

from __future__ import annotations

import math

from ckptbench.results.record import PointRecord

# The headroom every command keeps free under a budget by default (recommend, tune, answers, advise): room for
# fragmentation growth, a stray buffer and other processes. One setting, here.
DEFAULT_HEADROOM = "5%"

# How far the measured peak reserved lay above the replayed allocator's prediction, at worst, on the
# committed H200 runs (`ckptbench estimate` on results/h200-gpu-check-2/check and
# results/h200-gpu-check-1/axes: 30 ok points, tests/fixtures/reserved_predictions.json; docs/estimating.md, "Reserved
# predictions and their bound"), as a share of the prediction, rounded up. A prediction is judged on its
# upper bound: predicted peak reserved x (1 + that share for its kind of layout).
# - layouts that recompute no MLP (none, whole layers, attention only; with offloading, micro-batches,
#   other optimizers): +0.93% (first:16 b=8: 95.49 GiB predicted, 96.37 GiB measured);
# - layouts that recompute the MLP (@mlp, @attn+mlp, @selective), by batch: at batch 2 or less +2.53%
#   (all@mlp b=2: 55.43 vs 56.83 GiB); above it +3.77% (all@attn+mlp b=8: 88.06 vs 91.37 GiB; batches
#   above 8 were not measured: the bound there is the worst seen, not a guarantee).
RESERVED_UNDER_PREDICTION = 0.0093
MLP_RECOMPUTE_UNDER_PREDICTION = {2: 0.0253, None: 0.0377}  # batch size up to -> share (None: above)
MLP_RECOMPUTING = ("mlp", "attn+mlp", "selective")


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


def reserved_bound_fraction(layout: str, batch_size: int) -> float:
    """How far above a predicted peak reserved the measured one may lie, from the worst under-prediction
    seen on the committed H200 runs for this kind of layout (the table above)."""
    _, at, granularity = layout.partition("@")
    if at and granularity in MLP_RECOMPUTING:
        return MLP_RECOMPUTE_UNDER_PREDICTION[2] if batch_size <= 2 else MLP_RECOMPUTE_UNDER_PREDICTION[None]
    return RESERVED_UNDER_PREDICTION


def reserved_upper_bound(peak_reserved_bytes: int, *, layout: str, batch_size: int) -> int:
    """The predicted peak reserved raised by the worst under-prediction seen for its kind
    (``reserved_bound_fraction``)."""
    return math.ceil(peak_reserved_bytes * (1.0 + reserved_bound_fraction(layout, batch_size)))


def predicted_needed_bytes(
    *, peak_reserved_bytes: int | None, context_bytes: int, peak_allocated_bytes: int | None, margin: float = 1.0,
    bound_for: tuple[str, int] | None = None,
) -> int | None:
    """What a prediction needs: the replayed allocator's peak reserved plus the card's context (its upper
    bound, ``reserved_upper_bound``, when ``bound_for`` gives the point's layout and batch size, as on a CUDA
    card); without a replay, the predicted peak allocated times ``margin`` (reserved over allocated, where it
    was learned); None without a prediction."""
    if peak_reserved_bytes is not None:
        if bound_for is not None:
            layout, batch_size = bound_for
            peak_reserved_bytes = reserved_upper_bound(peak_reserved_bytes, layout=layout, batch_size=batch_size)
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
