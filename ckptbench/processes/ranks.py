"""One point record from the records of a sharded point's ranks. Pure: no torch.

Every rank measures its own window (warm-up, measured steps, peaks) on the same batch. The point's
peak is the largest rank's, each measured step takes as long as its slowest rank (the step ends
for everyone at the last collective), the static parts and the loss check are those of the rank
with the largest peak, and ``ranks`` keeps what each rank measured and where it ran.
"""

from __future__ import annotations

from typing import Any

# When ranks disagree, the point takes the first status in this order: one rank running out of
# memory is why the others then failed or were stopped waiting for it.
_STATUS_ORDER = ("oom", "error", "skipped", "ok")
_PER_RANK = ("status", "reason", "host", "gpu_name", "gpu_index", "peak_allocated_bytes", "peak_reserved_bytes",
             "step_times_s", "warmup_times_s", "wall_s")


def merge_ranks(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The point's record from its ranks' results in rank order; a rank that wrote no record is a
    dict with 'reason' (and 'stderr_tail') but no 'key'. Without any record: a failure dict."""
    records = [r for r in results if "key" in r]
    if not records:
        first = results[0]
        return {**first, "reason": f"rank 0: {first.get('reason')}"}
    statuses = [r.get("status", "error") if "key" in r else "error" for r in results]
    worst = min(range(len(results)), key=lambda i: _STATUS_ORDER.index(statuses[i]))
    ok = [r for r in records if r.get("status") == "ok"]
    main = max(ok, key=lambda r: r.get("peak_allocated_bytes") or 0) if ok else records[0]
    merged = {**main, "world_size": len(results), "ranks": [_rank_summary(i, r) for i, r in enumerate(results)]}
    if statuses[worst] != "ok":
        reason = results[worst].get("reason") or statuses[worst]
        merged.update(status=statuses[worst], reason=f"rank {worst}: {reason}")
        if "key" not in results[worst]:
            merged["stderr_tail"] = results[worst].get("stderr_tail")
        return merged
    merged.update(_combined(records))
    return merged


def _combined(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Peaks (largest rank), step times (slowest rank per step), counters (summed), leaks (any rank)."""
    out: dict[str, Any] = {
        "peak_allocated_bytes": max(r["peak_allocated_bytes"] for r in records),
        "peak_reserved_bytes": max(r["peak_reserved_bytes"] for r in records),
        "num_alloc_retries": sum(r.get("num_alloc_retries") or 0 for r in records),
        "num_ooms": sum(r.get("num_ooms") or 0 for r in records),
    }
    for name in ("step_times_s", "warmup_times_s"):
        out[name] = [max(times) for times in zip(*(r[name] for r in records), strict=True)]
    leaks = [r.get("memory", {}) for r in records]
    if any(m.get("leaked") for m in leaks):
        worst = max(leaks, key=lambda m: m.get("leaked_bytes") or 0)
        main = max(records, key=lambda r: r["peak_allocated_bytes"])
        out["memory"] = {**main.get("memory", {}), "leaked": True, "leaked_bytes": worst.get("leaked_bytes")}
    return out


def _rank_summary(rank: int, result: dict[str, Any]) -> dict[str, Any]:
    summary = {"rank": rank, **{k: result[k] for k in _PER_RANK if result.get(k) is not None}}
    if "key" not in result:
        summary["status"] = "error"
    return summary
