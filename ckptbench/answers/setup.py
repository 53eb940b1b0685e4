"""Claims 8-14: offloading, batch and sequence length, accumulation, precision and optimizers, speed, ZeRO (pure).

A technique "helps" when it lets a step fit the card that would not fit without it, or runs faster
than the fastest plain point that fits at the same batch; measured in the same run where one run holds
both points, so that two GPU sessions are not compared.
"""

from __future__ import annotations

from ckptbench.answers.evidence import Cite
from ckptbench.answers.predictions import (
    BIG_BATCH,
    OFFLOAD_LAYOUTS,
    SEQS,
    Found,
    Pred,
    fmt_alloc,
    fmt_mem,
    fmt_tok,
)
from ckptbench.answers.ranges import boundary, split
from ckptbench.answers.verdicts import (
    STAGE_BATCH_MAX,
    STAGE_CLAIMS,
    STAGE_SEQ,
    Answer,
    Context,
    Part,
    Pending,
    Verdict,
    gib,
    pct,
    times,
    tok,
)
from ckptbench.config.grid import PointKey

SEVERAL_GB = 3e9  # "saves several GB": at least 3 GB
STATIC_DOMINATES = 0.5  # parameters, gradients and optimizer state at least half of the peak
CANNOT_SAVE_MUCH = 0.25  # the best checkpointing layout saves at most a quarter of the peak
FORTIES_GB = 50e9  # "memory to the 40s of GB": under 50 GB


def _in_scope(ctx: Context, key: PointKey) -> bool:
    s = ctx.ev.scope
    return key.get("model") == s.model and key.get("seq_len") == s.seq_len and key.get("precision") == s.precision


def _helps(ctx: Context, p: Cite) -> tuple[Verdict, str, str]:
    """Does technique point ``p`` fit where nothing plain fits, or beat the fastest plain point that fits?
    Returns the verdict, a sentence and a short phrase."""
    b = int(p.key["batch_size"]) * int(p.key.get("micro_batches", 1))
    plain = ctx.ev.fastest_fitting(b, ctx.limit, prefer_run=p.run)
    if not p.fits(ctx.limit):
        need = f"needs {p.gib()}" if p.ok else f"is {p.gib()}"
        return Verdict.FAILS, f"{p.short} {need}: it does not fit either.", f"{p.short} {need}"
    if plain is None:
        return (Verdict.HOLDS, f"{p.short} fits ({gib(p.mem)}) where no plain point at batch {b} does.",
                f"{p.short} fits where nothing plain does")
    ratio = plain.tps / p.tps
    if ratio >= 1:
        return Verdict.FAILS, (f"{p.short} fits ({gib(p.mem)}, {tok(p)}), but without it {plain.short} fits too "
                               f"({gib(plain.mem)}) and runs {times(ratio)} as fast ({tok(plain)})."), \
            f"{p.short}: {plain.short} fits and is {times(ratio)} as fast"
    return (Verdict.HOLDS, f"{p.short} ({gib(p.mem)}, {tok(p)}) beats the fastest plain point that fits, "
            f"{plain.short} ({tok(plain)}).", f"{p.short} beats {plain.short}")


def activation_offloading(ctx: Context) -> Answer:
    """Claim 8: Add activation offloading (alone or with 4-8 checkpointed layers)."""
    found = ctx.ev.select(lambda k: k.get("offload", "none") != "none" and _in_scope(ctx, k))
    parts = []
    for p in found:
        verdict, text, short = _helps(ctx, p)
        same = ctx.ev.ok(str(p.key["layout"]), int(p.key["batch_size"]), run=p.run)
        if same is not None and p.ok:
            diff = same.mem - p.mem
            text += (f" Against {same.short} without offloading: {gib(abs(diff))} {'less' if diff >= 0 else 'more'} "
                     f"on the GPU, {times(p.step_s / same.step_s)} the step time.")
        host = p.record.host_offload_peak_bytes
        text += f" Pinned host memory: {gib(host)}." if host else ""
        parts.append(Part(p.short, verdict, text, short, (p, *([same] if same else []))))
    if not any(4 <= (p.record.num_checkpointed or 0) <= 8 for p in found):
        preds = [q for lay in OFFLOAD_LAYOUTS if (q := ctx.predicted(lay, BIG_BATCH, offload="all")) and q.known]
        parts += [_offload_predicted(ctx, q) for q in preds]
        if not preds:
            parts.append(Part("with 4-8 checkpointed layers", Verdict.OPEN, "Offloading together with 4-8 "
                              "checkpointed layers is neither measured nor predicted.", "4-8 layers + offload: not "
                              "measured", pending=(Pending(STAGE_CLAIMS, _OFFLOAD_STAGE),)))
    return Answer(8, "Add activation offloading (alone or with 4-8 checkpointed layers).", tuple(parts))


_OFFLOAD_STAGE = "first:8 and every:4 with offload at batch 2 and 8"


def _offload_predicted(ctx: Context, q: Pred) -> Part:
    """A predicted offloaded point with 4-8 checkpointed layers: does it fit where nothing plain fits?"""
    b, layout = int(q.key["batch_size"]), str(q.key["layout"])
    same = ctx.point(layout, b)
    plain = ctx.ev.fastest_fitting(b, ctx.limit)
    fewest = ctx.pr.search_named(ctx.ev.scope, f"fewest first:k b={b}", ctx.limit)
    cites, preds = split(q, same, plain, fewest.at if fewest else None)
    without = f" Without offloading, {same.short} needs {fmt_mem(same)}." if same is not None else ""
    if not q.fits(ctx.limit):
        return Part(q.short, Verdict.FAILS, f"{q.short} needs {q.gib()}: over the {gib(ctx.limit)} limit.{without}",
                    f"{q.short}: {q.gib()}", cites, predicted=preds)
    others = [c for c in (plain, fewest.at if fewest else None) if c is not None]
    if not others:
        return Part(q.short, Verdict.HOLDS, f"{q.short} fits ({q.gib()}) where no plain point at batch {b} does."
                    f"{without}", f"{q.short} fits where nothing plain does (predicted)", cites, predicted=preds)
    alt = "; ".join(f"{c.short} {fmt_mem(c)}, {fmt_tok(c)}" for c in others)
    text = (f"{q.short} fits ({q.gib()}).{without} Checkpointing alone fits batch {b} too ({alt}). "
            f"Whether offloading is faster is a question of step time, which the time model cannot answer for "
            f"offloading ({ctx.pr.why_no_time(q.key)}): measure {q.short}.")
    return Part(q.short, Verdict.OPEN, text, f"{q.short}: {q.gib()}, speed not measured", cites,
                (Pending(STAGE_CLAIMS, f"{q.short} (its step time)"),), predicted=preds)


def static_memory_dominates(ctx: Context) -> Answer:
    """Claim 9: At batch 2 the activations are a small share: optimizer state and gradients dominate."""
    none = ctx.ev.ok("none", 2)
    if none is None or none.record.memory.static_bytes is None:
        return Answer(9, _STATIC_MEMORY_CLAIM, (Part("batch 2", Verdict.OPEN, "none at batch 2 is not measured.", ""),))
    m = none.record.memory
    static, peak = m.static_bytes or 0, none.alloc
    ckpt = [c for lay in ctx.ev.layouts(2) if lay != "none" and (c := ctx.ev.ok(lay, 2, run=none.run))]
    best = min(ckpt, key=lambda c: c.mem, default=None)
    saved = none.mem - best.mem if best else 0
    text = (f"At batch 2, none peaks at {gib(peak)} allocated: parameters {gib(m.params_bytes or 0)}, gradients "
            f"{gib(m.grads_bytes or 0)}, AdamW state {gib(m.optimizer_state_bytes or 0)} ({pct(static / peak)} "
            f"together); the activation part is {gib(peak - static)}. The lowest checkpointed peak, "
            f"{best.short if best else '-'}, saves {gib(saved)} of {gib(none.mem)} reserved ({pct(saved / none.mem)}).")
    big = ctx.series.get(max(ctx.series, default=2))
    if big is not None and big.key.get("batch_size", 2) != 2:
        steps = [i for s in big.series for i in s.intervals]
        if steps:
            top = max(steps, key=lambda i: i.saved_reserved_per_layer)
            text += (f" At batch {big.key['batch_size']} one layer saves up to {gib(top.saved_reserved_per_layer)} "
                     f"({top.layout_from} -> {top.layout_to}): there activations dominate.")
    holds = static / peak >= STATIC_DOMINATES and saved / none.mem <= CANNOT_SAVE_MUCH
    short = f"static {pct(static / peak)} of the peak; checkpointing saves at most {gib(saved)}"
    part = Part("batch 2", Verdict.HOLDS if holds else Verdict.FAILS, text, short, (none, *([best] if best else [])))
    return Answer(9, _STATIC_MEMORY_CLAIM, (part,))


_STATIC_MEMORY_CLAIM = ("At batch 2 the activations are a small share: optimizer state and gradients dominate; "
                        "checkpointing cannot save much.")


def larger_batch_instead(ctx: Context) -> Answer:
    """Claim 10: Raise the batch to 4 (or lower the sequence length to 1024/512 and raise the batch) instead."""
    parts = [_batch_4(ctx)]
    seq = ctx.ev.scope.seq_len
    ref_tokens = 2 * seq
    untimed: list[int] = []
    for s in SEQS:
        largest, smallest = boundary(ctx, "none", seq_len=s)
        found = ctx.pr.search_named(ctx.ev.scope, f"largest batch none s={s}", ctx.limit)
        if largest is not None and int(largest.key["batch_size"]) * s > ref_tokens:
            parts.append(Part(f"seq {s}", Verdict.HOLDS, f"At seq {s}, none fits up to batch "
                              f"{largest.key['batch_size']} ({gib(largest.mem)}, {tok(largest)}).",
                              f"s={s}: batch {largest.key['batch_size']} fits", (largest,)))
        elif smallest is not None and int(smallest.key["batch_size"]) * s <= ref_tokens:
            parts.append(Part(f"seq {s}", Verdict.FAILS, f"At seq {s}, none batch {smallest.key['batch_size']} does "
                              f"not fit ({smallest.gib()}).", f"s={s}: does not fit", (smallest,)))
        elif found is not None:
            parts.append(_seq_predicted(ctx, s, found, ref_tokens))
            # A larger batch that fits raises the question of speed, which only a measurement answers here.
            untimed += [s] if parts[-1].verdict is Verdict.HOLDS and not found.at.tps else []
        else:
            parts.append(Part(f"seq {s}", Verdict.OPEN, f"none at seq {s} with a larger batch is neither measured "
                              "nor predicted.", "", pending=(Pending(STAGE_SEQ, f"none batch_size: max at seq {s}"),)))
    if untimed:
        seqs = " and ".join(map(str, untimed))
        parts.append(Part(f"speed at seq {seqs}", Verdict.OPEN, f"Whether the larger batch at seq {seqs} trains "
                          f"faster (tokens/s) is not predicted: the time model has no measured point at those "
                          f"lengths ({seq} only); measure none at the largest batch that fits.", "",
                          pending=tuple(Pending(STAGE_SEQ, f"none batch_size: max at seq {s}") for s in untimed)))
    return Answer(10, "Raise the batch to 4 (or lower the sequence length to 1024/512 and raise the batch) "
                  "instead.", tuple(parts), notes=("A shorter sequence is a different training: the model no longer "
                                                   "sees contexts as long as before.",))


def _seq_predicted(ctx: Context, s: int, found: Found, ref_tokens: int) -> Part:
    v, at, beyond = found.value, found.at, found.beyond
    more = v * s > ref_tokens
    text = (f"At seq {s}, none fits up to batch {v} ({at.gib()}; {v * s:,} tokens per step against {ref_tokens:,} "
            f"at batch 2 and seq {ctx.ev.scope.seq_len})"
            + (f"; batch {v + 1} needs {beyond.gib()}" if beyond is not None else
               f" (or more: {v} is the largest searched)") + ".")
    preds = tuple(p for p in (at, beyond) if p is not None)
    return Part(f"seq {s}", Verdict.HOLDS if more else Verdict.FAILS, text,
                f"s={s}: batch {v} fits (predicted)" if more else f"s={s}: no larger batch fits (predicted)",
                predicted=preds)


def _batch_4(ctx: Context) -> Part:
    c4, c2, c8 = ctx.point("none", 4), ctx.ev.ok("none", 2), ctx.ev.find("none", 8)
    if c4 is None or not c4.known:
        known = "; ".join(f"none at batch {c.key['batch_size']}: {c.gib()}" for c in (c2, c8) if c)
        return Part("batch 4", Verdict.OPEN, f"none at batch 4 is neither measured nor predicted ({known}).",
                    "b=4: not measured", tuple(c for c in (c2, c8) if c),
                    (Pending(STAGE_BATCH_MAX, "none batch_size: max at seq 2048"),))
    cites, preds = split(c4, c2)
    label = " (predicted)" if isinstance(c4, Pred) else ""
    if c4.fits(ctx.limit):
        gain = f", {pct(c4.tps / c2.tps - 1)} more tokens/s than batch 2 ({fmt_tok(c2)})" if c2 and c4.tps else ""
        return Part("batch 4", Verdict.HOLDS, f"none at batch 4 fits ({fmt_mem(c4)}, {fmt_tok(c4)}{gain}).",
                    f"b=4 fits ({gib(c4.mem)}{label})", cites, predicted=preds)
    return Part("batch 4", Verdict.FAILS, f"none at batch 4 does not fit ({fmt_mem(c4)}).", f"b=4: {c4.gib()}",
                cites, predicted=preds)


def gradient_accumulation(ctx: Context) -> Answer:
    """Claim 11: Use gradient accumulation (batch 1 x 8 steps) instead of a larger batch.

    The claim's case: none (no checkpointing) in 8 micro-batches of 1 against batch 8 in one pass, which does
    not fit without checkpointing: there the choice is accumulation or checkpointing."""
    b = BIG_BATCH
    case, big = ctx.point("none", 1, micro_batches=b), ctx.point("none", b)
    others = [p for p in ctx.ev.select(lambda k: int(k.get("micro_batches", 1)) > 1 and _in_scope(ctx, k))
              if not (p.key["layout"] == "none" and p.key["batch_size"] == 1 and p.key["micro_batches"] == b)]
    notes = tuple(f"Not the claim's case (measured): {_helps(ctx, p)[1]}" for p in others)
    label = f"none, batch 1 x {b}"
    if case is None or not case.known or big is None or not big.known:
        missing = "none at batch 1 x 8 micro-batches" if case is None or not case.known else f"none at batch {b}"
        return Answer(11, _ACCUMULATION_CLAIM, (Part(label, Verdict.OPEN, f"{missing} is neither measured nor "
                      "predicted.", "b=1x8: not measured",
                      pending=(Pending(STAGE_CLAIMS, "none at batch 1 x 8 micro-batches"),)),), notes=notes)
    big_text = f"none at batch {b} in one pass needs {fmt_mem(big)}"
    if isinstance(big, Cite) and not big.ok:
        big_text = f"none at batch {b} in one pass ran out of memory (measured"
        pred = ctx.predicted("none", b)
        big_text += (f"; its allocated peak is {fmt_alloc(pred)}; claim 1 says whether that depends on the process)"
                     if pred is not None and pred.known else ")")
    alts: list[Cite | Pred] = [c for lay in ctx.ev.layouts(b) if (c := ctx.ev.ok(lay, b)) and c.fits(ctx.limit)]
    fewest = ctx.pr.search_named(ctx.ev.scope, f"fewest first:k b={b}", ctx.limit)
    alts += [fewest.at] if fewest is not None else []
    timed = [c for c in alts if c.tps]
    best = max(timed, key=lambda c: c.tps or 0.0, default=None)
    cites, preds = split(case, big, *alts)
    if big.fits(ctx.limit):
        verdict, text, short = _faster(case, big, f"{big_text}: it fits, so accumulation is not needed for memory.")
        return Answer(11, _ACCUMULATION_CLAIM, (Part(label, verdict, text, short, cites, predicted=preds),),
                      notes=notes)
    if not case.fits(ctx.limit):
        text = f"{big_text}; {case.short} does not fit either ({fmt_mem(case)})."
        return Answer(11, _ACCUMULATION_CLAIM, (Part(label, Verdict.FAILS, text, f"b=1x{b}: {case.gib()}", cites,
                                                     predicted=preds),), notes=notes)
    head = (f"{big_text}, over the {gib(ctx.limit)} limit: batch {b} in one pass needs checkpointing. Accumulation "
            f"without it, {case.short}, fits ({fmt_mem(case)})")
    if best is None or not case.tps:
        verdict = Verdict.HOLDS if not alts else Verdict.OPEN
        text = head + (" where nothing at batch 8 in one pass does." if not alts else
                       "; its step time against checkpointing's is not known.")
        pend = () if not alts else (Pending(STAGE_CLAIMS, "none at batch 1 x 8 micro-batches"),)
        return Answer(11, _ACCUMULATION_CLAIM, (Part(label, verdict, text, f"b=1x{b} fits", cites, pend,
                                                     predicted=preds),), notes=notes)
    verdict, text, short = _faster(case, best, head + ".")
    return Answer(11, _ACCUMULATION_CLAIM, (Part(label, verdict, text, short, cites, predicted=preds),), notes=notes)


_ACCUMULATION_CLAIM = "Use gradient accumulation (batch 1 x 8 steps) instead of a larger batch."


def _faster(case: Cite | Pred, other: Cite | Pred, head: str) -> tuple[Verdict, str, str]:
    """Accumulation against the fastest way to the same batch in one pass: the same tokens per step, so the
    faster step wins."""
    if not case.tps or not other.tps:
        return Verdict.OPEN, head + " Their step times are not both known.", ""
    ratio = case.tps / other.tps
    text = (f"{head} {case.short} runs at {fmt_tok(case)}, the fastest in one pass that fits, {other.short}, at "
            f"{fmt_tok(other)} ({fmt_mem(other)}): accumulation is {times(ratio)} as fast.")
    fitted = " (fitted)" if isinstance(case, Pred) or isinstance(other, Pred) else ""
    short = f"b=1x8 {times(ratio)} the speed of {other.short}{fitted}"
    return (Verdict.HOLDS if ratio >= 1 else Verdict.FAILS), text, short
