"""The DataFrame view of a run: one row per point, key fields first, then measurements and statistics."""

from __future__ import annotations

from typing import Any

from ckptbench.results.record import point_stats
from ckptbench.results.store import Run

KEY_FIELDS = ("model", "layout", "batch_size", "seq_len", "precision", "optimizer")


def to_frame(run: Run) -> Any:
    """One row per point: key fields, status, memory, derived statistics (pandas DataFrame)."""
    import pandas as pd

    rows = []
    for rec in run.points:
        key = rec.get("key", {})
        mem = rec.get("memory") or {}
        row = {f: key.get(f) for f in KEY_FIELDS}
        row.update({k: v for k, v in key.items() if k not in row})
        row.update(
            status=rec.get("status"),
            reason=rec.get("reason"),
            layers_checkpointed=rec.get("layers_checkpointed"),
            num_checkpointed=rec.get("num_checkpointed"),
            peak_allocated_bytes=rec.get("peak_allocated_bytes"),
            peak_reserved_bytes=rec.get("peak_reserved_bytes"),
            params_bytes=mem.get("params_bytes"),
            grads_bytes=mem.get("grads_bytes"),
            optimizer_state_bytes=mem.get("optimizer_state_bytes"),
            leaked=mem.get("leaked"),
            num_alloc_retries=rec.get("num_alloc_retries"),
            loss_match=(rec.get("loss_check") or {}).get("match"),
            predicted_peak_allocated_bytes=rec.get("predicted_peak_allocated_bytes"),
        )
        row.update(point_stats(rec))
        rows.append(row)
    return pd.DataFrame(rows)
