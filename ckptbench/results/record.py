"""A point record and the statistics derived from it when it is read (median, spread, tokens/s, MFU)."""

from __future__ import annotations

import statistics
from typing import Any


def point_stats(rec: dict[str, Any]) -> dict[str, Any]:
    """Derived statistics of one point record: median/spread of time, tokens/s, MFU/HFU, activation bytes."""
    times = rec.get("step_times_s") or []
    out: dict[str, Any] = {
        "median_step_time_s": None,
        "min_step_time_s": None,
        "max_step_time_s": None,
        "step_time_iqr_s": None,
        "tokens_per_s": None,
        "mfu": None,
        "hfu": None,
        "activation_bytes": None,
    }
    if times:
        med = statistics.median(times)
        q = statistics.quantiles(times, n=4, method="inclusive") if len(times) > 1 else [med, med, med]
        tokens = rec.get("tokens_per_step") or 0
        out.update(
            median_step_time_s=med,
            min_step_time_s=min(times),
            max_step_time_s=max(times),
            step_time_iqr_s=q[2] - q[0],
            tokens_per_s=tokens / med if med > 0 else None,
        )
        peak = rec.get("peak_tflops")
        if peak and med > 0:
            out["mfu"] = rec.get("model_flops_per_step", 0) / med / (peak * 1e12)
            out["hfu"] = rec.get("hardware_flops_per_step", 0) / med / (peak * 1e12)
    mem = rec.get("memory") or {}
    peak_alloc = rec.get("peak_allocated_bytes")
    if peak_alloc is not None and mem:
        static = mem.get("params_bytes", 0) + mem.get("grads_bytes", 0) + mem.get("optimizer_state_bytes", 0)
        out["activation_bytes"] = max(0, peak_alloc - static)
    return out
