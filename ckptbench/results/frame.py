"""The DataFrame view of a run: one row per point, key fields first, then measurements and statistics."""

from __future__ import annotations

from typing import Any

from ckptbench.results.store import Run

KEY_FIELDS = ("model", "layout", "batch_size", "seq_len", "precision", "optimizer")


def to_frame(run: Run) -> Any:
    """One row per point: key fields, status, memory, derived statistics (pandas DataFrame)."""
    import pandas as pd

    rows = []
    for rec in run.points:
        row: dict[str, Any] = {f: rec.key.get(f) for f in KEY_FIELDS}
        row.update({k: v for k, v in rec.key.items() if k not in row})
        row.update(
            status=rec.status,
            reason=rec.reason,
            layers_checkpointed=rec.layers_checkpointed,
            num_checkpointed=rec.num_checkpointed,
            peak_allocated_bytes=rec.peak_allocated_bytes,
            peak_reserved_bytes=rec.peak_reserved_bytes,
            params_bytes=rec.memory.params_bytes,
            grads_bytes=rec.memory.grads_bytes,
            optimizer_state_bytes=rec.memory.optimizer_state_bytes,
            leaked=rec.memory.leaked,
            num_alloc_retries=rec.num_alloc_retries,
            loss_match=None if rec.loss_check is None else rec.loss_check.match,
            predicted_peak_allocated_bytes=rec.predicted_peak_allocated_bytes,
        )
        row.update(rec.stats())
        rows.append(row)
    return pd.DataFrame(rows)
