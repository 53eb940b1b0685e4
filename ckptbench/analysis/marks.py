"""One matched point: per-metric values, deltas, ratios and marks (memory tolerance, step-time verdict).

Pure functions over point records; compare.py assembles them into a whole comparison, verdict.py
judges step times.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ckptbench.analysis.verdict import (
    BETTER,
    NOISE,
    NOT_COMPARABLE,
    TOO_FEW,
    WORSE,
    TimeVerdict,
    time_verdict,
)
from ckptbench.config.grid import key_id
from ckptbench.results.record import PointRecord

# Marks, per metric and per point (worse, better, within noise, too few samples, not comparable: verdict.py).
UNCHANGED = "unchanged"
NEWLY_OOM, NO_LONGER_OOM = "newly oom", "no longer oom"
QUIET_MARKS = frozenset({UNCHANGED, NOISE})

# (name, unit, kind): memory is compared against a small tolerance; time and throughput (tokens/s, MFU: the
# median step time inverted, so slower is worse for all three) share the step-time verdict.
METRICS: tuple[tuple[str, str, str], ...] = (
    ("peak_allocated_bytes", "bytes", "memory"),
    ("peak_reserved_bytes", "bytes", "memory"),
    ("activation_bytes", "bytes", "memory"),
    ("median_step_time_s", "s", "time"),
    ("tokens_per_s", "tokens/s", "throughput"),
    ("mfu", "fraction", "throughput"),
)


@dataclass(frozen=True)
class Thresholds:
    """When a difference counts as a change."""

    # Relative memory change at or below this is "unchanged" (memory is nearly deterministic).
    memory_rtol: float = 0.001
    # Relative change of median step time below this is "within noise", even when a rule saw a change.
    time_rtol: float = 0.02
    # Two-sided Mann-Whitney U p-value below which a step-time difference is significant; also the
    # largest chance of disjoint step-time ranges with no change that counts as a change (verdict.py).
    alpha: float = 0.05


@dataclass
class MetricChange:
    """One metric of one matched point."""

    metric: str
    unit: str
    base: float | None
    new: float | None
    delta: float | None
    ratio: float | None
    mark: str
    p_value: float | None = None
    # Time metrics: which rule decided (verdict.py: 'mann-whitney', 'ranges disjoint', or None), the
    # line that says how sure, and the number of measured steps on each side.
    rule: str | None = None
    evidence: str | None = None
    n_base: int | None = None
    n_new: int | None = None


@dataclass
class PointChange:
    """A point present in both runs."""

    key: dict[str, Any]
    key_id: str
    label: str
    base_status: str
    new_status: str
    mark: str
    metrics: list[MetricChange]
    note: str | None = None


def compare_point(
    base: PointRecord, new: PointRecord, *, thresholds: Thresholds, label: str = ""
) -> PointChange:
    """Compare one point; a status change (ok <-> oom, error, skipped) decides the mark on its own."""
    b_status, n_status = base.status, new.status
    key = base.key
    if b_status == "ok" and n_status == "ok":
        metrics = _compare_ok(base, new, thresholds=thresholds)
        return PointChange(key, key_id(key), label, b_status, n_status, point_mark(metrics), metrics)
    if b_status == n_status == "oom":
        mark = UNCHANGED
    elif b_status == "ok" and n_status == "oom":
        mark = NEWLY_OOM
    elif b_status == "oom" and n_status == "ok":
        mark = NO_LONGER_OOM
    else:
        mark = NOT_COMPARABLE
    note = "; ".join(
        f"{side}: {rec.reason}" for side, rec in (("base", base), ("new", new)) if rec.reason
    )
    metrics = _status_metrics(base, new, mark)
    return PointChange(key, key_id(key), label, b_status, n_status, mark, metrics, note or None)


def _status_metrics(base: PointRecord, new: PointRecord, mark: str) -> list[MetricChange]:
    """The values each side has, marked by the status change (no ratios across a failure)."""
    b_stats, n_stats = _values(base), _values(new)
    metric_mark = NOT_COMPARABLE if mark == UNCHANGED else mark
    out = []
    for name, unit, _ in METRICS:
        b, n = b_stats.get(name), n_stats.get(name)
        if b is not None or n is not None:
            out.append(MetricChange(name, unit, b, n, None, None, metric_mark))
    return out


def _values(rec: PointRecord) -> dict[str, Any]:
    if not rec.ok:
        return {}
    return {name: getattr(rec, name) for name, _, _ in METRICS}


def _compare_ok(base: PointRecord, new: PointRecord, *, thresholds: Thresholds) -> list[MetricChange]:
    b_stats, n_stats = _values(base), _values(new)
    # One verdict on the step-time samples; tokens/s and MFU are the median step time inverted, so they
    # share it (slower steps are fewer tokens/s: worse for both).
    verdict = time_verdict(
        base.step_times_s, new.step_times_s, time_rtol=thresholds.time_rtol, alpha=thresholds.alpha
    )
    out = []
    for name, unit, kind in METRICS:
        b, n = b_stats.get(name), n_stats.get(name)
        if b is None and n is None:
            continue  # measured on neither side (MFU without a known peak): nothing to say
        delta, ratio = _delta_ratio(b, n)
        if kind == "memory":
            mark = memory_mark(b, n, rtol=thresholds.memory_rtol)
            out.append(MetricChange(name, unit, b, n, delta, ratio, mark))
        else:
            mark = NOT_COMPARABLE if ratio is None else verdict.mark
            out.append(_time_change(name, unit, b, n, delta, ratio, mark, verdict))
    return out


def _time_change(
    name: str, unit: str, b: float | None, n: float | None, delta: float | None, ratio: float | None,
    mark: str, verdict: TimeVerdict,
) -> MetricChange:
    return MetricChange(
        name, unit, b, n, delta, ratio, mark, verdict.p_value,
        rule=verdict.rule, evidence=verdict.evidence, n_base=verdict.n_base, n_new=verdict.n_new,
    )


def _delta_ratio(b: float | None, n: float | None) -> tuple[float | None, float | None]:
    if b is None or n is None:
        return None, None
    return n - b, (n / b if b else None)


def memory_mark(base: float | None, new: float | None, *, rtol: float) -> str:
    """Memory is nearly deterministic: any change beyond a small relative tolerance counts."""
    if base is None or new is None:
        return NOT_COMPARABLE
    if abs(new - base) <= rtol * max(abs(base), 1.0):
        return UNCHANGED
    return WORSE if new > base else BETTER


def point_mark(metrics: list[MetricChange]) -> str:
    """Worse if any metric is worse; better if any is better and none worse; 'too few samples' when the
    step times could not be judged and nothing else changed (the point is not known to be unchanged)."""
    marks = {m.mark for m in metrics}
    for mark in (WORSE, BETTER, TOO_FEW):
        if mark in marks:
            return mark
    if marks & QUIET_MARKS:
        return UNCHANGED
    return NOT_COMPARABLE
