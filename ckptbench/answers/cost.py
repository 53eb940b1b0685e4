"""Claims 12-14: precision, optimizers and LoRA; "twice as slow is normal"; ZeRO-2 on one GPU (pure)."""

from __future__ import annotations

from ckptbench.answers.evidence import Cite
from ckptbench.answers.layers import TWICE
from ckptbench.answers.predictions import Pred, fmt_mem, fmt_time
from ckptbench.answers.setup import FORTIES_GB, SEVERAL_GB
from ckptbench.answers.verdicts import (
    STAGE_CLAIMS,
    STAGE_ESTIMATOR,
    STAGE_TUNE,
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

ZERO2_NOTE = (
    "DeepSpeed ZeRO stage 2 partitions the optimizer state and the gradients across the data-parallel ranks; on "
    "one GPU there is one rank, so it partitions nothing and its memory is plain AdamW's (the measured none). What "
    "moves memory off a single GPU is ZeRO-Offload (offload_optimizer: cpu): the optimizer state, and its step, on "
    "the CPU; the measured equivalent here is the optimizer_offload: cpu axis."
)


def _saving(ctx: Context, label: str, p: Cite | None, *, pending: Pending, note: str = "", why: str = "") -> Part:
    """A technique at batch 2 against plain none at batch 2 of the same run: does it save several GB?"""
    if p is None:
        return Part(label, Verdict.OPEN, f"{label} is not measured yet.{why}", f"{label}: not measured",
                    pending=(pending,))
    ref = ctx.ev.ok("none", int(p.key["batch_size"]), run=p.run) or ctx.ev.ok("none", int(p.key["batch_size"]))
    if ref is None or not p.ok:
        return Part(label, Verdict.FAILS, f"{p.short}: {p.gib()}.", f"{label}: {p.gib()}", (p,))
    saved = ref.mem - p.mem
    text = (f"{p.short}: {gib(p.mem)} vs {gib(ref.mem)} for {ref.short} ({'-' if saved >= 0 else '+'}"
            f"{gib(abs(saved))}), {tok(p)} vs {tok(ref)} ({p.tps / ref.tps - 1:+.1%}).{note}")
    verdict = Verdict.HOLDS if saved >= SEVERAL_GB else Verdict.FAILS
    return Part(label, verdict, text, f"{label}: -{gib(saved)}" if saved >= 0 else f"{label}: +{gib(-saved)}", (p, ref))


def precision_optimizers_lora(ctx: Context) -> Answer:
    """Claim 12: Use bf16/fp16 mixed precision; use 8-bit Adam (saves several GB); use LoRA."""
    ev = ctx.ev
    amp = ev.find("all", 2, precision="amp_bf16") or ev.find("none", 2, precision="amp_bf16")
    parts = [_mixed(ctx, amp) if amp is not None else _mixed_predicted(ctx)]
    parts.append(_saving(ctx, "8-bit AdamW (bitsandbytes)", ev.find("none", 2, optimizer="adamw_8bit"),
                         pending=Pending(STAGE_CLAIMS, "none at batch 2 with adamw_8bit")))
    parts.append(_saving(ctx, "8-bit AdamW (torchao)", ev.find("none", 2, optimizer="adamw_8bit_torchao"),
                         pending=Pending(STAGE_TUNE, "optimizer adamw_8bit_torchao at batch 2"),
                         why=" The estimator cannot predict it either: torchao's 8-bit AdamW compiles its step."))
    lora = ev.select(lambda k: k.get("lora", "none") != "none" and k.get("layout") == "none"
                     and k.get("batch_size") == 2 and k.get("model") == ev.scope.model)
    parts.append(_saving(ctx, "LoRA", lora[0] if lora else None, pending=Pending(STAGE_CLAIMS, "LoRA at batch 2"),
                         note=" LoRA trains only the adapters: a different training than full fine-tuning."))
    return Answer(12, "Use bf16/fp16 mixed precision; use 8-bit Adam (saves several GB); use LoRA.", tuple(parts),
                  notes=("Every plain point here is pure bf16 (bf16 parameters, gradients and AdamW state); "
                         "mixed precision (amp_bf16) keeps fp32 parameters and AdamW state and computes in bf16.",))


def _mixed_predicted(ctx: Context) -> Part:
    """Mixed precision from the estimator: fp32 master weights, gradients and AdamW state with bf16 autocast."""
    label = "mixed precision (amp_bf16)"
    full, none = ctx.predicted("all", 2, precision="amp_bf16"), ctx.predicted("none", 2, precision="amp_bf16")
    if full is None or not full.known:
        return Part(label, Verdict.OPEN, "amp_bf16 is neither measured nor predicted.", f"{label}: not measured",
                    pending=(Pending(STAGE_CLAIMS, "all at batch 2 in amp_bf16 under the cap"),
                             Pending(STAGE_ESTIMATOR, "amp_bf16 on the whole card")))
    pure = ctx.ev.ok("all", 2)
    static = full.point.static_bytes
    text = (f"With every layer checkpointed (all) at batch 2, amp_bf16 needs {gib(full.mem)} reserved (its bound) and "
            f"{gib(full.alloc)} allocated (predicted)")
    if static is not None:
        text += (f": fp32 parameters, gradients and AdamW state alone take {gib(static)} (predicted), "
                 "twice pure bf16's")
    if full.fits(ctx.limit):
        text += f", within the {gib(ctx.limit)} limit."
    elif static is not None and static > ctx.budget.budget_bytes:
        text += (f", more than the {gib(ctx.budget.budget_bytes)} budget itself: no layout makes it fit an 80 GB "
                 "card.")
    else:
        text += f", over the {gib(ctx.limit)} limit."
    if none is not None and none.known:
        text += f" Without checkpointing: {none.gib()}."
    if pure is not None:
        text += f" Pure bf16 all: {fmt_mem(pure)}."
    saves = pure is not None and full.fits(ctx.limit) and full.mem < pure.mem
    return Part(label, Verdict.HOLDS if saves else Verdict.FAILS, text, f"{label}: all needs {full.gib()}",
                tuple(c for c in (pure,) if c), predicted=tuple(p for p in (full, none) if p is not None and p.known))


def _mixed(ctx: Context, amp: Cite | None) -> Part:
    label = "mixed precision (amp_bf16)"
    if amp is None:
        return Part(label, Verdict.OPEN, "amp_bf16 is not measured yet.", f"{label}: not measured",
                    pending=(Pending(STAGE_CLAIMS, "all at batch 2 in amp_bf16 under the cap"),
                             Pending(STAGE_ESTIMATOR, "amp_bf16 on the whole card")))
    pure = ctx.ev.ok(str(amp.key["layout"]), int(amp.key["batch_size"]))
    if not amp.fits(ctx.limit):
        return Part(label, Verdict.FAILS, f"{amp.label}: {amp.gib()}, over the "
                    f"{gib(ctx.limit)} limit" + (f"; pure bf16 {gib(pure.mem)}." if pure else "."),
                    f"{label}: {amp.gib()}", tuple(c for c in (amp, pure) if c))
    saves = pure is not None and amp.mem < pure.mem
    text = f"{amp.label}: {gib(amp.mem)}, {tok(amp)}" + (
        f"; pure bf16 {gib(pure.mem)}, {tok(pure)}." if pure else ".")
    return Part(label, Verdict.HOLDS if saves else Verdict.FAILS, text, f"{label}: {gib(amp.mem)}",
                tuple(c for c in (amp, pure) if c))


def twice_as_slow(ctx: Context) -> Answer:
    """Claim 13: 'Twice as slow is normal' for checkpointing."""
    parts = []
    for b in sorted(ctx.series):
        none = ctx.ev.ok("none", b)
        if none is None:
            fitted = _twice_fitted(ctx, b)
            parts += [fitted] if fitted is not None else []
            continue
        pairs = [ctx.ev.pair({"layout": "none", "batch_size": b}, {"layout": lay, "batch_size": b})
                 for lay in ctx.ev.layouts(b) if lay != "none"]
        ratios = [(y.step_s / x.step_s, y, x) for x, y in pairs if x and y and x.ok and y.ok]
        if not ratios:
            continue
        worst = max(ratios, key=lambda t: (t[0], t[1].label))
        full = next((t for t in ratios if t[1].key["layout"] == "all"), None)
        flops = _flops_text(full[1]) if full else ""
        text = (f"At batch {b}, the slowest checkpointing layout, {worst[1].key['layout']}, takes {times(worst[0])} "
                f"the step time of none ({worst[1].step_s * 1e3:.1f} vs {worst[2].step_s * 1e3:.1f} ms)"
                + (f"; all {times(full[0])}" if full else "") + f".{flops} Per layout: "
                + ", ".join(f"{y.key['layout']} {times(r)}" for r, y, _ in sorted(ratios, key=lambda t: t[1].label))
                + ".")
        short = f"b={b}: at most {times(worst[0])}" + (f" (all {times(full[0])})" if full else "")
        cites = (none, *(y for _, y, _ in ratios))
        parts.append(Part(f"batch {b}", Verdict.HOLDS if worst[0] >= TWICE else Verdict.FAILS, text, short, cites))
    return Answer(13, "\"Twice as slow is normal\" for checkpointing.", tuple(parts))


def _twice_fitted(ctx: Context, b: int) -> Part | None:
    """Where none does not run (out of memory), the measured layouts against none's fitted step time."""
    none = ctx.predicted("none", b)
    if none is None or not none.step_s:
        return None
    measured = [c for lay in ctx.ev.layouts(b) if lay != "none" and (c := ctx.ev.ok(lay, b)) is not None]
    if not measured:
        return None
    ratios = sorted(((c.step_s / none.step_s, c) for c in measured), key=lambda t: t[1].label)
    worst = max(ratios, key=lambda t: (t[0], t[1].label))
    full = next((t for t in ratios if t[1].key["layout"] == "all"), None)
    text = (f"At batch {b} none does not run, so its step time is the time model's: {fmt_time(none)}. The slowest "
            f"measured layout, {worst[1].key['layout']}, takes {times(worst[0])} that "
            f"({worst[1].step_s * 1e3:.1f} ms, measured)" + (f"; all {times(full[0])}" if full else "")
            + ". Per layout (measured over fitted): " + ", ".join(f"{c.key['layout']} {times(r)}" for r, c in ratios)
            + ".")
    short = f"b={b}: at most {times(worst[0])} (none fitted)"
    return Part(f"batch {b}", Verdict.HOLDS if worst[0] >= TWICE else Verdict.FAILS, text, short,
                tuple(c for _, c in ratios), predicted=(none,))


def _flops_text(full: Cite) -> str:
    r = full.record
    if not r.hardware_flops_per_step or not r.model_flops_per_step:
        return ""
    extra = r.hardware_flops_per_step / r.model_flops_per_step - 1
    return f" Recomputing every layer's forward adds {pct(extra)} to the FLOPs of a step (recorded per point)."


def zero2_on_one_gpu(ctx: Context) -> Answer:
    """Claim 14: DeepSpeed ZeRO-2 brings memory to the 40s of GB with less slowdown than checkpointing."""
    model = ctx.ev.scope.model
    found = ctx.ev.select(lambda k: k.get("optimizer_offload", "none") == "cpu" and k.get("model") == model)
    none, full = ctx.ev.ok("none", 2), ctx.ev.ok("all", 2)
    estimates: tuple[str, ...] = ()
    parts: list[Part] = []
    if none is not None:
        parts.append(Part("ZeRO-2 itself on one GPU", Verdict.HOLDS if none.mem < FORTIES_GB else Verdict.FAILS,
                          f"With one rank ZeRO-2 partitions nothing: its memory is plain AdamW's, {none.short}'s "
                          f"{none.gb()} ({gib(none.mem)}, measured).", f"ZeRO-2 alone: {none.gb()}", (none,)))
    p = next((c for c in found if c.key.get("batch_size") == 2), None)
    if p is not None and none is not None:
        slow, ckpt = p.step_s / none.step_s, (full.step_s / none.step_s if full else None)
        holds = p.ok and p.mem < FORTIES_GB and (ckpt is None or slow < ckpt)
        text = (f"{p.short}: {p.gb()} ({p.gib()}), {times(slow)} the step time of none"
                + (f"; all (checkpointing) {times(ckpt)}." if ckpt else "."))
        parts.append(Part("optimizer state on the CPU", Verdict.HOLDS if holds else Verdict.FAILS, text,
                          f"{p.gb()}, {times(slow)}", tuple(c for c in (p, none, full) if c)))
        return Answer(14, _ZERO2_CLAIM, tuple(parts), estimates, (ZERO2_NOTE,))
    pred = ctx.predicted("none", 2)
    if pred is not None and pred.ok and pred.point.optimizer_state_bytes is not None:
        parts.append(_offload_memory_predicted(pred))
    elif none is not None and none.record.memory.optimizer_state_bytes:
        state = none.record.memory.optimizer_state_bytes
        left = none.mem - state
        estimates = (f"Estimate: without AdamW's state on the GPU the batch-2 peak would be about {gib(left)}: "
                     f"none's measured peak reserved ({gib(none.mem)}) minus its measured "
                     f"optimizer state ({gib(state)}); the offload's own buffers are not counted.",)
    cost = f" Checkpointing every layer (all) costs {times(full.step_s / none.step_s)} (measured)." if (
        full and none) else ""
    parts.append(Part("less slowdown than checkpointing", Verdict.OPEN, "The step time of the optimizer state "
                      "on the CPU (its step and the transfers each step) is neither measured nor predicted: the time "
                      f"model has no measured point with optimizer_offload: cpu.{cost}", "offload's speed: not "
                      "measured", pending=(Pending(STAGE_TUNE, "optimizer_offload: cpu at batch 2 and 8"),)))
    return Answer(14, _ZERO2_CLAIM, tuple(parts), estimates, (ZERO2_NOTE,))


def _offload_memory_predicted(pred: Pred) -> Part:
    """The memory of AdamW's state on the CPU: the predicted none less its predicted optimizer state (arithmetic on
    predictions: the estimator does not trace torchao's CPU offload optimizer)."""
    state = pred.point.optimizer_state_bytes or 0
    left_alloc, left = pred.alloc - state, pred.mem - state
    text = (f"Without AdamW's state on the GPU the batch-2 peak would be {gib(left)} reserved ({left / 1e9:.1f} GB), "
            f"{gib(left_alloc)} allocated: {pred.short}'s {pred.gib()} less its {gib(state)} of optimizer state "
            "(predicted by arithmetic on the estimator's prediction: it does not trace torchao's CPU offload "
            "optimizer, whose own pinned host buffers are not on the GPU).")
    verdict = Verdict.HOLDS if left < FORTIES_GB else Verdict.FAILS
    return Part("memory with the optimizer state on the CPU", verdict, text,
                f"offload: {left / 1e9:.1f} GB (predicted)", predicted=(pred,))


_ZERO2_CLAIM = ("DeepSpeed ZeRO-2 brings memory to the 40s of GB with less slowdown than checkpointing "
                "(on one GPU: what ZeRO-2 can shard there, and the single-GPU equivalent).")
