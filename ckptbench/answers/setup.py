"""Claims 8-14: offloading, batch and sequence length, accumulation, precision and optimizers, speed, ZeRO (pure).

A technique "helps" when it lets a step fit the card that would not fit without it, or runs faster
than the fastest plain point that fits at the same batch; measured in the same run where one run holds
both points, so that two GPU sessions are not compared.
"""

from __future__ import annotations

from typing import Any

from ckptbench.answers.evidence import Cite
from ckptbench.answers.ranges import boundary
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

SEVERAL_GB = 3e9  # "saves several GB": at least 3 GB
STATIC_DOMINATES = 0.5  # parameters, gradients and optimizer state at least half of the peak
CANNOT_SAVE_MUCH = 0.25  # the best checkpointing layout saves at most a quarter of the peak
FORTIES_GB = 50e9  # "memory to the 40s of GB": under 50 GB


def _in_scope(ctx: Context, key: dict[str, Any]) -> bool:
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
        parts.append(Part("with 4-8 checkpointed layers", Verdict.OPEN, "Offloading together with 4-8 checkpointed "
                          "layers is not measured yet.", "4-8 layers + offload: not measured",
                          pending=(Pending(STAGE_CLAIMS, "first:8 and every:4 with offload at batch 2 and 8"),)))
    return Answer(8, "Add activation offloading (alone or with 4-8 checkpointed layers).", tuple(parts))


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
    for s in (1024, 512):
        largest, smallest = boundary(ctx, "none", seq_len=s)
        if largest is not None and int(largest.key["batch_size"]) * s > ref_tokens:
            parts.append(Part(f"seq {s}", Verdict.HOLDS, f"At seq {s}, none fits up to batch "
                              f"{largest.key['batch_size']} ({gib(largest.mem)}, {tok(largest)}).",
                              f"s={s}: batch {largest.key['batch_size']} fits", (largest,)))
        elif smallest is not None and int(smallest.key["batch_size"]) * s <= ref_tokens:
            parts.append(Part(f"seq {s}", Verdict.FAILS, f"At seq {s}, none batch {smallest.key['batch_size']} does "
                              f"not fit ({smallest.gib()}).", f"s={s}: does not fit", (smallest,)))
        else:
            parts.append(Part(f"seq {s}", Verdict.OPEN, f"none at seq {s} with a larger batch is not measured yet.", "",
                              pending=(Pending(STAGE_SEQ, f"none batch_size: max at seq {s}"),)))
    return Answer(10, "Raise the batch to 4 (or lower the sequence length to 1024/512 and raise the batch) "
                  "instead.", tuple(parts))


def _batch_4(ctx: Context) -> Part:
    c4, c2, c8 = ctx.ev.find("none", 4), ctx.ev.ok("none", 2), ctx.ev.find("none", 8)
    if c4 is None:
        known = "; ".join(f"none at batch {c.key['batch_size']}: {c.gib()}" for c in (c2, c8) if c)
        return Part("batch 4", Verdict.OPEN, f"none at batch 4 is not measured yet ({known}).", "b=4: not measured",
                    tuple(c for c in (c2, c8) if c), (Pending(STAGE_BATCH_MAX, "none batch_size: max at seq 2048"),))
    if c4.fits(ctx.limit):
        gain = f", {pct(c4.tps / c2.tps - 1)} more tokens/s than batch 2" if c2 else ""
        return Part("batch 4", Verdict.HOLDS, f"none at batch 4 fits ({gib(c4.mem)}, {tok(c4)}{gain}).",
                    f"b=4 fits ({gib(c4.mem)})", tuple(c for c in (c4, c2) if c))
    return Part("batch 4", Verdict.FAILS, f"none at batch 4 does not fit ({c4.gib()}).", f"b=4: {c4.gib()}", (c4,))


def gradient_accumulation(ctx: Context) -> Answer:
    """Claim 11: Use gradient accumulation (batch 1 x 8 steps) instead of a larger batch."""
    found = ctx.ev.select(lambda k: int(k.get("micro_batches", 1)) > 1 and _in_scope(ctx, k))
    parts = []
    for p in found:
        verdict, text, short = _helps(ctx, p)
        parts.append(Part(p.short, verdict, text, short, (p,)))
    if not any(p.key["layout"] == "none" and p.key["batch_size"] == 1 and p.key["micro_batches"] == 8 for p in found):
        parts.append(Part("none, batch 1 x 8", Verdict.OPEN, "Batch 1 x 8 micro-batches without checkpointing is "
                          "not measured yet.", "b=1x8: not measured",
                          pending=(Pending(STAGE_CLAIMS, "none at batch 1 x 8 micro-batches"),)))
    return Answer(11, "Use gradient accumulation (batch 1 x 8 steps) instead of a larger batch.", tuple(parts))
