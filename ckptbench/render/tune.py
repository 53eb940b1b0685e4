"""Rendering of a tune search (run.json ``searches`` entry of kind 'tune', read as analysis/tune_record.py's
``TuneRecord``): the answer, the best point of every layout family, the measured steps of the search with their
reasons, and what was dropped why."""

from __future__ import annotations

import warnings

from pydantic import ValidationError
from rich.console import Group
from rich.text import Text

from ckptbench.analysis.marks import NOISY_KINDS
from ckptbench.analysis.recommend import Recommendation
from ckptbench.analysis.tune_record import TuneRecord
from ckptbench.config.grid import filled_key
from ckptbench.render.recommend import markdown_pareto, pareto_columns, pareto_rows
from ckptbench.render.tables import Column, FitTable, markdown_of
from ckptbench.results.store import Run
from ckptbench.units import SizeUnit

# Every figure in these tables is measured (the search's predictions only decide what to measure).
# Narrower than the always-shown columns (40 columns): the point and its tokens/s stay longest (keep).
FAMILY_TABLE = (
    Column("family", wrap=True, min_width=8, keep=3),
    Column("point", wrap=True, min_width=14),
    Column("ckpt layers", priority=3, wrap=True, min_width=10),
    Column("reserved", numeric=True, keep=2),
    Column("tok/s", numeric=True, keep=1),
    Column("vs best", priority=1, numeric=True),
)
STEP_TABLE = (
    Column("#", priority=2, numeric=True),
    Column("point", wrap=True, min_width=14),
    Column("why measured", priority=1, wrap=True, min_width=16),
    Column("tok/s", numeric=True, keep=1),
    Column("reserved", numeric=True, keep=2),
    Column("result", wrap=True, min_width=12, keep=3),
)
DROPPED_TABLE = (Column("point", wrap=True, min_width=14), Column("why dropped", wrap=True, min_width=20))
DROP_EXAMPLES = 3  # dropped candidates shown per reason (all of them are in run.json)
MEASURED = "every figure measured"


def size_unit(search: TuneRecord) -> SizeUnit:
    """One unit for every size of the search's output (units.py)."""
    sizes: list[int | None] = [search.limit_bytes]
    sizes += [m.peak_reserved_bytes for m in search.family_best.values()]
    sizes += [d.peak_reserved_bytes for d in search.decisions]
    return SizeUnit.for_sizes(sizes)


def tune_search(run: Run) -> TuneRecord | None:
    """The run's tune search, if it has one (a damaged one is left out with a warning naming it)."""
    stored = next((s for s in run.meta.searches if s.kind == "tune"), None)
    if stored is None:
        return None
    try:
        return TuneRecord.model_validate(stored.to_json())
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err.get("loc", ())) or "searches"
        warnings.warn(f"{run.path}: ignored the tune search ({where}: {err.get('msg', 'invalid')})", stacklevel=2)
        return None


def answer_text(search: TuneRecord, *, size: SizeUnit | None = None) -> str:
    """One sentence: the winner, its speed and memory, and what (if anything) changes the training."""
    size = size or size_unit(search)
    limit = size(search.limit_bytes)
    best = search.answer
    if best is None:
        return f"No measured point fits under {limit}; see the dropped and measured candidates below."
    changes = search.semantic_changes
    semantics = "changes to training: " + ", ".join(changes) if changes else (
        "same training as the config (full parameters, its optimizer and precision)"
    )
    return (
        f"{best.label}: {best.tokens_per_s:,.0f} tokens/s measured at {size(best.peak_reserved_bytes)} "
        f"peak reserved (limit {limit}); {semantics}."
    )


def search_facts(search: TuneRecord) -> list[str]:
    """How the search went: points measured, why it stopped, how predictions were judged."""
    counts = ", ".join(f"{n} {kind}" for kind, n in sorted(search.counts.items()))
    source = search.margin.source if search.margin is not None else "none"
    lines = [
        f"Measured {search.measured_points} point(s); stopped because {search.stopped_by}.",
        f"Candidates: {counts}.",
        "Fit predictions: the estimate's peak reserved where it gives one; otherwise its peak allocated times a "
        f"margin learned from the measured points ({source}).",
    ]
    lines += [f"Note: {n}" for n in (search.space.notes if search.space is not None else [])]
    return lines


def noisy_winner(search: TuneRecord, run: Run | None) -> str | None:
    """A line when the winner's measured steps were flagged busy or spread: its speed may mislead."""
    best = search.answer
    if best is None or run is None:
        return None
    # run.json keeps the key as written; records read back name every axis (an axis added since: its fill)
    want = filled_key(best.key)
    rec = next((r for r in run.points if r.ok and dict(r.key) == want), None)
    kinds = sorted({k for k in rec.warning_kinds if k in NOISY_KINDS}) if rec is not None else []
    if not kinds:
        return None
    flagged = "; ".join(w for w in rec.warnings if w.split(":", 1)[0] in kinds) if rec is not None else ""
    return (f"Caution: the winner's speed rests on noisy measurements ({flagged}); measure it again on a quiet "
            "host before trusting the ranking.")


def family_rows(search: TuneRecord, *, size: SizeUnit | None = None) -> list[dict[str, str]]:
    best = search.answer
    size = size or size_unit(search)
    rows = []
    for family, m in search.family_best.items():
        ratio = m.tokens_per_s / best.tokens_per_s if best is not None and best.tokens_per_s else None
        rows.append({
            "family": family,
            "point": m.label + ("  (winner)" if best is not None and m.key == best.key else ""),
            "ckpt layers": m.layers_checkpointed or "-",
            "reserved": size(m.peak_reserved_bytes),
            "tok/s": f"{m.tokens_per_s:,.0f}",
            "vs best": "-" if ratio is None else f"{ratio:.0%}",
        })
    return rows


def step_rows(search: TuneRecord, *, size: SizeUnit | None = None) -> list[dict[str, str]]:
    """The measured candidates in the order they were measured, with why and what came out."""
    rows, size = [], size or size_unit(search)
    for i, d in enumerate(d for d in search.decisions if d.action == "measured"):
        row = {"#": str(i + 1), "point": d.label, "why measured": d.why, "tok/s": "-", "reserved": "-"}
        if d.status == "ok":
            speed = "-" if d.tokens_per_s is None else f"{d.tokens_per_s:,.0f}"  # no tokens recorded: no rate
            row.update({"tok/s": speed, "reserved": size(d.peak_reserved_bytes)})
            row["result"] = "fits" if d.fits else str(d.note)
        else:
            row["result"] = f"{d.status}: {d.note or ''}"
        rows.append(row)
    return rows


def dropped_rows(search: TuneRecord) -> list[dict[str, str]]:
    """A few dropped candidates per reason, with the reason: the reason's head (its text before the first colon:
    'predicted not to fit', 'cannot beat all b=8 (1,354 tokens/s)') groups them, as shown."""
    shown: dict[str, int] = {}
    rows = []
    for d in search.decisions:
        if d.action != "dropped":
            continue
        head = d.why.split(":", 1)[0]
        shown[head] = shown.get(head, 0) + 1
        if shown[head] <= DROP_EXAMPLES:
            rows.append({"point": d.label, "why dropped": d.why})
    return rows


def rich_tune(search: TuneRecord, rec: Recommendation, *, run: Run | None = None) -> Group:
    """The terminal answer of `ckptbench tune`: every table fitted to the terminal (render/tables.py)."""
    hint = "--format json has every field"
    front = rec.pareto
    needed = any(c.context_bytes for c in front)
    parts: list[FitTable | Text] = [
        Text("tune: " + answer_text(search), style="bold green" if search.answer is not None else "yellow"),
        FitTable(family_rows(search), FAMILY_TABLE, title="Best measured point of each layout family",
                 title_justify="left", caption=MEASURED, complete_hint=hint),
        FitTable(pareto_rows(front, limit_bytes=rec.limit_bytes, size=rec.size),
                 pareto_columns(with_budget=True, needed=needed), title_justify="left", caption=MEASURED,
                 title="Pareto front of the measured points (" + ("needed" if needed else "peak reserved")
                 + " memory vs tokens/s)", complete_hint=hint),
        FitTable(step_rows(search), STEP_TABLE, title="The search, in order", title_justify="left",
                 complete_hint=hint),
        FitTable(dropped_rows(search), DROPPED_TABLE, title_justify="left", complete_hint=hint,
                 title="Dropped without measuring (examples per reason; all in run.json)"),
    ]
    parts += [Text(line) for line in search_facts(search)]
    caution = noisy_winner(search, run)
    if caution:
        parts.append(Text(caution, style="yellow"))
    return Group(*parts)


def markdown_tune(
    search: TuneRecord, rec: Recommendation | None = None, *, run: Run | None = None, size: SizeUnit | None = None
) -> str:
    """The search as a report section (in ``size``, the report's one unit, when given)."""
    out = ["## Tune: the fastest setup under the budget\n", f"**{answer_text(search, size=size)}**\n"]
    caution = noisy_winner(search, run)
    out += [f"{line}\n" for line in [*search_facts(search), *([caution] if caution else [])]]
    out.append("### Best measured point of each layout family\n")
    out.append(markdown_of(family_rows(search, size=size), FAMILY_TABLE))
    if rec is not None:
        out.append(markdown_pareto(rec.pareto, limit_bytes=rec.limit_bytes, level=3))
    out.append("### The search, in order\n")
    out.append(markdown_of(step_rows(search, size=size), STEP_TABLE))
    out.append("### Dropped without measuring (examples per reason)\n")
    out.append(markdown_of(dropped_rows(search), DROPPED_TABLE))
    return "\n".join(out)
