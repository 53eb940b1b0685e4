"""Does a measured out-of-memory error depend on the process it ran in? (pure)

A point measured in a sweep shares its process with the points before it (docs/measuring.md, "Measuring what a
fresh training process would see"); the estimator replays the caching allocator as a fresh process
runs the point. Set side by side, the two say whether a fresh process would have run the point, and
by how much the allocator's state at the error differs between them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ckptbench.answers.evidence import Cite, Evidence
from ckptbench.answers.predictions import Pred, Predictions
from ckptbench.units import GIB, MIB, fmt_bytes

# PyTorch's CUDA out-of-memory message (c10/cuda/CUDACachingAllocator.cpp), torch 2.x.
_OOM = re.compile(
    r"Tried to allocate ([\d.]+) (GiB|MiB)\..*?total capacity of ([\d.]+) (GiB|MiB).*?Of the allocated memory "
    r"([\d.]+) (GiB|MiB) is allocated by PyTorch, and ([\d.]+) (GiB|MiB) is reserved by PyTorch but unallocated",
    re.S,
)


def _bytes(value: str, unit: str) -> int:
    return int(float(value) * (GIB if unit == "GiB" else MIB))


@dataclass(frozen=True)
class MeasuredOom:
    """The figures of a measured out-of-memory message."""

    request_bytes: int
    total_bytes: int
    allocated_bytes: int
    cached_bytes: int  # reserved by PyTorch but unallocated

    @property
    def reserved_bytes(self) -> int:
        return self.allocated_bytes + self.cached_bytes


def measured_oom(reason: str | None) -> MeasuredOom | None:
    """The figures of PyTorch's out-of-memory message, or None when ``reason`` is not one."""
    m = _OOM.search(reason or "")
    if m is None:
        return None
    g = m.groups()
    return MeasuredOom(_bytes(g[0], g[1]), _bytes(g[2], g[3]), _bytes(g[4], g[5]), _bytes(g[6], g[7]))


def process_of(ev: Evidence, cite: Cite) -> str:
    """How the point's process is known: 'in the sweep's long-lived process, after 1 other point (...)'."""
    rec = cite.record
    run = next((r for r in ev.runs if str(r.path) == cite.run), None)
    if rec.process == "fresh":
        return "in a fresh process of its own"
    before, how = rec.points_before, ""
    if rec.process is None:
        if run is not None and run.meta.options.isolate:
            return "in a fresh process of its own (the run's options say isolate: true)"
        index = next((i for i, r in enumerate(run.points) if r is rec), None) if run is not None else None
        if index is None:
            return "in a process the record does not name"
        before = index
        how = (f" ({cite.run}: the record predates the `process` field; the run's options say isolate: false and "
               f"it is point {index + 1} of its points.jsonl, which lists the points in the order they ran)")
    n = f"{before} other point{'s' if before != 1 else ''}" if before is not None else "other points"
    return f"in the sweep's long-lived process, after {n}{how}"


def oom_process_note(ev: Evidence, pr: Predictions, cite: Cite, pred: Pred | None) -> str | None:
    """For a measured out-of-memory point with a prediction: whether a fresh process would have run it, and by
    how much the two processes differ (labelled measured and predicted); None when either is missing."""
    if cite.record.status != "oom" or pred is None or not pred.known:
        return None
    seen = measured_oom(cite.record.reason)
    text = f"{cite.short} ran out of memory {process_of(ev, cite)}"
    if seen is not None:
        text += (f": it asked for {fmt_bytes(seen.request_bytes)} with {fmt_bytes(seen.allocated_bytes)} allocated "
                 f"and {fmt_bytes(seen.reserved_bytes)} reserved (measured)")
    text += ". The estimator replays a fresh process"
    oom = pred.point.oom
    if oom is not None:
        text += (f": it predicts the same error in {oom.where}, {fmt_bytes(oom.request_bytes)} asked for with "
                 f"{fmt_bytes(oom.allocated_bytes)} allocated and {fmt_bytes(oom.reserved_bytes)} reserved "
                 "(predicted)")
        if seen is not None:
            diff = seen.reserved_bytes - oom.reserved_bytes
            text += (f". The process changed what the allocator held at the error by {fmt_bytes(abs(diff))} "
                     f"({'more' if diff >= 0 else 'less'} in the sweep's process), not the outcome")
        if pr.card_total_bytes is not None and pr.context_bytes is not None:
            left = pr.card_total_bytes - pr.context_bytes - oom.reserved_bytes
            text += (f": a fresh process also runs out, with {fmt_bytes(max(left, 0))} of the "
                     f"{fmt_bytes(pr.card_total_bytes)} card left outside the allocator's segments after its "
                     f"{fmt_bytes(pr.context_bytes)} context (predicted)")
        return text + ". This out-of-memory error does not depend on the process."
    peak = pred.point.peak_reserved_bytes or pred.point.peak_allocated_bytes or 0
    text += f": it predicts the point runs, peaking at {fmt_bytes(peak)} reserved (predicted)"
    if pr.card_total_bytes is not None and pr.context_bytes is not None:
        spare = pr.card_total_bytes - pr.context_bytes - peak
        text += (f", {fmt_bytes(spare)} below what the {fmt_bytes(pr.card_total_bytes)} card leaves the allocator "
                 "(predicted): this out-of-memory error depends on the process")
    return text + "."
