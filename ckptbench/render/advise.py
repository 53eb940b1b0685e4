"""Rendering of `ckptbench advise`: tables that fit the terminal, Markdown, JSON (no estimating here)."""

from __future__ import annotations

import json
from collections.abc import Iterator

from rich.console import Group, RenderableType
from rich.text import Text

from ckptbench.advise.record import Advice, Option, Table, advice_json, gib
from ckptbench.advise.verdict import ALLOCATED_ONLY
from ckptbench.render.tables import Column, FitTable, markdown_of

# The verdict columns (setup, needed, fits) are always shown; at 80 columns the others give way, the least
# important first (the highest priority number).
COLUMNS = [
    Column("setup"), Column("needed", numeric=True, keep=1), Column("fits", keep=2),
    Column("margin", priority=1, numeric=True),
    Column("step s", priority=2, numeric=True), Column("tok/s", priority=3, numeric=True),
    Column("reserved", priority=4, numeric=True), Column("context", priority=5, numeric=True),
]


def _row(o: Option) -> dict[str, str]:
    r, v = o.estimate.reserved, o.verdict
    oom = r is not None and r.oom is not None
    arithmetic = v.label != "predicted"
    timed = o.time is not None and v.fits
    return {
        "setup": o.setup,
        "needed": "OOM" if oom else ("-" if v.needed_bytes is None else gib(v.needed_bytes) + ("*" if arithmetic
                                                                                                else "")),
        "fits": ("tight" if v.tight else "yes") if v.fits else ("?" if not v.predicted else "no"),
        "margin": gib(v.margin_bytes) if v.margin_bytes is not None else "-",
        "reserved": "OOM" if oom else ("-" if arithmetic else gib(r.peak_reserved_bytes if r else None)),
        "context": gib(r.context_bytes if r else None),
        # a setup that does not fit has no step time
        "step s": f"{o.time.step_time_s:.2f}" if timed and o.time else ("?" if v.fits else "-"),
        "tok/s": f"{o.time.tokens_per_s:,.0f}" if timed and o.time else ("?" if v.fits else "-"),
    }


def _title(advice: Advice, t: Table) -> str:
    return f"batch {t.batch}, sequence {t.seq}, {t.precision}: {advice.card.key}, limit {gib(advice.limit.limit_bytes)}"


def _time_label(advice: Advice) -> str:
    labels = {o.time.label for t in advice.tables for o in t.rows if o.time is not None and o.fits}
    if not labels:
        return "step s, tok/s: ? = measure to know"
    return f"step s, tok/s: {'/'.join(sorted(labels))}, only where it fits"


def _caption(advice: Advice, t: Table) -> str:
    context = "measured" if advice.card.measured else "estimated"
    labels = {o.verdict.label for o in t.rows if o.verdict.predicted and o.verdict.label != "predicted"}
    star = ""
    if labels == {ALLOCATED_ONLY}:
        star = "; * allocated peak + context: the allocator is not replayed for this setup"
    elif labels:
        star = "; * by arithmetic or without the allocator's replay (see JSON)"
    acc = "; 'L, m x b': m micro-batches of b accumulated" if t.accumulation else ""
    return (f"needed: reserved raised to its bound + {context} context, predicted; margin: limit less needed; "
            f"{_time_label(advice)}{acc}{star}")


def table(advice: Advice, t: Table) -> FitTable:
    rows = t.rows
    return FitTable([_row(o) for o in rows], COLUMNS, title=_title(advice, t), caption=_caption(advice, t),
                    styles=[None if o.fits else "yellow" for o in rows], title_justify="left")


def _sections(advice: Advice) -> Iterator[tuple[str, list[str]]]:
    """The text after the tables, as (heading, lines)."""
    yield "Answer", advice.answers
    if advice.why and advice.why_option is not None:
        o = advice.why_option
        total = sum(p.bytes for p in advice.why)
        head = f"Why {gib(total)}: {o.setup} at batch {o.point.batch_size}, {o.point.precision}, at its peak"
        lines = [f"  {p.name:<46} {gib(p.bytes):>10}  {p.label}" for p in advice.why]
        if o.estimate.reserved is not None and o.estimate.reserved.oom is not None:
            lines.append("  (the replayed allocator runs out of memory before this peak: no reserved or context "
                         "figure)")
        yield head, lines
    if advice.observed:
        yield "Your figure", advice.observed
    if advice.ways_out and advice.ways_out_for is not None:
        t = advice.ways_out_for
        lines = []
        for w in advice.ways_out:
            v = w.verdict
            if not v.predicted:
                lines.append(f"  {w.what}, {w.where}: unknown: {v.reason()}")
                continue
            fit = "fits" if w.fits else "does not fit"
            lines.append(f"  {w.what}, {w.where}: {fit}: {v.needs() if w.fits else v.reason()} ({v.label})")
        yield f"What does fit at batch {t.batch}, sequence {t.seq} when no layout does", lines
    times = sorted({o.time.source for t in advice.tables for o in t.rows if o.time is not None})
    yield "Step times", (times + _mfu_lines(advice)) or [advice.calibration or "no calibration for this setup"]
    if advice.measure:
        yield "Measure to know", [advice.measure]


def _mfu_lines(advice: Advice) -> list[str]:
    """The implied MFU of each table's timed rows that fit (model FLOPs over the time at the card's dense peak)."""
    lines = []
    for t in advice.tables:
        rows = [f"{o.setup} {o.time.mfu:.0%}" for o in t.rows if o.fits and o.time is not None and o.time.mfu]
        if rows:
            lines.append(f"implied MFU at batch {t.batch}, sequence {t.seq}, {t.precision}: {'; '.join(rows)}")
    return lines


def advise_renderable(advice: Advice) -> RenderableType:
    """Everything, for a rich console: the assumptions, one table per batch and sequence length, the text."""
    parts: list[RenderableType] = [Text(advice.assumptions), Text("")]
    for t in advice.tables:
        parts += [table(advice, t), Text("")]
    for head, lines in _sections(advice):
        parts += [Text(f"{head}:", style="bold"), *(Text(line) for line in lines), Text("")]
    if advice.code is not None:
        c = advice.code
        parts += [Text(f"Code for {advice.code_for}:", style="bold"),
                  Text("transformers / HF Trainer / TRL:"), Text(c.transformers, no_wrap=True), Text(""),
                  Text("plain PyTorch:"), Text(c.pytorch, no_wrap=True), Text(""),
                  Text(f"torchtitan: {c.torchtitan}"), Text(f"Megatron-Core: {c.megatron}")]
        if c.accelerate:
            parts += [Text(""), Text("accelerate (accelerate launch --config_file):"), Text(c.accelerate, no_wrap=True)]
    return Group(*parts)


def advise_markdown(advice: Advice) -> str:
    out = [advice.assumptions, ""]
    for t in advice.tables:
        out += [f"**{_title(advice, t)}**", "", markdown_of([_row(o) for o in t.rows], COLUMNS).rstrip(), "",
                f"_{_caption(advice, t)}_", ""]
    for head, lines in _sections(advice):
        out += [f"**{head}**", "", *(f"- {line.strip()}" for line in lines), ""]
    if advice.code is not None:
        c = advice.code
        out += [f"**Code for {advice.code_for}**", "", "transformers / HF Trainer / TRL:", "", "```python",
                c.transformers, "```", "", "plain PyTorch:", "", "```python", c.pytorch, "```", "",
                f"- torchtitan: {c.torchtitan}", f"- Megatron-Core: {c.megatron}", ""]
        if c.accelerate:
            out += ["accelerate (accelerate launch --config_file):", "", "```yaml", c.accelerate, "```", ""]
    return "\n".join(out)


def advise_json_text(advice: Advice) -> str:
    return json.dumps(advice_json(advice), sort_keys=True, indent=2) + "\n"
