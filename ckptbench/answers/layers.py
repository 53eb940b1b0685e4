"""Claims 1-4 and 7: how many layers to checkpoint, which, and how finely (pure; the list is answers/claims.py).

Each function reads the measured points through a :class:`Context` and returns an :class:`Answer`;
thresholds are named constants so that a test can flip each verdict with a hand-built run.
Memory is peak reserved (what must fit on the card) unless a text says allocated.
"""

from __future__ import annotations

from ckptbench.answers.evidence import Cite
from ckptbench.answers.predictions import Pred
from ckptbench.answers.process import oom_process_note
from ckptbench.answers.verdicts import STAGE_LAYOUT_FIT, Answer, Context, Part, Pending, Verdict, gib, pct, times, tok

MATERIAL_SHARE = 0.25  # a partial layout saving this share of all's saving has made memory drop
MOST_OF_SAVING = 0.75  # "drops a lot": most of what checkpointing every layer saves
SAVES_MORE = 0.01  # finer wrapping "saves more" only by more than 1% of the whole-layer peak
TWICE = 1.8  # a step-time ratio this high counts as "twice as slow"


def partials(ctx: Context, batch: int) -> list[Cite]:
    """Whole-layer layouts at this batch that checkpoint some layers but not all, and ran."""
    cell = ctx.series.get(batch)
    if cell is None:
        return []
    layouts = dict.fromkeys(p.layout for s in cell.series for p in s.points if 0 < p.k < cell.num_layers)
    found = (ctx.ev.ok(layout, batch) for layout in layouts)
    return [c for c in found if c is not None]


def share_of_all(none: Cite, full: Cite, part: Cite) -> float:
    """The part of all's saving (over none) that this layout achieves."""
    saving = none.mem - full.mem
    return (none.mem - part.mem) / saving if saving > 0 else 0.0


def _layout(c: Cite | Pred) -> str:
    return str(c.key["layout"])


def every_layer_or_nothing(ctx: Context) -> Answer:
    """Claim 1: Checkpoint every layer; anything less is why memory does not drop."""
    parts = [p for b in sorted(ctx.series) if (p := _every_layer_or_nothing_at(ctx, b)) is not None]
    return Answer(1, "Checkpoint every layer (gradient_checkpointing_enable()); anything less is why memory "
                  "does not drop.", tuple(parts), notes=oom_notes(ctx))


def oom_notes(ctx: Context) -> tuple[str, ...]:
    """For each plain none of the scope that ran out of memory: does that depend on the process? (predicted)"""
    notes = []
    for b in sorted(ctx.series):
        none = ctx.ev.find("none", b)
        if none is not None and (note := oom_process_note(ctx.ev, ctx.pr, none, ctx.predicted("none", b))):
            notes.append(note)
    return tuple(notes)


def _every_layer_or_nothing_at(ctx: Context, b: int) -> Part | None:
    full, none, some = ctx.ev.ok("all", b), ctx.ev.find("none", b), partials(ctx, b)
    if full is None or not some or none is None:
        return None
    if none.ok:
        ranked = sorted(some, key=lambda c: (-share_of_all(none, full, c), c.label))
        top, share = ranked[0], share_of_all(none, full, ranked[0])
        shares = ", ".join(f"{_layout(c)} {pct(share_of_all(none, full, c))}" for c in ranked)
        text = (f"At batch {b}, {_layout(top)} ({top.record.num_checkpointed} of {ctx.ev.scope.num_layers} layers) "
                f"gets {pct(share)} of all's saving: none {gib(none.mem)}, {_layout(top)} {gib(top.mem)}, all "
                f"{gib(full.mem)}. Share of all's saving per partial layout: {shares}.")
        short = f"b={b}: {_layout(top)} gets {pct(share)} of all's saving"
        verdict = Verdict.FAILS if share >= MATERIAL_SHARE else Verdict.HOLDS
        return Part(f"batch {b}", verdict, text, short, (none, full, *ranked))
    fits = [c for c in some if c.fits(ctx.limit)]
    runs = ", ".join(f"{_layout(c)} runs at {gib(c.mem)}" for c in some)
    fit_text = ", ".join(_layout(c) for c in fits) + " fit" if fits else "none of these partial layouts fits"
    text = (f"At batch {b}, none does not run ({none.record.status.upper()}) while {runs}; all peaks at "
            f"{gib(full.mem)}. Under the {gib(ctx.limit)} limit {fit_text}.")
    found = None if fits else ctx.pr.search_named(ctx.ev.scope, f"fewest first:k b={b}", ctx.limit)
    preds: tuple[Pred, ...] = ()
    if found is not None:
        text += (f" The fewest first:k that fit: {_layout(found.at)}, {found.value} of {ctx.ev.scope.num_layers} "
                 f"layers, needs {found.at.gib()}"
                 + (f" and {_layout(found.beyond)} {found.beyond.gib()}" if found.beyond is not None else "") + ".")
        preds = tuple(p for p in (found.at, found.beyond) if p is not None)
    pend = () if fits or found is not None else (
        Pending(STAGE_LAYOUT_FIT, f"the fewest first:k that fit at batch {b}"),)
    short = f"b={b}: none {none.record.status.upper()}, partial layouts run"
    if found is not None:
        short += f"; {_layout(found.at)} fits (predicted)"
    return Part(f"batch {b}", Verdict.FAILS, text, short, (none, full, *some), pend, predicted=preds)


def every_fourth_layer(ctx: Context) -> Answer:
    """Claim 2: Checkpoint every 4th layer; checkpointing all is slower for nothing."""
    parts = []
    for b in sorted(ctx.series):
        e4, full, none = ctx.ev.find("every:4", b), ctx.ev.ok("all", b), ctx.ev.find("none", b)
        if e4 is None or full is None:
            continue
        if e4.fits(ctx.limit):
            gain = e4.tps / full.tps - 1
            extra = (f" But none fits too ({gib(none.mem)}, {tok(none)}): at batch {b} checkpointing anything "
                     "costs speed for nothing." if none is not None and none.fits(ctx.limit) else "")
            text = (f"At batch {b}, every:4 fits ({gib(e4.mem)}) and runs {pct(gain)} faster than all "
                    f"({tok(e4)} vs {tok(full)}).{extra}")
            parts.append(Part(f"batch {b}", Verdict.HOLDS, text, f"b={b}: every:4 fits, {pct(gain)} faster than all",
                              tuple(c for c in (e4, full, none) if c),
                              condition=f"every:4 fits (batch {b}: {gib(e4.mem)})"))
        else:
            need = f"needs {gib(e4.mem)}" if e4.ok else f"is {e4.record.status.upper()}"
            text = (f"At batch {b}, every:4 {need}, over the {gib(ctx.limit)} limit; all fits at {gib(full.mem)}: "
                    "there checkpointing more layers is what makes the step fit.")
            parts.append(Part(f"batch {b}", Verdict.FAILS, text, f"b={b}: every:4 {need}", (e4, full)))
    return Answer(2, "Checkpoint every 4th layer; checkpointing all is slower for nothing.", tuple(parts))


def every_second_or_second_half(ctx: Context) -> Answer:
    """Claim 3: Checkpoint every 2nd layer, or only the second half; all 'reclaims memory badly'."""
    parts = []
    for b in sorted(ctx.series):
        full = ctx.ev.ok("all", b)
        alts = [c for c in (ctx.ev.find("every:2", b), ctx.ev.find("last:16", b)) if c is not None]
        if full is None or not alts:
            continue
        better = [c for c in alts if c.ok and c.mem < full.mem]
        cache = ", ".join(f"{_layout(c)} {gib(c.mem - c.alloc)}" for c in (full, *alts) if c.ok)
        others = ", ".join(f"{_layout(c)} {c.gib()}" for c in alts)
        text = (f"At batch {b}, all peaks at {gib(full.mem)} reserved; {others}. Reserved above allocated "
                f"(the allocator's cache): {cache}.")
        lowest = "an alternative is lower" if better else "all is lowest"
        parts.append(Part(f"batch {b}", Verdict.HOLDS if better else Verdict.FAILS, text,
                          f"b={b}: {lowest} ({gib(full.mem)} vs {others})", (full, *alts)))
    return Answer(3, "Checkpoint every 2nd layer, or only the second half; checkpointing every layer "
                  "\"reclaims memory badly\".", tuple(parts))


def first_half_only(ctx: Context) -> Answer:
    """Claim 4: Checkpoint only layers 1-16 (first:16) and leave the last 16: memory drops a lot."""
    parts = [p for b in sorted(ctx.series) if (p := _first_half_only_at(ctx, b)) is not None]
    return Answer(4, "Checkpoint only layers 1-16 and leave the last 16: memory drops a lot.", tuple(parts))


def _first_half_only_at(ctx: Context, b: int) -> Part | None:
    f16, none, full, l16 = (ctx.ev.find(x, b) for x in ("first:16", "none", "all", "last:16"))
    if f16 is None or not f16.ok or none is None:
        return None
    tail = f" The second half instead (last:16): {gib(l16.mem)}." if l16 is not None and l16.ok else ""
    cites = tuple(c for c in (none, f16, full, l16) if c)
    if not none.ok:
        text = f"At batch {b}, none does not run ({none.record.status.upper()}); first:16 runs at {gib(f16.mem)}."
        return Part(f"batch {b}", Verdict.HOLDS, text + tail, f"b={b}: none {none.record.status.upper()}, "
                    f"first:16 {gib(f16.mem)}", cites)
    if full is None or not full.ok:
        return None
    share, drop = share_of_all(none, full, f16), none.mem - f16.mem
    text = (f"At batch {b}, first:16 goes from {gib(none.mem)} to {gib(f16.mem)} (-{gib(drop)}, "
            f"{pct(drop / none.mem)} of the peak): {pct(share)} of what all saves ({gib(none.mem - full.mem)}).")
    short = f"b={b}: -{gib(drop)} ({pct(share)} of all's saving)"
    return Part(f"batch {b}", Verdict.HOLDS if share >= MOST_OF_SAVING else Verdict.FAILS, text + tail, short, cites)


def attention_and_mlp_apart(ctx: Context) -> Answer:
    """Claim 7: Wrap attention and MLP separately (finer granularity) to save more; expect 2x slower.

    "Saves more" is judged on peak allocated (the tensors) and on peak reserved (what must fit) both; where
    they disagree the part holds only when memory is counted the way it says so, and says it."""
    parts = []
    for b in sorted(ctx.series):
        fine, full = ctx.ev.ok("all@attn+mlp", b), ctx.ev.ok("all", b)
        if fine is not None and full is not None:
            parts.append(_saves_more(ctx, b, fine, full))
    for b in sorted(ctx.series):
        fine, none = ctx.ev.ok("all@attn+mlp", b), ctx.ev.ok("none", b)
        if fine is None or none is None:
            continue
        ratio = fine.step_s / none.step_s
        text = (f"At batch {b}, all@attn+mlp takes {fine.step_s * 1e3:.1f} ms per step, none "
                f"{none.step_s * 1e3:.1f} ms: {times(ratio)}.")
        parts.append(Part(f"2x slower at batch {b}", Verdict.HOLDS if ratio >= TWICE else Verdict.FAILS, text,
                          f"b={b}: {times(ratio)} the step time", (fine, none)))
    return Answer(7, "Wrap attention and MLP separately (finer granularity) to save more; expect 2x slower.",
                  tuple(parts))


def _saves_more(ctx: Context, b: int, fine: Cite, full: Cite) -> Part:
    more_res = fine.mem < full.mem * (1 - SAVES_MORE)
    more_alloc = fine.alloc < full.alloc * (1 - SAVES_MORE)
    others = [c for c in (ctx.ev.ok("all@attn", b), ctx.ev.ok("all@mlp", b)) if c]
    d_res, d_alloc = fine.mem - full.mem, fine.alloc - full.alloc
    text = (f"At batch {b}, all@attn+mlp peaks at {gib(fine.mem)} reserved and {gib(fine.alloc)} allocated, whole "
            f"layers (all) at {gib(full.mem)} and {gib(full.alloc)}: {_signed(d_res)} reserved, {_signed(d_alloc)} "
            "allocated" + "".join(f"; {_layout(c)} {gib(c.mem)} reserved, {gib(c.alloc)} allocated" for c in others)
            + ".")
    short = f"b={b}: {gib(fine.mem)} vs all {gib(full.mem)} reserved"
    if more_res != more_alloc:
        counted, other = ("allocated", "reserved") if more_alloc else ("reserved", "allocated")
        text += (f" Allocated and reserved disagree: it saves more than {pct(SAVES_MORE)} counted as {counted} "
                 f"memory, not as {other} (the allocator's cache: {gib(fine.mem - fine.alloc)} vs "
                 f"{gib(full.mem - full.alloc)}).")
        return Part(f"saves more at batch {b}", Verdict.ONLY_WHEN, text, short + f" ({counted} only)",
                    (fine, full, *others), condition=f"memory is counted as {counted} (batch {b})")
    if (d_res < 0) != (d_alloc < 0) and d_res != 0 and d_alloc != 0:
        lower, higher = ("allocated", "reserved") if d_alloc < 0 else ("reserved", "allocated")
        text += (f" Allocated and reserved disagree in direction: lower {lower}, higher {higher} (the allocator's "
                 f"cache: {gib(fine.mem - fine.alloc)} vs {gib(full.mem - full.alloc)}); neither saves more than "
                 f"{pct(SAVES_MORE)}.")
        short += f", {gib(fine.alloc)} vs {gib(full.alloc)} allocated (disagree in direction)"
    else:
        text += (f" Allocated and reserved agree: {'it saves' if more_res else 'neither saves'} more than "
                 f"{pct(SAVES_MORE)}" + (" either way." if more_res else "."))
    return Part(f"saves more at batch {b}", Verdict.HOLDS if more_res else Verdict.FAILS, text, short,
                (fine, full, *others))


def _signed(n: float) -> str:
    return f"{'+' if n > 0 else '-' if n < 0 else ''}{gib(abs(n))}"
