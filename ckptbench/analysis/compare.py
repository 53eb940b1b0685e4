"""What changed between two runs: matched points, per-metric marks, environment differences, gates.

Pure functions over loaded runs returning data (``compare_refs`` loads the two runs first);
per-point marks live in analysis/marks.py, the notes above the table in analysis/compare_notes.py,
rendering in render/compare.py.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

from ckptbench.analysis.compare_notes import (
    environment_differences,
    gpu_notes,
    power_notes,
    run_notes,
)
from ckptbench.analysis.mann_whitney import mann_whitney_ps
from ckptbench.analysis.marks import (
    NEWLY_OOM,
    NO_LONGER_OOM,
    UNCHANGED,
    MetricChange,
    PointChange,
    Thresholds,
    compare_point,
    family_marks,
    not_comparable,
)
from ckptbench.analysis.verdict import BETTER, NOISY, NOT_COMPARABLE, TOO_FEW, WORSE
from ckptbench.config.grid import key_id
from ckptbench.errors import ResultsError
from ckptbench.results.record import PointRecord
from ckptbench.results.store import Run, load_run


class NotComparableRuns(ResultsError):
    """Two runs whose comparison would mean nothing: other models, other devices or GPUs, no point in
    common (exit 2; ``--allow-different`` compares them anyway)."""


@dataclass(frozen=True)
class Gates:
    """CI gates; None / False disables one."""

    memory_pct: float | None = None  # peak allocated grows by more than this many percent
    # Median step time grows by more than this many percent and the step-time verdict says worse
    # (analysis/verdict.py); a point whose step times are too few for any verdict is a gate error.
    time_pct: float | None = None
    new_oom: bool = False  # a point that ran before now runs out of memory


@dataclass
class Comparison:
    """Everything compare found; ``to_dict`` is the documented JSON shape."""

    base: dict[str, Any]
    new: dict[str, Any]
    thresholds: Thresholds
    environment_differences: list[str]
    notes: list[str]
    points: list[PointChange]
    added: list[dict[str, Any]]
    removed: list[dict[str, Any]]
    summary: dict[str, Any] = field(default_factory=dict)
    gate_failures: list[str] = field(default_factory=list)
    # Gates that could not be judged (too few step-time samples for --fail-time): never a silent pass.
    gate_errors: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, **as_plain(self)}

    def to_dict_shallow(self) -> dict[str, Any]:
        """``to_dict`` one level deep: its values as they are, each written as ``to_dict`` has it by a writer
        that converts the dataclasses it meets with ``plain_one_level`` (render/json_dump.py)."""
        return {"schema": SCHEMA, **{name: getattr(self, name) for name in _field_names(type(self)) or ()}}


SCHEMA = "ckptbench.compare/1"


_ATOMS = frozenset({str, int, float, bool, type(None)})
_DATACLASS_FIELDS: dict[type, tuple[str, ...] | None] = {}  # by type: its field names, None: not a dataclass


def as_plain(value: Any) -> Any:
    """``dataclasses.asdict`` of a dataclass (and of what it holds), the same dicts and lists, without its
    deep copy of every number and string (immutable: shared instead); linear and quick for 20,000 points."""
    kind = type(value)
    if kind in _ATOMS:
        return value
    if kind is list:
        return [v if type(v) in _ATOMS else as_plain(v) for v in value]
    if kind is dict:
        return {as_plain(k): v if type(v) in _ATOMS else as_plain(v) for k, v in value.items()}
    names = _DATACLASS_FIELDS.get(kind, ())
    if names == ():
        names = _DATACLASS_FIELDS[kind] = tuple(f.name for f in fields(value)) if is_dataclass(value) else None
    if names is not None:
        own = getattr(value, "__dict__", None)
        if own is not None and tuple(own) == names:  # a plain instance: its attributes are its fields, in order
            return {k: v if type(v) in _ATOMS else as_plain(v) for k, v in own.items()}
        return {name: as_plain(getattr(value, name)) for name in names}
    return asdict(_Boxed(value))["value"]  # anything else exactly as asdict treats it (tuples, copies)


def _field_names(kind: type) -> tuple[str, ...] | None:
    names = _DATACLASS_FIELDS.get(kind, ())
    if names == ():
        names = _DATACLASS_FIELDS[kind] = tuple(f.name for f in fields(kind)) if is_dataclass(kind) else None
    return names


def plain_one_level(value: Any) -> Any:
    """What ``as_plain`` makes of ``value`` (not an atom, list or dict), one level deep: a plain dataclass
    instance's own attribute dict (its values left as they are, for the caller to convert in turn); anything
    else ``as_plain``'s whole conversion."""
    names = _field_names(type(value))
    own = getattr(value, "__dict__", None)
    if names is not None and own is not None and tuple(own) == names:
        return own
    return as_plain(value)


@dataclass
class _Boxed:
    """One value, for ``asdict``'s own treatment of what ``as_plain`` does not handle itself."""

    value: Any


def compare_runs(
    base: Run,
    new: Run,
    *,
    thresholds: Thresholds = Thresholds(),
    gates: Gates = Gates(),
    allow_mixed_gpus: bool = False,
    allow_different: bool = False,
) -> Comparison:
    """Match the points of two runs by key and compare every metric.

    Runs of different models, on different devices or GPU models, or with no point in common are
    refused (``NotComparableRuns``: a CI gate must not pass on nothing) unless ``allow_different``,
    which turns each refusal into a note. A run whose points ran on different GPU models compares
    nothing point by point: every matched point is 'not comparable' (and no gate fires) unless
    ``allow_mixed_gpus``.
    """
    base_pts = _by_key(base)
    new_pts = _by_key(new)
    matched = [k for k in base_pts if k in new_pts]
    differences = run_differences(base, new, matched=len(matched))
    if differences and not allow_different:
        raise NotComparableRuns(f"compare refused: {differences[0]} (--allow-different compares them anyway)")
    records = (*base_pts.values(), *new_pts.values())
    labels = point_labels([rec.key for rec in records], ids=[rec.key_id for rec in records])
    # The step times' p-values of every point both sides ran, in a few vectorised scipy calls.
    both_ok = [k for k in matched if base_pts[k].status == new_pts[k].status == "ok"]
    p_values = dict(zip(both_ok, mann_whitney_ps([(base_pts[k].step_times_s, new_pts[k].step_times_s)
                                                  for k in both_ok]), strict=True))
    points = [compare_point(base_pts[k], new_pts[k], thresholds=thresholds, label=labels[k],
                            p_value=p_values.get(k, ...)) for k in matched]
    cpu = "cpu" in (base.environment.device_type, new.environment.device_type)
    points = family_marks(points, [(base_pts[k], new_pts[k]) for k in matched], cpu=cpu, thresholds=thresholds)
    mixed = [f"{side} run {run.name}" for side, run in (("base", base), ("new", new)) if run.mixed_gpus]
    why: str | None = None  # why no point can be compared, when the runs themselves decide it
    if mixed and not allow_mixed_gpus:
        why = f"{' and '.join(mixed)} ran on different GPU models (--allow-mixed-gpus compares them anyway)"
        points = [not_comparable(p, why) for p in points]
    comp = Comparison(
        base=_run_info(base),
        new=_run_info(new),
        thresholds=thresholds,
        environment_differences=environment_differences(base, new),
        notes=[
            *(f"compared although {d} (--allow-different)" for d in differences),
            *gpu_notes(base, "base"),
            *gpu_notes(new, "new"),
            *run_notes(base, "base"),
            *run_notes(new, "new"),
            *power_notes([(base_pts[k], new_pts[k]) for k in matched], alpha=thresholds.alpha,
                         time_rtol=thresholds.time_rtol, cpu=cpu),
        ],
        points=points,
        added=[_listed(new_pts[k], labels) for k in new_pts if k not in base_pts],
        removed=[_listed(base_pts[k], labels) for k in base_pts if k not in new_pts],
    )
    comp.summary = summarize(comp)
    comp.gate_failures = gate_failures(points, gates=gates)
    comp.gate_errors = gate_errors(points, gates=gates, why_not_comparable=why)
    return comp


def compare_refs(
    base_ref: str | Path,
    new_ref: str | Path,
    *,
    results_root: Path = Path("results"),
    thresholds: Thresholds = Thresholds(),
    gates: Gates = Gates(),
    allow_mixed_gpus: bool = False,
    allow_different: bool = False,
) -> Comparison:
    """Load two runs (directories or names under ``results_root``) and compare them."""
    with warnings.catch_warnings():  # a truncated points file becomes a note of the comparison
        warnings.simplefilter("ignore")
        base = load_run(base_ref, results_root=results_root)
        new = load_run(new_ref, results_root=results_root)
    return compare_runs(base, new, thresholds=thresholds, gates=gates, allow_mixed_gpus=allow_mixed_gpus,
                        allow_different=allow_different)


def _models(run: Run) -> set[str]:
    """The models a run measured (its points' keys; the config's preset for a run without points)."""
    found = {str(rec.key["model"]) for rec in run.points if "model" in rec.key}
    preset = (run.config.get("model") or {}).get("preset") if isinstance(run.config.get("model"), dict) else None
    return found or ({str(preset)} if preset else set())


def _gpus(run: Run) -> set[str]:
    """The GPU models a run's points ran on (its environment's GPU for a run without points)."""
    gpu = run.environment.gpu_name
    return set(run.gpu_models) or ({str(gpu)} if gpu else set())


def run_differences(base: Run, new: Run, *, matched: int) -> list[str]:
    """Why two runs should not be compared at all, most telling first (empty: they can be)."""
    out = []
    base_models, new_models = _models(base), _models(new)
    if base_models and new_models and not base_models & new_models:
        out.append(f"the models differ ({', '.join(sorted(base_models))} vs {', '.join(sorted(new_models))})")
    base_kind, new_kind = base.environment.device_type, new.environment.device_type
    base_gpus, new_gpus = _gpus(base), _gpus(new)
    if base_kind and new_kind and base_kind != new_kind:
        out.append(f"the devices differ ({base_kind} vs {new_kind})")
    elif base_gpus and new_gpus and not base_gpus & new_gpus:  # one run mixing cards: --allow-mixed-gpus
        out.append(f"the GPUs differ ({', '.join(sorted(base_gpus))} vs {', '.join(sorted(new_gpus))})")
    if not matched:
        out.append(
            f"no point matches ({len(_by_key(base))} in {base.name}, {len(_by_key(new))} in {new.name}, none with "
            "the same key)"
        )
    return out


def _by_key(run: Run) -> dict[str, PointRecord]:
    """Points by key text; a key recorded twice (a resumed run) keeps its last record."""
    return {rec.key_id: rec for rec in run.points}


def _run_info(run: Run) -> dict[str, Any]:
    return {
        "name": run.name,
        "path": str(run.path),
        "status": run.meta.status,
        "points": len(run.points),
    }


def _listed(rec: PointRecord, labels: dict[str, str]) -> dict[str, Any]:
    return {"key": rec.key, "key_id": rec.key_id, "label": labels[rec.key_id], "status": rec.status}


# Short names of the usual key fields in labels; other fields (new axes) appear as name=value.
_LABEL_PREFIX = {"layout": "", "batch_size": "b=", "seq_len": "s=", "precision": ""}


def point_labels(keys: list[dict[str, Any]], *, ids: list[str] | None = None) -> dict[str, str]:
    """Short display labels by key text: layout, batch, seq, precision, plus any field that varies.
    ``ids``: each key's ``key_id`` when the caller already has it (a record's is computed once)."""
    # Fields in the order they first appear; a field varies when its values' texts (a key without the field
    # counts as "None") take two values. The keys of a run share a few field lists: each list is walked once,
    # and each field's values are collected by one comprehension. Linear in the points.
    shapes: dict[tuple[str, ...], int] = {}
    for key in keys:
        shape = tuple(key)
        shapes[shape] = shapes.get(shape, 0) + 1
    order = list(dict.fromkeys(k for shape in shapes for k in shape))
    names: list[str] = list(_LABEL_PREFIX)
    for k in order:
        if k in _LABEL_PREFIX:
            continue
        seen = {str(key[k]) for key in keys if k in key}
        if sum(n for shape, n in shapes.items() if k in shape) < len(keys):
            seen.add("None")
        if len(seen) > 1:
            names.append(k)
    prefixes = [(n, _LABEL_PREFIX.get(n, n + "=")) for n in names]
    labels = {}
    for key, kid in zip(keys, ids if ids is not None else map(key_id, keys), strict=True):
        labels[kid] = " ".join([f"{prefix}{key[n]}" for n, prefix in prefixes if n in key])
    return labels


def _metric(point: PointChange, name: str) -> MetricChange | None:
    return next((m for m in point.metrics if m.metric == name), None)


def summarize(comp: Comparison) -> dict[str, Any]:
    """Counts of point marks, added/removed, and the geometric mean and range of step-time ratios."""
    counts = {
        mark.replace(" ", "_"): 0
        for mark in (WORSE, BETTER, UNCHANGED, NEWLY_OOM, NO_LONGER_OOM, NOT_COMPARABLE, TOO_FEW, NOISY)
    }
    for p in comp.points:
        counts[p.mark.replace(" ", "_")] += 1
    ratios = [m.ratio for p in comp.points if (m := _metric(p, "median_step_time_s")) and m.ratio]
    mem = [
        abs(m.ratio - 1.0) * 100 for p in comp.points if (m := _metric(p, "peak_allocated_bytes")) and m.ratio
    ]
    return {
        "matched": len(comp.points),
        **counts,
        "added": len(comp.added),
        "removed": len(comp.removed),
        "time_ratio_geomean": math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None,
        "time_ratio_min": min(ratios, default=None),
        "time_ratio_max": max(ratios, default=None),
        "peak_allocated_max_change_pct": max(mem, default=None),
    }


def gate_failures(points: list[PointChange], *, gates: Gates) -> list[str]:
    """One line per point and gate that fails."""
    out = []
    for p in points:
        if gates.new_oom and p.mark == NEWLY_OOM:
            out.append(f"{p.label}: newly out of memory")
        mem = _metric(p, "peak_allocated_bytes")
        if gates.memory_pct is not None and mem and mem.ratio is not None:
            growth = (mem.ratio - 1.0) * 100
            if growth > gates.memory_pct:
                out.append(f"{p.label}: peak allocated +{growth:.2f}% > {gates.memory_pct:g}%")
        t = _metric(p, "median_step_time_s")
        # The verdict decides whether the step time changed at all; the gate how much is too much.
        if gates.time_pct is not None and t and t.ratio is not None and t.mark == WORSE:
            growth = (t.ratio - 1.0) * 100
            if growth > gates.time_pct:
                out.append(f"{p.label}: median step time +{growth:.2f}% > {gates.time_pct:g}% ({t.evidence})")
    return out


def gate_errors(points: list[PointChange], *, gates: Gates, why_not_comparable: str | None = None) -> list[str]:
    """Why a gate could not be judged, one line each: nothing matched, nothing matched could be compared (every
    point failed, or the runs mix GPU models), points that ran in the base run but not in the new one (any gate);
    --fail-time on points with too few or noisy step-time samples. A gate with nothing it could judge never passes.
    ``why_not_comparable``: why every point is not comparable, when the comparison itself decided so."""
    asked = gates.memory_pct is not None or gates.time_pct is not None or gates.new_oom
    if not asked:
        return []
    if not points:
        return ["no point matched: the gates have nothing to judge"]
    if all(p.mark == NOT_COMPARABLE for p in points):
        why = why_not_comparable or _statuses(points)
        return [f"the gates judged nothing: none of the {len(points)} matched point(s) could be compared ({why}); "
                "a gate with nothing to judge does not pass"]
    out = []
    lost = [p for p in points if p.base_status in ("ok", "oom") and p.new_status in ("error", "skipped")]
    if lost:
        out.append(f"the gates cannot judge {len(lost)} point(s) that ran in the base run but not in the new one "
                   f"({_statuses(lost)}): {_some(p.label for p in lost)}")
    return out + _time_gate_errors(points, gates=gates)


def _statuses(points: list[PointChange]) -> str:
    """'4 ok in the base, error in the new run', most common first."""
    counts: dict[tuple[str, str], int] = {}
    for p in points:
        counts[(p.base_status, p.new_status)] = counts.get((p.base_status, p.new_status), 0) + 1
    pairs = sorted(counts.items(), key=lambda kv: -kv[1])
    return "; ".join(f"{n} {b} in the base, {s} in the new run" for (b, s), n in pairs)


def _time_gate_errors(points: list[PointChange], *, gates: Gates) -> list[str]:
    """--fail-time on points whose step times are too few or too noisy to judge."""
    if gates.time_pct is None:
        return []
    blind = [(p, t) for p in points if (t := _metric(p, "median_step_time_s")) and t.mark == TOO_FEW]
    out = []
    if blind:
        why = blind[0][1].evidence
        out.append(f"--fail-time cannot judge {len(blind)} point(s): {why}: {_some(p.label for p, _ in blind)}")
    # A slowdown past the gate that a busy/spread flag kept from being declared: neither a pass nor a failure.
    noisy = [
        p for p in points
        if (t := _metric(p, "median_step_time_s")) and t.mark == NOISY and t.ratio is not None
        and (t.ratio - 1.0) * 100 > gates.time_pct
    ]
    if noisy:
        out.append(
            f"--fail-time cannot judge {len(noisy)} point(s) slower by more than {gates.time_pct:g}% but measured "
            f"on a busy host or with unsteady steps (rerun them on a quiet host): {_some(p.label for p in noisy)}"
        )
    return out


def _some(labels: Iterable[str], *, shown: int = 3) -> str:
    """The first few labels and how many more."""
    items = list(labels)
    rest = f" and {len(items) - shown} more" if len(items) > shown else ""
    return ", ".join(items[:shown]) + rest
