"""One point record from the records of a sharded point's ranks. Pure: no torch.

Every rank measures its own window (warm-up, measured steps, peaks) on the same batch. The point's
peak is the largest rank's, each measured step takes as long as its slowest rank (the step ends
for everyone at the last collective), the static parts and the loss check are those of the rank
with the largest peak, and ``ranks`` keeps what each rank measured and where it ran.
"""

from __future__ import annotations

from dataclasses import replace

from ckptbench.processes.outcome import Outcome, ProcessFailure
from ckptbench.results.record import PointMemory, PointRecord, RankRecord

# When ranks disagree, the point takes the first status in this order: one rank running out of
# memory is why the others then failed or were stopped waiting for it.
_STATUS_ORDER = ("oom", "error", "skipped", "ok")
_PER_RANK = ("status", "reason", "host", "gpu_name", "gpu_index", "peak_allocated_bytes", "peak_reserved_bytes",
             "step_times_s", "warmup_times_s", "wall_s")


def merge_ranks(results: list[Outcome]) -> Outcome:
    """The point's record from its ranks' outcomes in rank order; without any record, rank 0's failure."""
    records = [r for r in results if isinstance(r, PointRecord)]
    if not records:
        first = results[0]
        assert isinstance(first, ProcessFailure)
        return replace(first, reason=f"rank 0: {first.reason}")
    statuses = [r.status if isinstance(r, PointRecord) else "error" for r in results]
    worst = min(range(len(results)), key=lambda i: _STATUS_ORDER.index(statuses[i]))
    ok = [r for r in records if r.status == "ok"]
    main = max(ok, key=lambda r: r.peak_allocated_bytes or 0) if ok else records[0]
    ranks = [_rank_summary(i, r) for i, r in enumerate(results)]
    if statuses[worst] != "ok":
        failed = results[worst]
        reason = f"rank {worst}: {failed.reason or statuses[worst]}"
        if isinstance(failed, ProcessFailure):
            return main.updated(world_size=len(results), ranks=ranks, status=statuses[worst], reason=reason,
                                stderr_tail=failed.stderr_tail)
        return main.updated(world_size=len(results), ranks=ranks, status=statuses[worst], reason=reason)
    return _combined(main, records).updated(world_size=len(results), ranks=ranks)


def _combined(main: PointRecord, records: list[PointRecord]) -> PointRecord:
    """``main`` with the ranks' peaks (largest rank), step times (slowest rank per step), counters (summed) and
    leaks (any rank)."""
    steps = {
        name: [max(times) for times in zip(*(getattr(r, name) for r in records), strict=True)]
        for name in ("step_times_s", "warmup_times_s")
    }
    leaks = [r.memory for r in records]
    leaked: dict[str, PointMemory] = {}
    if any(m.leaked for m in leaks):
        worst = max(leaks, key=lambda m: m.leaked_bytes or 0)
        largest = max(records, key=lambda r: r.peak_allocated_bytes or 0)
        leaked["memory"] = largest.memory.updated(leaked=True, leaked_bytes=worst.leaked_bytes)
    return main.updated(
        peak_allocated_bytes=max(r.peak_allocated_bytes or 0 for r in records),
        peak_reserved_bytes=max(r.peak_reserved_bytes or 0 for r in records),
        num_alloc_retries=sum(r.num_alloc_retries or 0 for r in records),
        num_ooms=sum(r.num_ooms or 0 for r in records),
        **steps,
        **leaked,
    )


def _rank_summary(rank: int, result: Outcome) -> RankRecord:
    if isinstance(result, ProcessFailure):
        return RankRecord(rank=rank, status="error", reason=result.reason)
    given = result.given()
    return RankRecord(rank=rank, **{k: given[k] for k in _PER_RANK if given.get(k) is not None})
