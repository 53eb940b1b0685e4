"""compare's quick paths give what the plain ones gave: labels from known key texts, and family verdicts that
copy only the points they change (issue 24: a 20,000-point compare in a few seconds)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from ckptbench.analysis.compare import _by_key, point_labels
from ckptbench.analysis.marks import (
    _TIME_METRICS,
    NOT_COMPARABLE,
    PointChange,
    Thresholds,
    _verdict_of,
    compare_point,
    family_marks,
    flagged,
    point_mark,
)
from ckptbench.analysis.verdict import TimeEvidence, family_verdicts
from ckptbench.config.grid import key_id
from ckptbench.results.meta import RunMeta
from ckptbench.results.record import PointRecord
from ckptbench.results.store import Run


def _run(times: dict[int, list[float]], name: str) -> Run:
    recs = [
        PointRecord.model_validate({
            "key": {"layout": "all", "batch_size": b, "seq_len": 8, "precision": "bf16", "extra": b % 3},
            "status": "ok", "step_times_s": t, "tokens_per_step": 8, "peak_allocated_bytes": 100 + b,
        })
        for b, t in times.items()
    ]
    return Run(path=Path(name), meta=RunMeta(schema_version=1, status="complete"), points=recs)


def _families(changes: list[PointChange], records: list[tuple[PointRecord, PointRecord]], *, cpu: bool,
              thresholds: Thresholds) -> list[PointChange]:
    """family_marks as it was: every judged point and its time metrics copied."""
    judged = [(i, v) for i, c in enumerate(changes) if (v := _verdict_of(c)) is not None]
    evidence = [TimeEvidence(v, records[i][0].step_times_s, records[i][1].step_times_s, cpu=cpu,
                             flagged=flagged(*records[i])) for i, v in judged]
    out = list(changes)
    for (i, _), verdict in zip(judged, family_verdicts(evidence, time_rtol=thresholds.time_rtol,
                                                       alpha=thresholds.alpha), strict=True):
        metrics = [replace(m, mark=verdict.mark if m.mark != NOT_COMPARABLE else m.mark, evidence=verdict.evidence)
                   if m.metric in _TIME_METRICS else m for m in changes[i].metrics]
        out[i] = replace(changes[i], metrics=metrics, mark=point_mark(metrics))
    return out


def test_family_marks_copy_only_the_points_they_change() -> None:
    base_t = {b: [0.100 + 0.001 * j for j in range(10)] for b in range(1, 13)}
    new_t = {
        **{b: list(base_t[b]) for b in range(1, 5)},  # the same: kept as they are
        **{b: [t * 1.5 for t in base_t[b]] for b in range(5, 9)},  # much slower: evidence grows
        **{b: [t * 1.004 for t in base_t[b]] for b in range(9, 13)},  # a whisker: within noise
    }
    base, new = _by_key(_run(base_t, "a")), _by_key(_run(new_t, "b"))
    t = Thresholds()
    records = [(base[k], new[k]) for k in base]
    for cpu in (False, True):
        changes = [compare_point(b, n, thresholds=t) for b, n in records]
        got = family_marks(changes, records, cpu=cpu, thresholds=t)
        assert got == _families(changes, records, cpu=cpu, thresholds=t)
        kept = [g is c for g, c in zip(got, changes, strict=True)]
        assert any(kept) and not all(kept)  # both paths taken


def test_point_labels_from_known_key_texts_are_the_same() -> None:
    keys: list[dict[str, Any]] = [
        {"layout": "all", "batch_size": 1, "seq_len": 8, "precision": "bf16"},
        {"layout": "all", "batch_size": 2, "seq_len": 8, "precision": "bf16", "attn": "eager"},
        {"layout": "none", "batch_size": 2, "seq_len": 8, "precision": "fp32", "model": "x"},
    ]
    assert point_labels(keys, ids=[key_id(k) for k in keys]) == point_labels(keys)
    assert list(point_labels(keys)) == [key_id(k) for k in keys]
