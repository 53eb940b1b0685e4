"""Rendering of a recommendation: display rows, rich tables, Markdown (no metrics computed here)."""

from __future__ import annotations

from rich.console import Group
from rich.text import Text

from ckptbench.analysis.recommend import Recommendation, RecommendCandidate
from ckptbench.render.tables import Column, FitTable, markdown_of
from ckptbench.units import SizeUnit

# In a terminal too narrow for the columns always shown (40 columns): the point, its tokens/s and what it needs
# stay; the distance to the limit and the role go first (keep).
CHOICE_COLUMNS = (
    Column("role", keep=3),
    Column("point", wrap=True, min_width=14),
    Column("ckpt layers", priority=4, wrap=True, min_width=10),
    Column("reserved", priority=2, numeric=True),  # measured peak reserved
    Column("needed", numeric=True, keep=2),  # peak reserved + CUDA context: what the limit is compared with
    Column("allocated", priority=3, numeric=True),
    Column("activation", priority=3, numeric=True),
    Column("tok/s", numeric=True, keep=1),
    Column("vs best", priority=1, numeric=True),
    Column("vs limit", numeric=True, keep=4),  # budget minus headroom: the same figure as the sentence
)
PARETO_COLUMNS = (
    Column("point", wrap=True, min_width=14),
    Column("ckpt layers", priority=3, wrap=True, min_width=10),
    Column("reserved", priority=1, numeric=True),
    Column("needed", numeric=True, keep=2),
    Column("allocated", priority=2, numeric=True),
    Column("tok/s", numeric=True, keep=1),
    Column("fits", keep=3),
)
_STYLE = {"best": "bold green", "no fit": "yellow", "smallest": "yellow"}
MEASURED_CAPTION = "every figure measured by the run"


def heading(rec: Recommendation) -> str:
    """'Under 80.00 GiB (4.00 GiB headroom: at most 76.00 GiB peak reserved), seq 2048'."""
    size = rec.size
    seq = f", seq_len {rec.seq_len}" if rec.seq_len is not None else ""
    shown = rec.smallest or rec.best
    what = "peak reserved" if shown is None or not shown.context_bytes else "needed (peak reserved + CUDA context)"
    if not rec.headroom_bytes:
        return f"Under {size(rec.budget_bytes)} of {what} memory, no headroom{seq}"
    return (
        f"Under {size(rec.budget_bytes)} ({size(rec.headroom_bytes)} headroom: at most "
        f"{size(rec.limit_bytes)} {what}){seq}"
    )


def _row(role: str, c: RecommendCandidate, rec: Recommendation) -> dict[str, str]:
    vs = f"{c.tokens_per_s / rec.best.tokens_per_s:.0%}" if rec.best is not None else "-"
    size = rec.size
    return {
        "role": role,
        "point": c.label + (" (!)" if c.notes else ""),
        "ckpt layers": c.layers_checkpointed or "-",
        "reserved": size(c.reserved_bytes),
        "needed": size(c.memory_bytes),
        "allocated": size(c.peak_allocated_bytes),
        "activation": size(c.breakdown["activation_bytes"]),
        "tok/s": f"{c.tokens_per_s:,.0f}",
        "vs best": vs,
        "vs limit": rec.room(c),
    }


def choice_rows(rec: Recommendation) -> list[dict[str, str]]:
    """The winner, the best point of every other layout that fits, then layouts where nothing fits."""
    rows = []
    if rec.best is not None:
        rows.append(_row("best", rec.best, rec))
    rows += [_row("runner-up", c, rec) for c in rec.runners_up]
    if rec.best is None and rec.smallest is not None:
        rows.append(_row("smallest", rec.smallest, rec))
    # Without a winner the smallest point is already shown; its layout's "no fit" row would repeat it.
    repeat = rec.smallest if rec.best is None else None
    rows += [_row("no fit", c, rec) for c in rec.no_fit_layouts if c is not repeat]
    return rows


def pareto_rows(
    front: list[RecommendCandidate], *, limit_bytes: int | None = None, size: SizeUnit | None = None
) -> list[dict[str, str]]:
    """The Pareto front, by memory ascending; with a limit, whether each point fits under it."""
    size = size or SizeUnit.for_sizes(c.memory_bytes for c in front)
    rows = []
    for c in front:
        row = {
            "point": c.label,
            "ckpt layers": c.layers_checkpointed or "-",
            "reserved": size(c.reserved_bytes),
            "needed": size(c.memory_bytes),
            "allocated": size(c.peak_allocated_bytes),
            "tok/s": f"{c.tokens_per_s:,.0f}",
        }
        if limit_bytes is not None:
            row["fits"] = "yes" if c.fits(limit_bytes) else "no"
        rows.append(row)
    return rows


def pareto_columns(*, with_budget: bool, needed: bool = True) -> tuple[Column, ...]:
    """The front's columns: 'fits' only with a budget, 'needed' only when a CUDA context is counted."""
    cols = PARETO_COLUMNS if with_budget else PARETO_COLUMNS[:-1]
    return _needed_if(cols, needed)


def _needed_if(columns: tuple[Column, ...], shown: bool) -> tuple[Column, ...]:
    """Without a CUDA context 'needed' equals 'reserved': one column, one figure."""
    return columns if shown else tuple(c for c in columns if c.name != "needed")


def _counted(cands: list[RecommendCandidate]) -> bool:
    return any(c.context_bytes for c in cands)


def notes(rec: Recommendation) -> list[str]:
    """Caveats worth a line: flagged points, points that did not run."""
    lines = []
    for c in [rec.best, *rec.runners_up]:
        if c is not None and c.notes:
            lines.append(f"(!) {c.label}: {'; '.join(c.notes)}")
    if rec.within_noise:
        names = ", ".join(c.label for c in rec.within_noise)
        lines.append(
            "Within the step-time spread of the best point (treat as equally fast; "
            f"measure longer to separate): {names}."
        )
    if rec.other_training:
        allow = ",".join(rec.other_training_allow)
        lines.append(f"Not considered: {', '.join(rec.other_training)} train something other than full "
                     f"fine-tuning (--allow {allow} includes them).")
    if rec.skipped_statuses:
        counts = ", ".join(f"{n} {status}" for status, n in rec.skipped_statuses.items())
        lines.append(f"Not considered ({counts}): only points that finished ok are candidates.")
    return lines


def _all(rec: Recommendation) -> list[RecommendCandidate]:
    return [c for c in (rec.best, *rec.runners_up, rec.smallest, *rec.no_fit_layouts) if c is not None]


def _front_axis(rec: Recommendation) -> str:
    """What the front's memory axis is: 'needed memory' when a CUDA context is counted, else 'peak reserved'."""
    return "needed memory" if any(c.context_bytes for c in rec.pareto) else "peak reserved memory"


def rich_recommendation(rec: Recommendation) -> Group:
    """Both tables (fitted to the terminal), the sentence of why and the notes."""
    choices = choice_rows(rec)
    parts: list[FitTable | Text] = [
        FitTable(choices, _needed_if(CHOICE_COLUMNS, _counted(_all(rec))), title=f"{rec.run_name}: {heading(rec)}",
                 title_justify="left",
                 caption=MEASURED_CAPTION + (" (needed: peak reserved + CUDA context)" if _counted(_all(rec)) else ""),
                 styles=[_STYLE.get(r["role"]) for r in choices], complete_hint="--format json has every field"),
        Text(rec.why),
        FitTable(pareto_rows(rec.pareto, limit_bytes=rec.limit_bytes, size=rec.size),
                 _needed_if(PARETO_COLUMNS, _counted(rec.pareto)),
                 title=f"Pareto front ({_front_axis(rec)} vs tokens/s)", title_justify="left",
                 complete_hint="--format json has every field"),
    ]
    parts += [Text(line, style="yellow") for line in notes(rec)]
    return Group(*parts)


def markdown_recommendation(rec: Recommendation, *, level: int = 2) -> str:
    """The same content as Markdown (for report.md)."""
    h = "#" * level
    out = [f"{h} Recommendation\n", f"{heading(rec)}.\n", f"**{rec.why}**\n"]
    out.append(markdown_of(choice_rows(rec), _needed_if(CHOICE_COLUMNS, _counted(_all(rec)))))
    out += [f"{line}\n" for line in notes(rec)]
    return "\n".join(out)


def markdown_pareto(
    front: list[RecommendCandidate], *, limit_bytes: int | None = None, level: int = 2, size: SizeUnit | None = None
) -> str:
    """The Pareto front as a Markdown section."""
    axis = "memory needed (peak reserved + CUDA context)" if _counted(front) else "peak reserved memory"
    head = (
        f"{'#' * level} Pareto front\n\n"
        f"Points that no other point beats on both {axis} and tokens/s, by memory. Every column is measured.\n\n"
    )
    columns = pareto_columns(with_budget=limit_bytes is not None, needed=_counted(front))
    return head + markdown_of(pareto_rows(front, limit_bytes=limit_bytes, size=size), columns)
