"""docs/answers.md: every claim's verdict with its numbers, the points and runs they come from (Markdown).

Deterministic: the same runs give the same bytes (no clock, no absolute paths; runs are named as given).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ckptbench.answers.claims import Answers
from ckptbench.answers.evidence import Cite
from ckptbench.answers.predictions import Pred
from ckptbench.answers.ranges import CardRow, saving_per_layer
from ckptbench.answers.verdicts import Answer, Verdict
from ckptbench.config.files import read_bounded_text
from ckptbench.errors import ResultsError
from ckptbench.render.answers_text import TITLES, intro, predictions_section, transfer_section
from ckptbench.render.layer_report import interval_table, ordering_table, split_table
from ckptbench.render.tables import markdown_table
from ckptbench.results.store import write_text_atomic
from ckptbench.units import fmt_bytes

PLOT_FILE = "answers-layers.png"
VERDICT_COLUMNS = ("#", "claim", "verdict", "deciding numbers")
CITE_COLUMNS = ("point", "run", "allocated", "reserved", "step ms", "tok/s", "status")
PRED_COLUMNS = ("point", "allocated (predicted)", "reserved bound (predicted)", "fits the limit", "step ms (fitted)",
                "tok/s (fitted)", "fit's error bound")
CARD_COLUMNS = ("batch", "fewest layers that fit", "fastest that fits", "closest over the limit",
                "fewest first:k that fit", "waits for")


def verdict_text(a: Answer) -> str:
    """'does not hold', 'holds only when every:4 fits ...', plus '(predicted)' or '(partly predicted)' where it
    rests on predictions, and '(partly open)' where a part waits for a run."""
    text = a.verdict.value + (f" {a.condition}" if a.verdict is Verdict.ONLY_WHEN else "")
    notes = [a.basis] if a.verdict is not Verdict.OPEN and a.basis != "measured" else []
    notes += ["partly open"] if a.partly_open and a.verdict is not Verdict.OPEN else []
    return text + (f" ({', '.join(notes)})" if notes else "")


def verdict_table(answers: Answers, *, link: str = "") -> str:
    """The short table: one row per claim, linking to its section in ``link`` (this page when empty)."""
    rows = [
        {"#": f"[{a.number}]({link}#{anchor(a)})", "claim": TITLES[a.number - 1],
         "verdict": f"**{verdict_text(a)}**", "deciding numbers": a.summary or "-"}
        for a in answers.answers
    ]
    return markdown_table(rows, VERDICT_COLUMNS, right=())


def anchor(a: Answer) -> str:
    """GitHub's heading anchor of the claim's section ('## 3. Checkpoint ...' -> '3-checkpoint-...')."""
    text = f"{a.number}. {TITLES[a.number - 1]}".lower()
    kept = "".join(ch for ch in text if ch.isalnum() or ch in " -_")
    return kept.replace(" ", "-")


def _cite_row(c: Cite) -> dict[str, str]:
    r = c.record
    return {
        "point": c.label, "run": c.run, "allocated": fmt_bytes(r.peak_allocated_bytes) if c.ok else "-",
        "reserved": fmt_bytes(c.mem) if c.ok else "-",
        "step ms": f"{c.step_s * 1e3:.1f}" if c.ok else "-", "tok/s": f"{c.tps:,.0f}" if c.ok else "-",
        "status": r.status,
    }


def _pred_row(p: Pred, limit_bytes: int) -> dict[str, str]:
    point, t = p.point, p.time
    if not p.known:
        fits = "not estimated"
    else:
        fits = "yes" if p.fits(limit_bytes) else ("no: OOM" if point.oom is not None else "no")
    bound = t.error_bound if t is not None else None
    return {
        "point": p.label,
        "allocated (predicted)": fmt_bytes(point.peak_allocated_bytes) if p.known else "-",
        "reserved bound (predicted)": fmt_bytes(p.mem) if p.ok and point.peak_reserved_bytes is not None else
        ("OOM" if point.oom is not None else "-"),
        "fits the limit": fits,
        "step ms (fitted)": f"{t.step_time_s * 1e3:.1f}" if t is not None else "-",
        "tok/s (fitted)": f"{t.tokens_per_s:,.0f}" if t is not None else "-",
        "fit's error bound": f"{bound:.1%}" if bound is not None else "-",
    }


def predicted_table(points: tuple[Pred, ...], limit_bytes: int) -> str:
    """The predicted points a claim rests on: memory predicted by the estimator, step times fitted."""
    return markdown_table([_pred_row(p, limit_bytes) for p in points], PRED_COLUMNS,
                          right={"allocated (predicted)", "reserved bound (predicted)", "step ms (fitted)",
                                 "tok/s (fitted)", "fit's error bound"})


def claim_section(a: Answer, *, limit_bytes: int = 0) -> str:
    lines = [f"## {a.number}. {TITLES[a.number - 1]}\n", f"> {a.claim}\n", f"**Verdict: {verdict_text(a)}.**\n"]
    lines += [f"- **{p.label}**: {p.verdict.value}. {p.text}" for p in a.parts]
    lines.append("")
    lines += [f"*{e}*\n" for e in a.estimates]
    lines += [f"Note: {n}\n" for n in a.notes]
    if a.pending:
        waits = "; ".join(dict.fromkeys(f"`{p.stage}` ({p.what})" for p in a.pending))
        lines.append(f"Waits for: {waits}.\n")
    if a.cites:
        lines.append(markdown_table([_cite_row(c) for c in a.cites], CITE_COLUMNS,
                                    right={"allocated", "reserved", "step ms", "tok/s"}))
    if a.predicted:
        lines.append("Predicted, not measured (memory: the estimator; step time: the time model fitted to the runs; "
                     "see [Predictions](#predictions-and-fitted-step-times)):\n")
        lines.append(predicted_table(a.predicted, limit_bytes))
    return "\n".join(lines)


def _card_row(row: CardRow) -> dict[str, str]:
    def point(c: Cite | None) -> str:
        if c is None:
            return "-"
        return f"{c.key['layout']} ({c.record.num_checkpointed or 0} layers), {fmt_bytes(c.mem)}"

    est = "-"
    if row.predicted is not None:
        at, beyond = row.predicted.at, row.predicted.beyond
        est = (f"{at.key['layout']}, {at.gib()}" + (f", {at.tps:,.0f} tok/s (fitted)" if at.tps else "")
               + (f"; {beyond.key['layout']} {beyond.gib()}" if beyond is not None else ""))
    elif row.estimate_k is not None and row.over is not None and row.fewest is not None:
        est = (f"first:{row.estimate_k} (estimate: {fmt_bytes(saving_per_layer(row.over, row.fewest))} saved per "
               f"layer between {row.over.key['layout']} and {row.fewest.key['layout']})")
    return {
        "batch": str(row.batch_size), "fewest layers that fit": point(row.fewest),
        "fastest that fits": f"{row.fastest.label}, {row.fastest.tps:,.0f} tok/s" if row.fastest else "-",
        "closest over the limit": point(row.over), "fewest first:k that fit": est,
        "waits for": ", ".join(f"`{p.stage}`" for p in row.pending) or "-",
    }


def card_section(answers: Answers) -> str:
    lines = ["## How many layers should I checkpoint on an 80 GB card?\n",
             f"{answers.budget.describe()}; {answers.scope.model}, seq {answers.scope.seq_len}, "
             f"{answers.scope.precision}, the runs' optimizer. Measured whole-layer layouts; where no measured layout "
             "settles the fewest layers that fit, the fewest first:k is found by prediction (labelled).\n"]
    for row in answers.card:
        if row.fewest is not None and (row.fewest.record.num_checkpointed or 0) == 0:
            lines.append(f"- Batch {row.batch_size}: nothing needs checkpointing; none peaks at "
                         f"{fmt_bytes(row.fewest.mem)} reserved, and every checkpointed "
                         "layout only costs speed (claim 13).")
        elif row.predicted is not None:
            at = row.predicted.at
            speed = f", {at.tps:,.0f} tok/s (fitted)" if at.tps else ""
            fastest = (f"; the fastest measured point that fits is {row.fastest.short}, {row.fastest.tps:,.0f} tok/s"
                       if row.fastest is not None else "")
            lines.append(f"- Batch {row.batch_size}: the fewest first:k that fit checkpoint {row.predicted.value} of "
                         f"{answers.scope.num_layers} layers: {at.key['layout']} needs {at.gib()}{speed}{fastest} "
                         "(measured).")
    lines.append("")
    lines.append(markdown_table([_card_row(r) for r in answers.card], CARD_COLUMNS, right=()))
    return "\n".join(lines)


def waits_section(answers: Answers) -> str:
    pending = answers.pending
    if not pending:
        return "## Waiting for the GPU campaign\n\nNothing: every claim is settled by the committed runs.\n"
    lines = ["## Waiting for the GPU campaign\n",
             "Stages of `scripts/gpu_check.sh` whose runs are not committed yet, and what each settles:\n"]
    for stage, items in pending.items():
        what = "; ".join(dict.fromkeys(f"claim {n}: {p.what}" if n else f"bottom line: {p.what}" for n, p in items))
        lines.append(f"- `{stage}`: {what}")
    return "\n".join(lines) + "\n"


def runs_section(answers: Answers) -> str:
    rows = []
    for run in answers.runs:
        env = run.environment
        rows.append({"run": str(run.path), "GPU": str(env.gpu_name or env.device_type or "-"),
                     "torch": str(env.torch or "-"), "created": str(run.meta.created_at or "-"),
                     "points": str(len(run.points))})
    return "## Runs\n\n" + markdown_table(rows, ("run", "GPU", "torch", "created", "points"), right={"points"})


README_BEGIN = "<!-- answers:begin (generated by ckptbench answers; do not edit) -->"
README_END = "<!-- answers:end -->"


def readme_block(answers: Answers, *, link: str) -> str:
    """The README's verdict table between its markers."""
    return f"{README_BEGIN}\n{verdict_table(answers, link=link)}{README_END}"


def readme_block_bounds(text: str) -> tuple[int, int]:
    """Where the README's verdict table starts and its end marker begins; ResultsError when the markers are missing."""
    start, end = text.find(README_BEGIN), text.find(README_END)
    if start < 0 or end < start:
        raise ResultsError(f"the README has no {README_BEGIN!r} ... {README_END!r} markers")
    return start, end


def replace_readme_block(text: str, block: str) -> str:
    """The README text with its verdict table replaced; ResultsError when the markers are missing."""
    start, end = readme_block_bounds(text)
    return text[:start] + block + text[end + len(README_END):]


DEFAULT_ANSWERS = Path("docs/answers.md")
MAX_README_BYTES = 16 * 2**20  # a README is a few hundred KiB at most; /dev/zero or a FIFO is refused


@dataclass
class Published:
    """What publish_answers made: the Markdown, and the files it wrote (none when printing only)."""

    markdown: str
    files: list[Path]


def publish_answers(answers: Answers, *, out: Path | None, readme: Path | None, command: str) -> Published:
    """Write answers.md and its plot to ``out`` (or only return the Markdown), and the README's table.

    The README is read and checked first, so that nothing is written when its markers are missing.
    """
    new_readme = None
    if readme is not None:  # links relative to the README: to the written file, or to docs/answers.md
        link = os.path.relpath(out or DEFAULT_ANSWERS, readme.resolve().parent)
        text = read_bounded_text(readme, limit_bytes=MAX_README_BYTES, what="a README (Markdown)")
        new_readme = replace_readme_block(text, readme_block(answers, link=link))
    files: list[Path] = []
    if out is None:
        markdown = answers_markdown(answers, command=command, plot_name=None)
    else:
        from ckptbench.plots.layers import plot_layers  # matplotlib only when a plot is written

        out.parent.mkdir(parents=True, exist_ok=True)
        plot = plot_layers(list(answers.series.values()), out.parent / PLOT_FILE, title=answers.scope.model,
                           limit_bytes=answers.budget.limit_bytes)
        markdown = answers_markdown(answers, command=command, plot_name=plot.name)
        write_text_atomic(out, markdown)
        files += [out, plot]
    if readme is not None and new_readme is not None:
        write_text_atomic(readme, new_readme)
        files.append(readme)
    return Published(markdown, files)


def pending_lines(answers: Answers) -> list[str]:
    """One line per stage: which claims wait for it."""
    lines = []
    for stage, items in answers.pending.items():
        names = [f"claim {n}" if n else "the bottom line" for n in sorted({n for n, _ in items})]
        lines.append(f"not settled yet: {', '.join(names)} wait{'s' if len(names) == 1 else ''} for stage {stage}")
    return lines


def answers_markdown(answers: Answers, *, command: str, plot_name: str | None) -> str:
    """The whole document."""
    cells = list(answers.series.values())
    parts = [intro(answers, command), "## Verdicts\n", verdict_table(answers), card_section(answers)]
    parts += [claim_section(a, limit_bytes=answers.budget.limit_bytes) for a in answers.answers]
    parts += ["## Saving and cost per checkpointed layer (measured)\n", interval_table(cells),
              "### Equal number of layers, different layers\n", ordering_table(cells),
              "### Where the memory goes\n", split_table(answers.splits)]
    if plot_name:
        parts.append(f"![Memory and step time against the number of checkpointed layers]({plot_name})\n")
    parts += [predictions_section(answers), transfer_section(answers), waits_section(answers),
              runs_section(answers)]
    return "\n".join(parts)

