"""One matched point: per-metric values, deltas, ratios and marks (memory tolerance, step-time verdict).

Pure functions over point records; compare.py assembles them into a whole comparison, verdict.py
judges step times.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from types import EllipsisType

from ckptbench.analysis.verdict import (
    BETTER,
    NOISE,
    NOISY,
    NOT_COMPARABLE,
    TOO_FEW,
    WORSE,
    TimeEvidence,
    TimeVerdict,
    family_verdicts,
    time_verdict,
)
from ckptbench.config.grid import PointKey
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

    key: PointKey
    key_id: str
    label: str
    base_status: str
    new_status: str
    mark: str
    metrics: list[MetricChange]
    note: str | None = None


def compare_point(
    base: PointRecord, new: PointRecord, *, thresholds: Thresholds, label: str = "",
    p_value: float | EllipsisType | None = ...,
) -> PointChange:
    """Compare one point; a status change (ok <-> oom, error, skipped) decides the mark on its own.
    ``p_value``: the step times' Mann-Whitney p-value when already computed (verdict.time_verdict)."""
    b_status, n_status = base.status, new.status
    key = base.key
    if b_status == "ok" and n_status == "ok":
        metrics = _compare_ok(base, new, thresholds=thresholds, p_value=p_value)
        return PointChange(key, base.key_id, label, b_status, n_status, point_mark(metrics), metrics)
    if b_status == n_status == "oom":
        mark = UNCHANGED
    elif b_status == "ok" and n_status == "oom":
        mark = NEWLY_OOM
    elif b_status == "oom" and n_status == "ok":
        mark = NO_LONGER_OOM
    else:
        mark = NOT_COMPARABLE
    note = status_note(base.reason, new.reason)
    metrics = _status_metrics(base, new, mark)
    return PointChange(key, base.key_id, label, b_status, n_status, mark, metrics, note)


def short_reason(reason: str, *, limit: int = 160) -> str:
    """The first two sentences of why a point failed (a CUDA OOM message runs to 1,000 characters),
    cut at ``limit`` characters; the full text stays in the run's points.jsonl."""
    sentences = reason.strip().splitlines()[0].split(". ") if reason.strip() else [""]
    text = ". ".join(sentences[:2]) + ("." if len(sentences) > 2 else "")
    text = text if text.endswith(".") or len(sentences) <= 2 else text + "."
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def status_note(base_reason: str | None, new_reason: str | None) -> str | None:
    """Why each side failed, shortened; once when both failed for the same reason."""
    if base_reason and base_reason == new_reason:
        return f"base and new: {short_reason(base_reason)}"
    parts = [f"{side}: {short_reason(r)}" for side, r in (("base", base_reason), ("new", new_reason)) if r]
    return "; ".join(parts) or None


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


def _values(rec: PointRecord) -> dict[str, float | None]:
    if not rec.ok:
        return {}
    return {name: getattr(rec, name) for name, _, _ in METRICS}


def _compare_ok(
    base: PointRecord, new: PointRecord, *, thresholds: Thresholds, p_value: float | EllipsisType | None
) -> list[MetricChange]:
    b_stats, n_stats = _values(base), _values(new)
    # One verdict on the step-time samples; tokens/s and MFU are the median step time inverted, so they
    # share it (slower steps are fewer tokens/s: worse for both).
    verdict = time_verdict(
        base.step_times_s, new.step_times_s, time_rtol=thresholds.time_rtol, alpha=thresholds.alpha,
        p_value=p_value,
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
    for mark in (WORSE, BETTER, TOO_FEW, NOISY):
        if mark in marks:
            return mark
    if marks & QUIET_MARKS:
        return UNCHANGED
    return NOT_COMPARABLE


# Warning kinds (results/record.py ``warnings``) that make a point's step times poor evidence.
NOISY_KINDS = ("busy", "spread")
_TIME_METRICS = frozenset(name for name, _, kind in METRICS if kind != "memory")


def flagged(base: PointRecord, new: PointRecord) -> str | None:
    """The busy/spread warnings of a matched point: 'busy (new)', 'spread (base and new)'; None: none."""
    why = []
    for kind in NOISY_KINDS:
        sides = [side for side, rec in (("base", base), ("new", new)) if kind in rec.warning_kinds]
        if sides:
            why.append(f"{kind} ({' and '.join(sides)})")
    return ", ".join(why) or None


def _verdict_of(change: PointChange) -> TimeVerdict | None:
    m = next((m for m in change.metrics if m.metric == "median_step_time_s"), None)
    if m is None or m.n_base is None or m.n_new is None or m.evidence is None:
        return None
    return TimeVerdict(m.mark, m.rule, m.p_value, m.n_base, m.n_new, m.evidence)


def family_marks(
    changes: list[PointChange], records: list[tuple[PointRecord, PointRecord]], *, cpu: bool, thresholds: Thresholds
) -> list[PointChange]:
    """The points with their step-time marks judged over the whole comparison (verdict.py ``family_verdicts``):
    a change that does not survive it becomes 'within noise' in every time metric and in the point's mark."""
    judged = [(i, v) for i, c in enumerate(changes) if (v := _verdict_of(c)) is not None]
    evidence = [
        TimeEvidence(v, records[i][0].step_times_s, records[i][1].step_times_s, cpu=cpu,
                     flagged=flagged(*records[i]))
        for i, v in judged
    ]
    out = list(changes)
    for (i, _), verdict in zip(judged, family_verdicts(evidence, time_rtol=thresholds.time_rtol,
                                                       alpha=thresholds.alpha), strict=True):
        # Only what the family changes is copied: most points keep their own verdict (a metric, and a point,
        # whose values would not change stays the same object; 20,000 copies cost more than the verdicts).
        metrics = [
            _rejudged(m, verdict) if m.metric in _TIME_METRICS else m
            for m in changes[i].metrics
        ]
        mark = point_mark(metrics)
        unchanged = mark == changes[i].mark and all(a is b for a, b in zip(metrics, changes[i].metrics, strict=True))
        if not unchanged:
            out[i] = replace(changes[i], metrics=metrics, mark=mark)
    return out


def _rejudged(m: MetricChange, verdict: TimeVerdict) -> MetricChange:
    """A time metric with the family's verdict (mark and evidence); itself when they are what it holds."""
    mark = verdict.mark if m.mark != NOT_COMPARABLE else m.mark
    if mark == m.mark and verdict.evidence == m.evidence:
        return m
    return replace(m, mark=mark, evidence=verdict.evidence)
