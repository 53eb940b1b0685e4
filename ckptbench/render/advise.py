"""Rendering of `ckptbench advise`: tables that fit the terminal, Markdown, JSON (no estimating here)."""

from __future__ import annotations

import json
from collections.abc import Iterator

from rich.console import Group, RenderableType
from rich.text import Text

from ckptbench.advise.record import Advice, Option, Table, advice_json, gib
from ckptbench.render.tables import Column, FitTable, markdown_of

COLUMNS = [
    Column("layout"), Column("reserved", numeric=True), Column("context", priority=2, numeric=True),
    Column("needed", numeric=True), Column("fits"), Column("step s", priority=1, numeric=True),
    Column("tok/s", priority=1, numeric=True),
]


def _row(o: Option) -> dict[str, str]:
    e, r = o.estimate, o.estimate.reserved
    oom = r is not None and r.oom is not None
    return {
        "layout": o.layout,
        "reserved": "OOM" if oom else gib(r.peak_reserved_bytes if r else None),
        "context": gib(r.context_bytes if r else None),
        "needed": "OOM" if oom else gib(e.needed_bytes),
        "fits": "yes" if o.fits else "no",
        "step s": f"{o.time.step_time_s:.2f}" if o.time else "?",
        "tok/s": f"{o.time.tokens_per_s:,.0f}" if o.time else "?",
    }


def _title(advice: Advice, t: Table) -> str:
    return f"batch {t.batch}, sequence {t.seq}: {advice.card.key}, {gib(advice.card.total_bytes)}"


def _time_label(advice: Advice) -> str:
    labels = {o.time.label for t in advice.tables for o in t.options if o.time is not None}
    if not labels:
        return "step s, tok/s: ? = measure to know (no calibration for this setup)"
    return f"step s, tok/s: {'/'.join(sorted(labels))} (see Step times)"


def _caption(advice: Advice) -> str:
    return (f"memory predicted (needed = reserved raised to its bound for the layout's kind, README, + "
            f"{'measured' if advice.card.measured else 'estimated'} context); {_time_label(advice)}")


def table(advice: Advice, t: Table) -> FitTable:
    return FitTable([_row(o) for o in t.options], COLUMNS, title=_title(advice, t), caption=_caption(advice),
                    styles=[None if o.fits else "yellow" for o in t.options], title_justify="left")


def _sections(advice: Advice) -> Iterator[tuple[str, list[str]]]:
    """The text after the tables, as (heading, lines)."""
    yield "Answer", advice.answers
    if advice.why:
        o = advice.why_option
        total = sum(p.bytes for p in advice.why)
        head = f"Why {gib(total)}: {o.layout} at batch {o.estimate.point.batch_size} at its peak" if o else "Why"
        lines = [f"  {p.name:<28} {gib(p.bytes):>10}  {p.label}" for p in advice.why]
        if o is not None and o.estimate.reserved is not None and o.estimate.reserved.oom is not None:
            lines.append("  (the allocator runs out of memory before this peak: no reserved or context figure)")
        yield head, lines
    if advice.observed:
        yield "Your figure", advice.observed
    if advice.ways_out:
        lines = []
        for w in advice.ways_out:
            fit = "fits" if w.fits else "does not fit" if w.fits is False else "unknown"
            lines.append(f"  {w.what}, {w.layout}: needs {gib(w.needed_bytes)}, {fit} ({w.label})")
        yield "What does fit when no layout does", lines
    times = sorted({o.time.source for t in advice.tables for o in t.options if o.time is not None})
    yield "Step times", times or [advice.calibration or "no calibration for this setup"]
    if advice.measure:
        yield "Measure to know", [advice.measure]


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
    return Group(*parts)


def advise_markdown(advice: Advice) -> str:
    out = [advice.assumptions, ""]
    for t in advice.tables:
        out += [f"**{_title(advice, t)}**", "", markdown_of([_row(o) for o in t.options], COLUMNS).rstrip(), "",
                f"_{_caption(advice)}_", ""]
    for head, lines in _sections(advice):
        out += [f"**{head}**", "", *(f"- {line.strip()}" for line in lines), ""]
    if advice.code is not None:
        c = advice.code
        out += [f"**Code for {advice.code_for}**", "", "transformers / HF Trainer / TRL:", "", "```python",
                c.transformers, "```", "", "plain PyTorch:", "", "```python", c.pytorch, "```", "",
                f"- torchtitan: {c.torchtitan}", f"- Megatron-Core: {c.megatron}", ""]
    return "\n".join(out)


def advise_json_text(advice: Advice) -> str:
    return json.dumps(advice_json(advice), sort_keys=True, indent=2) + "\n"
