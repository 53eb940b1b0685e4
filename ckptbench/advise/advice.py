"""`ckptbench advise`: the question answered from exact memory predictions and the step-time model.

Every number carries its label: memory is *predicted* (the estimator: exact allocated bytes, the replayed
caching allocator's reserved bytes, the card's context from its device model), a step time is *fitted*
(measured on that card) or *transferred* (from another card, unvalidated), the user's figure is *observed*.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ckptbench.advise.record import Advice, Option, Part, Table, WayOut, gib
from ckptbench.advise.request import AdviseRequest
from ckptbench.advise.search import PRIMED, Predictor, largest_batch, options
from ckptbench.advise.snippets import Snippets, snippets
from ckptbench.analysis.step_time import StepTimeModel
from ckptbench.config.grid import Point
from ckptbench.config.layouts import parse_layout
from ckptbench.config.presets import PRESETS
from ckptbench.estimator.gpus import GpuModel
from ckptbench.estimator.record import Estimate, EstimateProgress
from ckptbench.results.store import load_run
from ckptbench.units import fmt_bytes

# The committed H200 runs: the default calibration of step times (transferred to the card asked about).
DEFAULT_TIMES = ("h200-gpu-check-1/check", "h200-gpu-check-1/axes", "h200-gpu-check-2/check")
RESULTS = Path(__file__).resolve().parent.parent.parent / "results"


def advise(request: AdviseRequest, *, on_progress: Callable[[EstimateProgress], None] | None = None) -> Advice:
    """Answer ``request``: every family's row at each batch and sequence length, the answer sentences, what
    fills the memory, ways out when nothing fits, the code, and how to measure what is not calibrated."""
    request = request.checked()
    card = request.card()
    times, calibration = _times(request)
    cfg = request.config(layouts=PRIMED)
    pred = Predictor(cfg, card, times, on_progress)
    pred.prime(cfg.points_list())
    base = {(p.batch_size, p.seq_len): p for p in cfg.points_list() if p.layout == "none"}
    tables = [Table(b, s, options(pred, base[(b, s)])) for s in request.seqs for b in request.batches]
    advice = Advice(request, card, tables, calibration)
    for s in request.seqs:
        found = largest_batch(pred, base[(request.batches[0], s)], [o for t in tables if t.seq == s for o in t.options])
        if found is not None:
            advice.largest[s] = found
    advice.answers = [_answer(t, card) for t in tables] + _largest_sentences(advice)
    _why(advice, request)
    if request.observed is not None:
        _observed(advice, pred, request)
    stuck = [t for t in tables if not any(o.fits for o in t.options)]
    if stuck:
        advice.ways_out = _ways_out(pred, stuck[0], request)
    _code(advice)
    if any(o.time is None for t in tables for o in t.options):
        advice.measure = _measure_command(request)
    return advice


def _times(request: AdviseRequest) -> tuple[StepTimeModel | None, str | None]:
    refs = list(request.times_from) or [str(RESULTS / r) for r in DEFAULT_TIMES if (RESULTS / r).is_dir()]
    if not refs:
        return None, "no calibration: the committed H200 runs are not here; give --times-from RUN"
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # notes about the runs' points are not the answer's subject
        runs = [load_run(ref) for ref in refs]
    return StepTimeModel.from_runs(runs), None


def _needed(o: Option) -> str:
    return gib(o.estimate.needed_bytes)


def _time_words(o: Option, none: Option | None) -> str:
    if o.time is None:
        return "step time: measure to know"
    words = f"{o.time.label}: {o.time.step_time_s:.2f} s/step, {o.time.tokens_per_s:,.0f} tokens/s"
    if none is not None and none.time is not None and o.layout != "none":
        words += f", {o.time.step_time_s / none.time.step_time_s - 1:+.0%} time vs no checkpointing"
    return words


def _layers_count(o: Option) -> int:
    return len(parse_layout(o.layout, _num_layers(o)).layers)


def _num_layers(o: Option) -> int:
    return int(PRESETS[o.estimate.point.model]["num_hidden_layers"])


def _answer(t: Table, card: GpuModel) -> str:
    """One or two sentences for one batch: the fastest layout that fits, the fewest layers that fit."""
    head = f"Batch {t.batch}, sequence {t.seq}"
    none = next(o for o in t.options if o.family == "none")
    fitting = [o for o in t.options if o.fits]
    if not fitting:
        best = min(t.options, key=lambda o: o.estimate.needed_bytes or 0)
        return (f"{head}: nothing fits {gib(card.total_bytes)}, not even {best.layout} (its allocated peak alone "
                f"is {gib(best.estimate.peak_bytes)}, predicted); see what does fit below.")
    if none.fits:
        return (f"{head}: no checkpointing fits (needs {_needed(none)} of {gib(card.total_bytes)}, predicted) and "
                f"is the fastest: do not checkpoint ({_time_words(none, None)}).")
    fewest = min(fitting, key=lambda o: (_layers_count(o), o.estimate.needed_bytes or 0))
    timed = [o for o in fitting if o.time is not None]
    text = (f"{head}: no checkpointing needs {_needed(none)} > {gib(card.total_bytes)}; the fewest layers that "
            f"fit: {fewest.layout} (needs {_needed(fewest)}; {_time_words(fewest, none)}).")
    if timed:
        fastest = min(timed, key=lambda o: o.time.step_time_s)  # type: ignore[union-attr]
        if fastest.layout != fewest.layout:
            text += f" Fastest that fits: {fastest.layout} ({_time_words(fastest, none)})."
    return text


def _largest_sentences(advice: Advice) -> list[str]:
    out = []
    for seq, (batch, est) in advice.largest.items():
        out.append(f"Largest batch that fits with every layer checkpointed (all) at sequence {seq}: {batch} "
                   f"(needs {gib(est.needed_bytes)}, predicted).")
    return out


def _why(advice: Advice, request: AdviseRequest) -> None:
    """What fills the memory at the peak of the first batch's answer (no checkpointing when it fits)."""
    first = advice.tables[0]
    fitting = [o for o in first.options if o.fits]
    option = next((o for o in first.options if o.family == "none"), first.options[0])
    if fitting and not option.fits:
        option = min(fitting, key=lambda o: _layers_count(o))
    e = option.estimate
    advice.why_option = option
    if e.peak_bytes is None:
        return
    b = e.breakdown
    parts = [
        Part("parameters", b["params"], "predicted"), Part("gradients", b["grads"], "predicted"),
        Part("optimizer state", b["optimizer_state"], "predicted"),
        Part("saved activations", b["activations"], "predicted"),
        Part("logits and loss", b["logits_loss"], "predicted"),
        Part("workspaces and buffers", b["transient"] + b["other"], "predicted"),
    ]
    r = e.reserved
    if r is not None and r.peak_reserved_bytes is not None:  # none when the replay runs out of memory first
        parts.append(Part("cached but free (allocator)", r.peak_reserved_bytes - e.peak_bytes, "predicted"))
        parts.append(Part("CUDA context", r.context_bytes, "measured" if advice.card.measured else "estimated"))
    advice.why = parts


def _observed(advice: Advice, pred: Predictor, request: AdviseRequest) -> None:
    """Reconcile the user's nvidia-smi figure with the prediction, and name setups that would show it."""
    seen = request.observed_bytes()
    option = advice.why_option
    if seen is None or option is None or option.estimate.needed_bytes is None:
        return
    e = option.estimate
    if e.reserved is not None and e.reserved.oom is not None:
        advice.observed = [
            f"Observed {gib(seen)}: {option.layout} at batch {e.point.batch_size} runs out of memory on this card "
            f"(its allocated peak alone is {gib(e.peak_bytes)}, predicted), so your figure comes from another setup.",
            *_setups_near(pred, e.point, seen, request)]
        return
    allocated, needed = e.peak_bytes or 0, e.needed_bytes or 0
    cache_context = needed - allocated
    lines = [
        f"Observed {gib(seen)} (nvidia-smi: the process's reserved memory plus its CUDA context) against "
        f"{option.layout} at batch {e.point.batch_size}: peak allocated {gib(allocated)} (predicted); the "
        f"allocator's cache and the context add {gib(cache_context)} (predicted/estimated), {gib(needed)} in all.",
    ]
    gap = seen - needed
    if abs(gap) <= 0.03 * seen:
        lines.append(f"Context and cache explain the whole gap between the allocated peak and {gib(seen)}.")
    else:
        explained = min(max(seen - allocated, 0), cache_context)
        lines.append(f"Of the {gib(max(seen - allocated, 0))} above the allocated peak, context and cache explain "
                     f"{gib(explained)}; {gib(abs(gap))} {'more' if gap > 0 else 'less'} than predicted remains: "
                     f"your setup differs.")
        lines += _setups_near(pred, e.point, seen, request)
    advice.observed = lines


def _setups_near(pred: Predictor, point: Point, seen: int, request: AdviseRequest) -> list[str]:
    candidates: list[tuple[str, dict[str, Any]]] = [
                  ("precision amp_bf16 (fp32 weights and AdamW state)", {"precision": "amp_bf16"}),
                  ("precision bf16 (pure bf16)", {"precision": "bf16"}),
                  ("optimizer adamw_foreach", {"optimizer": "adamw_foreach"}),
                  (f"batch {point.batch_size * 2}", {"batch_size": point.batch_size * 2}),
                  ("eager attention (no flash kernels)", {"attn_implementation": "eager"})]
    if point.seq_len * 2 <= int(PRESETS[point.model]["max_position_embeddings"]):
        candidates.append((f"sequence {point.seq_len * 2}", {"seq_len": point.seq_len * 2}))
    found = []
    for what, change in candidates:
        if all(getattr(point, k) == v for k, v in change.items()):
            continue
        est = pred.estimate(dataclasses.replace(point, **change))
        if est.needed_bytes is not None or (est.reserved is not None and est.reserved.oom is not None):
            found.append((what, est))
    def distance(item: tuple[str, Estimate]) -> float:
        n = item[1].needed_bytes
        return abs((n if n is not None else 10**15) - seen)
    found.sort(key=distance)
    out = []
    for what, est in found[:3]:
        needs = "runs out of memory" if est.needed_bytes is None else f"needs {gib(est.needed_bytes)}"
        out.append(f"  with {what}: {needs} (predicted)")
    return ["Setups nearest your figure (the same layout and batch otherwise):", *out] if out else []


def _ways_out(pred: Predictor, table: Table, request: AdviseRequest) -> list[WayOut]:
    """When no layout fits: 8-bit or offloaded optimizer state, sharding over two cards, and LoRA (which changes
    what is trained), each at no checkpointing and at all layers."""
    base = next(o for o in table.options if o.family == "none").estimate.point
    out: list[WayOut] = []
    variants: list[tuple[str, dict[str, Any], bool]] = [
        ("8-bit AdamW state (bitsandbytes adamw_8bit)", {"optimizer": "adamw_8bit"}, False),
        ("optimizer state offloaded to the CPU (torchao CPUOffloadOptimizer)", {"optimizer_offload": "cpu"}, False),
        ("sharded over 2 cards (FSDP2, per card)", {"parallel": "fsdp2:2"}, False),
        ("LoRA r16 (changes what is trained)", {"lora": "r16"}, "lora" not in request.allow),
    ]
    for what, change, changes in variants:
        for layout in ("none", "all"):
            point = dataclasses.replace(base, layout=layout, **change)
            est = pred.estimate(point)
            way = _way(pred, what, point, est, changes)
            out.append(way)
            if way.fits:
                break
    return out


def _way(pred: Predictor, what: str, point: Point, est: Estimate, changes: bool) -> WayOut:
    if est.peak_bytes is not None:
        label = "predicted" if est.reserved is not None and est.reserved.peak_reserved_bytes is not None else (
            "predicted, peak allocated only: reserved not replayed")
        return WayOut(what, point.layout, est.needed_bytes, est.fits, label, changes)
    # Not traced here (bitsandbytes / torchao missing): arithmetic on the plain prediction's parts.
    plain = pred.estimate(dataclasses.replace(point, optimizer=pred.cfg.optimizer, optimizer_offload="none"))
    if plain.needed_bytes is None:
        return WayOut(what, point.layout, None, None, est.note or "not estimated", changes)
    state = plain.breakdown.get("optimizer_state", 0)
    if point.optimizer == "adamw_8bit":
        params = plain.static["params_bytes"] // (4 if point.precision in ("amp_bf16", "amp_fp16", "fp32") else 2)
        replaced = params * 2 + params * 8 // 256  # two 8-bit moments and an fp32 absmax per 256-value block
        needed = plain.needed_bytes - state + min(state, replaced)
        label = f"predicted by arithmetic: AdamW state {fmt_bytes(state)} -> {fmt_bytes(replaced)} (8-bit)"
    else:
        needed = plain.needed_bytes - state
        label = f"predicted by arithmetic: AdamW state {fmt_bytes(state)} moved to the CPU"
    return WayOut(what, point.layout, needed, needed <= pred.card.total_bytes, label, changes)


def _code(advice: Advice) -> None:
    """The snippets for the layout to apply: the first batch that needs checkpointing, its fewest layers that
    fit (else: no checkpointing)."""
    for t in advice.tables:
        none = next(o for o in t.options if o.family == "none")
        fitting = [o for o in t.options if o.fits]
        if not none.fits and fitting:
            chosen = min(fitting, key=lambda o: (_layers_count(o), o.estimate.needed_bytes or 0))
            advice.code, advice.code_for = _snippets(chosen), f"{chosen.layout} (batch {t.batch}, sequence {t.seq})"
            return
    advice.code, advice.code_for = _snippets(advice.tables[0].options[0]), "no checkpointing"


def _snippets(o: Option) -> Snippets:
    return snippets(parse_layout(o.layout, _num_layers(o)))


def _measure_command(request: AdviseRequest) -> str:
    layouts = "none,all,every:2,first:16,all@attn+mlp,all@selective"
    return (f"ckptbench sweep CONFIG --out results/advise-{request.model}-{request.gpu} with CONFIG a copy of "
            f"configs/llama7b-check.yaml set to model {request.model}, precision {request.precision}, optimizer "
            f"{request.optimizer}, seq_len {' '.join(map(str, request.seqs))}, batch_size "
            f"{' '.join(map(str, request.batches))} and layouts {layouts}; then: ckptbench advise ... "
            f"--times-from results/advise-{request.model}-{request.gpu}")
