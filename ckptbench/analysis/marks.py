"""One matched point: per-metric values, deltas, ratios and marks (memory tolerance, step-time test).

Pure functions over point records; compare.py assembles them into a whole comparison.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from ckptbench.config.grid import key_id
from ckptbench.results.record import PointRecord

# Marks, per metric and per point.
WORSE, BETTER, UNCHANGED, NOISE = "worse", "better", "unchanged", "within noise"
NEWLY_OOM, NO_LONGER_OOM, NOT_COMPARABLE = "newly oom", "no longer oom", "not comparable"
QUIET_MARKS = frozenset({UNCHANGED, NOISE})

# (name, unit, kind): memory is compared against a small tolerance, the rest against the step-time test.
METRICS: tuple[tuple[str, str, str], ...] = (
    ("peak_allocated_bytes", "bytes", "memory"),
    ("peak_reserved_bytes", "bytes", "memory"),
    ("activation_bytes", "bytes", "memory"),
    ("median_step_time_s", "s", "time"),
    ("tokens_per_s", "tokens/s", "throughput"),
    ("mfu", "fraction", "throughput"),
)
HIGHER_IS_BETTER = frozenset({"tokens_per_s", "mfu"})


@dataclass(frozen=True)
class Thresholds:
    """When a difference counts as a change."""

    # Relative memory change at or below this is "unchanged" (memory is nearly deterministic).
    memory_rtol: float = 0.001
    # Relative change of median step time below this is "within noise", even when significant.
    time_rtol: float = 0.02
    # Two-sided Mann-Whitney U p-value below which a step-time difference is significant.
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


def not_comparable(change: PointChange, why: str) -> PointChange:
    """The same point with every metric's values kept but no delta, ratio or mark: it cannot be compared."""
    metrics = [MetricChange(m.metric, m.unit, m.base, m.new, None, None, NOT_COMPARABLE) for m in change.metrics]
    note = "; ".join(x for x in (change.note, why) if x)
    return replace(change, mark=NOT_COMPARABLE, metrics=metrics, note=note)


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
    p_value = time_p_value(base.step_times_s, new.step_times_s)
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
            mark = time_mark(ratio, p_value, higher_is_better=name in HIGHER_IS_BETTER, thresholds=thresholds)
            out.append(MetricChange(name, unit, b, n, delta, ratio, mark, p_value))
    return out


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


def time_p_value(base_s: list[float], new_s: list[float]) -> float | None:
    """Two-sided Mann-Whitney U p-value on the raw per-step times (None without samples)."""
    if not base_s or not new_s:
        return None
    from scipy.stats import mannwhitneyu

    p = float(mannwhitneyu(new_s, base_s, alternative="two-sided").pvalue)
    return 1.0 if math.isnan(p) else p  # all samples tied: no evidence of a change


def time_mark(
    ratio: float | None, p_value: float | None, *, higher_is_better: bool, thresholds: Thresholds
) -> str:
    """Worse/better only when the step-time test is significant and the effect exceeds the noise band."""
    if ratio is None or p_value is None:
        return NOT_COMPARABLE
    if p_value >= thresholds.alpha or abs(ratio - 1.0) < thresholds.time_rtol:
        return NOISE
    return BETTER if (ratio > 1.0) == higher_is_better else WORSE


def point_mark(metrics: list[MetricChange]) -> str:
    """A point is worse if any metric is worse; better if any is better and none worse."""
    marks = {m.mark for m in metrics}
    if WORSE in marks:
        return WORSE
    if BETTER in marks:
        return BETTER
    if marks & QUIET_MARKS:
        return UNCHANGED
    return NOT_COMPARABLE
