"""The answer's sentences, each computed from the figures it cites (tests/test_advise_sentences.py holds every
comparison to its own numbers).

The comparisons are said in few forms, each carrying both sides: 'needs A, M below/above the L limit',
'needs A, M above B usable' (verdict.py), 'its allocated peak alone would be A, above the card's C', 'R x the
speed of S (T1 vs T2 s/step)', '+P% time vs no checkpointing (T1 vs T2 s/step)', 'O is G above/below the
predicted E'.
"""

from __future__ import annotations

from ckptbench.advise.predictor import MAX_BATCH_SEARCHED
from ckptbench.advise.record import Advice, Option, Table, safer
from ckptbench.advise.verdict import TIGHT_BYTES, gib

TRAINER_WORDS = {
    "amp_bf16": "HF Trainer's bf16=True (amp_bf16: fp32 weights, gradients and AdamW state, bf16 autocast)",
    "bf16": "pure bf16 (bf16 weights, gradients and optimizer state)",
}


def time_words(o: Option) -> str:
    """'5.38 s/step, 3,045 tokens/s (transferred)', or that the time is not known."""
    if o.time is None:
        return "step time: measure to know"
    return f"{o.time.step_time_s:.2f} s/step, {o.time.tokens_per_s:,.0f} tokens/s ({o.time.label})"


def setup_words(o: Option) -> str:
    """'first:24', 'no checkpointing', '8 micro-batches of 1 with gradient accumulation, no checkpointing'."""
    layout = "no checkpointing" if o.layout == "none" else o.layout
    if o.accumulation == 1:
        return layout
    return f"{o.accumulation} micro-batches of {o.point.batch_size} with gradient accumulation, {layout}"


def _speed(faster: Option, slower: Option) -> str:
    """'1.10x the speed of first:24 (4.89 vs 5.38 s/step)' (both have times)."""
    a, b = faster.time, slower.time
    assert a is not None and b is not None
    return (f"{b.step_time_s / a.step_time_s:.2f}x the speed of {setup_words(slower)} "
            f"({a.step_time_s:.2f} vs {b.step_time_s:.2f} s/step)")


def _cost_vs_none(o: Option, none: Option) -> str:
    """'+18% time vs no checkpointing (5.33 vs 4.52 s/step if it fit)', or '' without both times."""
    if o.time is None or none.time is None or o.layout == "none":
        return ""
    a, b = o.time.step_time_s, none.time.step_time_s
    return f", {a / b - 1:+.0%} time vs no checkpointing ({a:.2f} vs {b:.2f} s/step if it fit)"


def _tight(o: Option) -> str:
    """' Tight: less than 1.00 GiB to spare; next safer: first:25 (...).' for a tight choice, else ''."""
    if not o.verdict.tight:
        return ""
    nxt = safer(o)
    return (f" Tight: less than {gib(TIGHT_BYTES)} to spare"
            f"{f'; next safer: {nxt}' if nxt else '; a stray buffer can break it'}.")


def _non_monotone(o: Option) -> str:
    """Where a smaller, isolated count fits too: the count that breaks it, said once."""
    scan = o.scan
    if scan is None or scan.isolated is None or scan.robust is None:
        return ""
    isolated, robust = scan.isolated, scan.robust
    order = scan.order
    between = order[order.index(robust) + 1: order.index(isolated)]
    broken = next((c for c in between if not scan.fits(c)), None)
    text = f" {scan.layout(isolated)} fits too ({scan.verdicts[isolated - 1].needs()})"
    if broken is not None:
        text += f", but {scan.layout(broken)} does not ({scan.verdicts[broken - 1].reason()})"
    return (text + f": near the limit the caching allocator makes fitting non-monotone, so {scan.layout(robust)}, "
            f"which one more layer cannot break, is the {scan.family} row.")


def head(t: Table) -> str:
    return f"Batch {t.batch}, sequence {t.seq}, {t.precision}"


def table_answer(t: Table) -> str:
    """The sentences of one batch: the setup to use, its margin and time, the fewest layers at the batch itself."""
    none, h = t.none, head(t)
    if not none.verdict.predicted:
        return f"{h}: {none.verdict.reason()}; nothing was predicted for this setup."
    if none.fits:
        return (f"{h}: do not checkpoint: no checkpointing {none.verdict.needs()} (predicted); "
                f"{time_words(none)}.{_tight(none)}")
    if t.stuck:
        all_ = next(o for o in t.options if o.family == "all")
        acc = " or as accumulated micro-batches" if t.batch > 1 else ""
        return (f"{h}: nothing fits the {gib(all_.verdict.limit.limit_bytes)} limit at this batch{acc}, not even "
                f"every layer checkpointed (all: {all_.verdict.reason()}); see the ways out after the tables.")
    choice = t.choice
    assert choice is not None
    text = f"{h}: no checkpointing does not fit ({none.verdict.reason()})."
    lead = "Fastest that fits" if choice.time is not None else "Fits (step times: measure to know)"
    text += f" {lead}: {setup_words(choice)}: {choice.verdict.needs()}; {time_words(choice)}"
    fewest = t.fewest
    if fewest is not None and fewest is not choice and fewest.time is not None and choice.time is not None:
        text += f"; {_speed(choice, fewest)}"
    text += f".{_tight(choice)}"
    if fewest is not None and fewest is not choice:
        text += (f" Fewest layers at batch {t.batch} itself: {fewest.layout}: {fewest.verdict.needs()}; "
                 f"{time_words(fewest)}{_cost_vs_none(fewest, none)}.{_tight(fewest)}")
    elif fewest is None:
        text += f" At batch {t.batch} itself no layout fits."
    # Each family whose fitting is not monotone in its count, said once (its row is the count that holds).
    return text + "".join(_non_monotone(o) for o in t.options if o.scan is not None)


def _summary(t: Table) -> str:
    """One clause of a batch in another precision."""
    none = t.none
    if not none.verdict.predicted:
        return f"batch {t.batch}: {none.verdict.reason()}"
    if none.fits:
        return f"batch {t.batch}: no checkpointing fits ({none.verdict.needs()})"
    if t.fewest is not None:
        return f"batch {t.batch}: the fewest layers that fit are {t.fewest.layout} ({t.fewest.verdict.needs()})"
    all_ = next(o for o in t.options if o.family == "all")
    return f"batch {t.batch}: nothing fits at this batch, not even all ({all_.verdict.reason()})"


def also_sentence(also: list[Table]) -> str:
    """The one sentence for the second precision (without --precision: HF Trainer's bf16=True)."""
    precision = also[0].precision
    seqs = sorted({t.seq for t in also})
    clauses = "; ".join((f"sequence {t.seq}, " if len(seqs) > 1 else "") + _summary(t) for t in also)
    return (f"With {TRAINER_WORDS.get(precision, precision)} instead: {clauses} (predicted; ask with --precision "
            f"{precision} for its rows, accumulation and ways out).")


def largest_sentences(advice: Advice) -> list[str]:
    out = []
    for seq, (batch, _, verdict) in advice.largest.items():
        size = f"{batch} or more (the largest searched)" if batch >= MAX_BATCH_SEARCHED else str(batch)
        out.append(f"Largest batch that fits with every layer checkpointed (all) at sequence {seq}, "
                   f"{advice.request.answered_precision}: {size} ({verdict.needs()}).")
    return out


def answers(advice: Advice) -> list[str]:
    out = [table_answer(t) for t in advice.tables]
    if advice.also:
        out.append(also_sentence(advice.also))
    return out + largest_sentences(advice)
