"""Rendering of a comparison: rich table, Markdown, CSV and JSON (no metrics computed here)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.text import Text

from ckptbench.analysis.compare import Comparison, plain_one_level
from ckptbench.analysis.marks import NEWLY_OOM, NO_LONGER_OOM, QUIET_MARKS, MetricChange, PointChange
from ckptbench.analysis.verdict import BETTER, NOISY, RANGES_DISJOINT, TOO_FEW, WORSE
from ckptbench.render.json_dump import dumps_indented
from ckptbench.render.tables import Column, FitTable, csv_text, names, numeric_names
from ckptbench.units import SizeUnit, fmt_percent

# The values and the verdict (base, new, mark) stay in a narrow terminal; the p-value, ratio and delta
# (new minus base: readable from the two) give way first. Narrower still (40 columns), base goes, then the mark:
# each point's metric and its new value stay.
TABLE_COLUMNS = (
    Column("point", wrap=True, min_width=14),
    Column("metric", wrap=True, min_width=10, keep=1),
    Column("base", numeric=True, keep=4),
    Column("new", numeric=True, keep=2),
    Column("delta", priority=2, numeric=True),
    Column("ratio", priority=3, numeric=True),
    Column("p", priority=4, numeric=True),
    Column("mark", wrap=True, min_width=10, keep=3),
)
COLUMNS = tuple(names(TABLE_COLUMNS))
_RIGHT = numeric_names(TABLE_COLUMNS)
_NAMES = {
    "peak_allocated_bytes": "peak allocated",
    "peak_reserved_bytes": "peak reserved",
    "activation_bytes": "activation",
    "median_step_time_s": "step time (median)",
    "tokens_per_s": "tokens/s",
    "mfu": "MFU",
}
_COUNTED = ("worse", "better", "unchanged", "newly_oom", "no_longer_oom", "not_comparable")
_STYLE = {
    WORSE: "red", NEWLY_OOM: "bold red", BETTER: "green", NO_LONGER_OOM: "green", TOO_FEW: "yellow", NOISY: "yellow"
}


# The most rows the terminal table shows: a longer table does not fit a terminal (nobody reads 100,000 rows
# scrolling past) and rich takes about half a millisecond per row (20,000 points: 100,000 rows, 50 s). Past
# it the table keeps the changed rows (as --only-changed), of the first points up to this many rows, and
# says what it left out; --format markdown, csv and json stay complete.
TABLE_MAX_ROWS = 1000
# The most points the terminal lists as added (and as removed), one line each; the rest are counted.
LISTED_MAX = 50
EVERY_ROW = "--format markdown, csv or json"


def _shown(comp: Comparison, *, only_changed: bool) -> list[PointChange]:
    return [p for p in comp.points if not (only_changed and p.mark in QUIET_MARKS)]


def _row_count(p: PointChange, *, only_changed: bool) -> int:
    """How many table rows ``display_rows`` makes of a shown point (without making them)."""
    if p.base_status != "ok" or p.new_status != "ok":
        return 1
    if not only_changed:
        return len(p.metrics)
    return sum(1 for m in p.metrics if m.mark not in QUIET_MARKS)


@dataclass(frozen=True)
class TableView:
    """The points the terminal table shows, and what it left out to fit (``cut_note``: None when nothing)."""

    points: list[PointChange]
    only_changed: bool  # the quiet rows are hidden (asked for, or to fit)
    cut_note: str | None


def table_view(comp: Comparison, *, only_changed: bool = False, max_rows: int | None = TABLE_MAX_ROWS) -> TableView:
    """Every shown point while the table has at most ``max_rows`` rows (None: no limit); past that, only the
    changed rows, of the first points whose rows fit in ``max_rows`` (at least one point)."""
    shown = _shown(comp, only_changed=only_changed)
    total = sum(_row_count(p, only_changed=only_changed) for p in shown)
    if max_rows is None or total <= max_rows:
        return TableView(shown, only_changed, None)
    changed = shown if only_changed else _shown(comp, only_changed=True)
    kept: list[PointChange] = []
    rows = 0
    for p in changed:
        n = _row_count(p, only_changed=True)
        if kept and rows + n > max_rows:
            break
        kept.append(p)
        rows += n
    why = [] if only_changed else ["the unchanged and within-noise rows"]
    if len(kept) < len(changed):
        why.append(f"the changed rows of the last {len(changed) - len(kept):,} changed points")
    note = (f"a table of {total:,} rows does not fit a terminal: {rows:,} shown, left out: {' and '.join(why)}; "
            f"every row: {EVERY_ROW}")
    return TableView(kept, True, note)


def _memory_unit(comp: Comparison) -> SizeUnit:
    """One unit for every size of the comparison (units.py: GiB unless all are below 1 GiB)."""
    return SizeUnit.for_sizes(v for p in comp.points for m in p.metrics if m.unit == "bytes" for v in (m.base, m.new))


def _fmt(value: float | None, unit: str, mem: SizeUnit, *, signed: bool = False) -> str:
    if value is None:
        return "-"
    sign = "+" if signed else ""
    if unit == "bytes":
        return mem(value, signed=signed)
    if unit == "s":
        return "0.0 ms" if round(value * 1e3, 1) == 0 else f"{value * 1e3:{sign}.1f} ms"
    if unit == "fraction":
        return fmt_percent(value, digits=1, signed=signed)
    return "0" if round(value) == 0 else f"{value:{sign},.0f}"


def display_rows(
    comp: Comparison, *, only_changed: bool = False, points: list[PointChange] | None = None
) -> list[dict[str, str]]:
    """One row per metric of each matched point (of ``points``, when given); a status change is one 'status'
    row."""
    mem = _memory_unit(comp)
    rows = []
    for p in _shown(comp, only_changed=only_changed) if points is None else points:
        if p.base_status != "ok" or p.new_status != "ok":
            row = {"point": p.label, "metric": "status", "base": p.base_status, "new": p.new_status}
            rows.append({**row, "delta": "-", "ratio": "-", "p": "-", "mark": p.mark})
            continue
        for m in p.metrics:
            if only_changed and m.mark in QUIET_MARKS:
                continue
            rows.append(
                {
                    "point": p.label,
                    "metric": _NAMES.get(m.metric, m.metric),
                    "base": _fmt(m.base, m.unit, mem),
                    "new": _fmt(m.new, m.unit, mem),
                    "delta": _fmt(m.delta, m.unit, mem, signed=True),
                    "ratio": "-" if m.ratio is None else f"{m.ratio:.3f}",
                    "p": _p_cell(m),
                    "mark": m.mark,
                }
            )
    return rows


def _opt(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _p_cell(m: MetricChange) -> str:
    """The p-value, or what decided instead: disjoint step-time ranges, or too few samples (n=base/new)."""
    if m.mark == TOO_FEW:
        return f"n={m.n_base}/{m.n_new}"
    if m.rule == RANGES_DISJOINT:
        return "disjoint"
    return "-" if m.p_value is None else f"{m.p_value:.3f}"


def summary_line(comp: Comparison) -> str:
    """Counts of point marks and the geometric mean (and range) of step-time ratios."""
    s = comp.summary
    time = (
        f"step time ratio geomean {_opt(s['time_ratio_geomean'], '.3f')} "
        f"(min {_opt(s['time_ratio_min'], '.3f')}, max {_opt(s['time_ratio_max'], '.3f')})"
    )
    counted = [*_COUNTED, *(k for k in ("too_few_samples", "noisy_steps") if s.get(k))]
    counts = ", ".join(f"{s[k]} {k.replace('_', ' ')}" for k in counted)
    return f"{s['matched']} matched points: {counts}; {s['added']} added, {s['removed']} removed; {time}"


def detail_lines(
    comp: Comparison, *, only_changed: bool = False, points: list[PointChange] | None = None,
    listed_max: int | None = None,
) -> list[str]:
    """Why shown points (``points``, when given) failed (the OOM message), then points present on one side
    only, one line each (the first ``listed_max`` of each side, when given, and how many more)."""
    shown = _shown(comp, only_changed=only_changed) if points is None else points
    lines = [f"{p.label}: {p.note}" for p in shown if p.note]
    for p in shown:  # how sure each step-time change is
        step = next((m for m in p.metrics if m.metric == "median_step_time_s"), None)
        if step is not None and step.mark in (WORSE, BETTER, NOISY) and step.evidence:
            what = "not judged (noisy steps)" if step.mark == NOISY else step.mark
            lines.append(f"{p.label}: step time {what}: {step.evidence}")
    for side, run, listed in (("added", comp.new, comp.added), ("removed", comp.base, comp.removed)):
        cut = listed[:listed_max] if listed_max is not None else listed
        lines += [f"{side} (only in {run['name']}): {item['label']} [{item['status']}]" for item in cut]
        if len(cut) < len(listed):
            lines.append(f"{side} (only in {run['name']}): {len(listed) - len(cut):,} more points ({EVERY_ROW} "
                         "lists every one)")
    return lines


def warning_lines(comp: Comparison) -> list[str]:
    """Environment differences first, then notes about incomplete runs."""
    env = [f"environment differs: {d}" for d in comp.environment_differences]
    return env + list(comp.notes)


def compare_table(
    comp: Comparison, *, only_changed: bool = False, max_rows: int | None = TABLE_MAX_ROWS
) -> list[FitTable | Text]:
    """The table of a comparison (fitted to the terminal: its columns to the width, its rows to at most
    ``max_rows``, saying what it left out) followed by added/removed points and the summary."""
    view = table_view(comp, only_changed=only_changed, max_rows=max_rows)
    rows = display_rows(comp, only_changed=view.only_changed, points=view.points)
    title = f"ckptbench compare: {comp.base['name']} -> {comp.new['name']}"
    details = detail_lines(comp, only_changed=view.only_changed, points=view.points, listed_max=LISTED_MAX)
    trailer = [Text(line) for line in [*details, *([view.cut_note] if view.cut_note else []), summary_line(comp)]]
    if not rows:
        return [Text(f"{title}: no changed rows"), *trailer]
    table = FitTable(rows, TABLE_COLUMNS, title=title, styles=[_STYLE.get(row["mark"]) for row in rows],
                     caption="base and new: measured by each run",
                     complete_hint="--format markdown shows every column")
    return [table, *trailer]


def compare_markdown(comp: Comparison, *, only_changed: bool = False) -> str:
    """A Markdown document for pull-request comments: warnings, table, added/removed, summary, gates."""
    out = [f"### ckptbench compare: `{comp.base['name']}` -> `{comp.new['name']}`", ""]
    warnings = warning_lines(comp)
    if warnings:
        out += [*(f"> {w}  " for w in warnings), ""]
    rows = display_rows(comp, only_changed=only_changed)
    if rows:
        out.append("| " + " | ".join(COLUMNS) + " |")
        out.append("| " + " | ".join("---:" if c in _RIGHT else "---" for c in COLUMNS) + " |")
        out += ["| " + " | ".join(row[c].replace("|", "\\|") for c in COLUMNS) + " |" for row in rows]
    else:
        out.append("No changed rows.")
    out.append("")
    extra = detail_lines(comp, only_changed=only_changed)
    if extra:
        out += [*(f"- {line}" for line in extra), ""]
    out.append(f"**Summary:** {summary_line(comp)}")
    if comp.gate_failures:
        out += ["", "**Gate failures:**", "", *(f"- {g}" for g in comp.gate_failures)]
    if comp.gate_errors:
        out += ["", "**Gates that could not be judged:**", "", *(f"- {g}" for g in comp.gate_errors)]
    return "\n".join(out) + "\n"


def compare_csv(comp: Comparison, *, only_changed: bool = False) -> str:
    """Raw numbers (bytes, seconds), one row per metric of each point; added/removed points as rows too."""
    key_names: list[str] = []
    keys = [p.key for p in comp.points] + [item["key"] for item in (*comp.added, *comp.removed)]
    for key in keys:
        key_names += [k for k in key if k not in key_names]
    rows: list[dict[str, Any]] = []
    for p in _shown(comp, only_changed=only_changed):
        status = {"base_status": p.base_status, "new_status": p.new_status}
        if p.base_status != "ok" or p.new_status != "ok":
            rows.append({**p.key, **status, "metric": "status", "mark": p.mark})
            continue
        for m in p.metrics:
            if only_changed and m.mark in QUIET_MARKS:
                continue
            metric = {
                k: getattr(m, k)
                for k in ("metric", "unit", "base", "new", "delta", "ratio", "p_value", "rule", "evidence")
            }
            rows.append({**p.key, **status, **metric, "mark": m.mark})
    for side, listed in (("added", comp.added), ("removed", comp.removed)):
        for item in listed:
            status = {"new_status" if side == "added" else "base_status": item["status"]}
            rows.append({**item["key"], **status, "metric": "status", "mark": side})
    columns = [
        *key_names,
        "base_status",
        "new_status",
        "metric",
        "unit",
        "base",
        "new",
        "delta",
        "ratio",
        "p_value",
        "rule",
        "evidence",
        "mark",
    ]
    return csv_text(rows, columns)


def compare_json(comp: Comparison, *, only_changed: bool = False) -> str:
    """The documented JSON shape (``Comparison.to_dict``), optionally without unchanged points."""
    data = comp.to_dict_shallow()  # the points converted as they are written, not copied first
    if only_changed:
        data["points"] = [p for p in comp.points if p.mark not in QUIET_MARKS]
    return dumps_indented(data, convert=plain_one_level) + "\n"  # json.dumps(comp.to_dict(), indent=2, ...)


RENDERERS = {"markdown": compare_markdown, "csv": compare_csv, "json": compare_json}
