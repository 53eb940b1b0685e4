"""Rendering of a tune search (run.json ``searches`` entry of kind 'tune'): the answer, the best point of
every layout family, the measured steps of the search with their reasons, and what was dropped why."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from ckptbench.analysis.recommend import Recommendation
from ckptbench.render.recommend import markdown_pareto, pareto_rows
from ckptbench.render.tables import markdown_table
from ckptbench.render.text import rich_safe
from ckptbench.results.store import Run
from ckptbench.units import fmt_bytes

FAMILY_COLUMNS = ("family", "point", "ckpt layers", "reserved", "tok/s", "vs best")
STEP_COLUMNS = ("#", "point", "why measured", "result")
DROP_EXAMPLES = 3  # dropped candidates shown per reason (all of them are in run.json)
_RIGHT = {"#", "reserved", "tok/s", "vs best", "count"}


def tune_search(run: Run) -> dict[str, Any] | None:
    """The run's tune search, if it has one."""
    return next((s for s in run.meta.get("searches") or [] if s.get("kind") == "tune"), None)


def answer_text(search: dict[str, Any]) -> str:
    """One sentence: the winner, its speed and memory, and what (if anything) changes the training."""
    limit = fmt_bytes(int(search["limit_bytes"]))
    best = search.get("answer")
    if best is None:
        return f"No measured point fits under {limit}; see the dropped and measured candidates below."
    changes = search.get("semantic_changes") or []
    semantics = "changes to training: " + ", ".join(changes) if changes else (
        "same training as the config (full parameters, its optimizer and precision)"
    )
    return (
        f"{best['label']}: {best['tokens_per_s']:,.0f} tokens/s measured at {fmt_bytes(best['peak_reserved_bytes'])} "
        f"peak reserved (limit {limit}); {semantics}."
    )


def search_facts(search: dict[str, Any]) -> list[str]:
    """How the search went: points measured, why it stopped, how predictions were judged."""
    counts = ", ".join(f"{n} {kind}" for kind, n in sorted(search.get("counts", {}).items()))
    margin = search.get("margin") or {}
    lines = [
        f"Measured {search.get('measured_points', 0)} point(s); stopped because {search.get('stopped_by')}.",
        f"Candidates: {counts}.",
        "Fit predictions: the estimate's peak reserved where it gives one; otherwise its peak allocated times a "
        f"margin learned from the measured points ({margin.get('source', 'none')}).",
    ]
    lines += [f"Note: {n}" for n in (search.get("space") or {}).get("notes", [])]
    return lines


def family_rows(search: dict[str, Any]) -> list[dict[str, str]]:
    best = search.get("answer") or {}
    rows = []
    for family, m in (search.get("family_best") or {}).items():
        ratio = m["tokens_per_s"] / best["tokens_per_s"] if best.get("tokens_per_s") else None
        rows.append({
            "family": family,
            "point": m["label"] + ("  (winner)" if m["key"] == best.get("key") else ""),
            "ckpt layers": m.get("layers_checkpointed") or "-",
            "reserved": fmt_bytes(m["peak_reserved_bytes"]),
            "tok/s": f"{m['tokens_per_s']:,.0f}",
            "vs best": "-" if ratio is None else f"{ratio:.0%}",
        })
    return rows


def step_rows(search: dict[str, Any]) -> list[dict[str, str]]:
    """The measured candidates in the order they were measured, with why and what came out."""
    rows = []
    for i, d in enumerate(d for d in search.get("decisions", []) if d["action"] == "measured"):
        if d.get("status") == "ok":
            result = f"{d['tokens_per_s']:,.0f} tok/s, {fmt_bytes(d['peak_reserved_bytes'])}"
            result += ", fits" if d.get("fits") else f" ({d.get('note')})"
        else:
            result = f"{d.get('status')}: {d.get('note') or ''}"
        rows.append({"#": str(i + 1), "point": d["label"], "why measured": d["why"], "result": result})
    return rows


def dropped_rows(search: dict[str, Any]) -> list[dict[str, str]]:
    """A few dropped candidates per reason kind, with the reason."""
    shown: dict[str, int] = {}
    rows = []
    for d in search.get("decisions", []):
        if d["action"] != "dropped":
            continue
        kind = str(d["why"]).split(":", 1)[0]
        shown[kind] = shown.get(kind, 0) + 1
        if shown[kind] <= DROP_EXAMPLES:
            rows.append({"point": d["label"], "why dropped": d["why"]})
    return rows


def _rich(rows: Sequence[dict[str, str]], columns: Sequence[str], title: str, wrap: Sequence[str] = ()) -> Table:
    table = Table(title=rich_safe(title), header_style="bold", title_justify="left")
    for col in columns:
        table.add_column(col, justify="right" if col in _RIGHT else "left", no_wrap=col not in wrap, overflow="fold")
    for row in rows:
        table.add_row(*(Text(row[c]) for c in columns))  # cells hold user strings: never markup
    return table


def rich_tune(search: dict[str, Any], rec: Recommendation) -> Group:
    """The terminal answer of `ckptbench tune`."""
    parts: list[Table | Text] = [
        Text("tune: " + answer_text(search), style="bold green" if search.get("answer") else "yellow"),
        _rich(family_rows(search), FAMILY_COLUMNS, "Best measured point of each layout family"),
        _rich(pareto_rows(rec.pareto, limit_bytes=rec.limit_bytes), ("point", "ckpt layers", "reserved", "allocated",
              "tok/s", "fits"), "Pareto front of the measured points (peak reserved vs tokens/s)"),
        _rich(step_rows(search), STEP_COLUMNS, "The search, in order", wrap=("why measured", "result")),
        _rich(dropped_rows(search), ("point", "why dropped"), "Dropped without measuring (examples per reason; "
              "all in run.json)", wrap=("why dropped",)),
    ]
    parts += [Text(line) for line in search_facts(search)]
    return Group(*parts)


def markdown_tune(search: dict[str, Any], rec: Recommendation | None = None) -> str:
    """The search as a report section."""
    out = ["## Tune: the fastest setup under the budget\n", f"**{answer_text(search)}**\n"]
    out += [f"{line}\n" for line in search_facts(search)]
    out.append("### Best measured point of each layout family\n")
    out.append(markdown_table(family_rows(search), FAMILY_COLUMNS, right=_RIGHT))
    if rec is not None:
        out.append(markdown_pareto(rec.pareto, limit_bytes=rec.limit_bytes, level=3))
    out.append("### The search, in order\n")
    out.append(markdown_table(step_rows(search), STEP_COLUMNS, right=_RIGHT))
    out.append("### Dropped without measuring (examples per reason)\n")
    out.append(markdown_table(dropped_rows(search), ("point", "why dropped"), right=_RIGHT))
    return "\n".join(out)
