"""Claims 5 and 6 (the middle layers, the last layers) and the bottom line for the card (pure).

The user's question is "how many layers should I checkpoint on my 80 GB card?": :func:`card_rows`
answers it per measured batch size from the points that ran, and where the boundary lies between two
measured layouts it gives the fewest first:k that fit found by prediction (labelled), or, without
predictions, an estimate from the measured saving per layer, labelled as one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ckptbench.analysis.layer_series import CellSeries
from ckptbench.answers.evidence import Cite
from ckptbench.answers.predictions import BATCH_UP_TO, MIDDLE, Found, Pred, fmt_gb, fmt_tok
from ckptbench.answers.verdicts import (
    STAGE_BATCH_MAX,
    STAGE_CLAIMS,
    STAGE_LAYOUT_FIT,
    Answer,
    Context,
    Part,
    Pending,
    Verdict,
    gib,
    pct,
)

MIDDLE_STAND_IN = "range:8-19"
GB_50S = 60e9  # "goes to 50+ GB": under 60 GB (decimal, as quoted from nvidia-smi)
ABOUT_50_GB = 55e9  # "about 50 GB": within 10%
SPEED_LOSS = 0.30  # "under 30% speed loss"


def middle_layers(ctx: Context) -> Answer:
    """Claim 5: Checkpoint only the middle layers (8-12): 70+ GB to 50+ GB at under 30% speed loss, batch up to 6."""
    none = ctx.ev.ok("none", 2)
    mid = ctx.point(MIDDLE, 2)
    stand = ctx.ev.ok(MIDDLE_STAND_IN, 2)
    pend = (Pending(STAGE_CLAIMS, f"{MIDDLE} at batch 2"),)
    if none is None or mid is None or not mid.ok:
        near = (f" The nearest measured middle layout, {MIDDLE_STAND_IN} (12 layers), goes from {none.gb()} "
                f"({gib(none.mem)}) to {stand.gb()} ({gib(stand.mem)}) at batch 2, "
                f"{pct(1 - stand.tps / none.tps)} fewer tokens/s." if none and stand else "")
        cites = tuple(c for c in (none, stand) if c)
        mem = Part("50+ GB at batch 2", Verdict.OPEN, f"{MIDDLE} is neither measured nor predicted.{near}",
                   f"{MIDDLE} not measured", cites, pend)
        speed = Part("under 30% speed loss", Verdict.OPEN, f"{MIDDLE} is neither measured nor predicted.", "",
                     cites, pend)
        return Answer(5, _MIDDLE_CLAIM, (mem, speed, _batch_up_to(ctx)))
    cites, preds = split(none, mid)
    mem = Part("50+ GB at batch 2", Verdict.HOLDS if mid.mem < GB_50S else Verdict.FAILS,
               f"At batch 2, {MIDDLE} goes from {fmt_gb(none)} to {fmt_gb(mid)}.",
               f"{none.gb()} -> {mid.gb()}", cites, predicted=preds)
    if mid.tps:
        loss = 1 - mid.tps / none.tps
        speed = Part("under 30% speed loss", Verdict.HOLDS if loss < SPEED_LOSS else Verdict.FAILS,
                     f"{MIDDLE} runs at {fmt_tok(mid)} vs {fmt_tok(none)} for none: {pct(loss)} slower.",
                     f"{pct(loss)} slower" + (" (fitted)" if isinstance(mid, Pred) else ""), cites, predicted=preds)
    else:
        speed = Part("under 30% speed loss", Verdict.OPEN, f"{MIDDLE}'s step time is not predicted "
                     f"({ctx.pr.why_no_time(mid.key)}).", "", cites, pend, predicted=preds)
    return Answer(5, _MIDDLE_CLAIM, (mem, speed, _batch_up_to(ctx)))


_MIDDLE_CLAIM = ("Checkpoint only the middle layers (8-12): 70+ GB goes to 50+ GB at under 30% speed loss, "
                 "batch up to 6.")


def split(*items: Cite | Pred | None) -> tuple[tuple[Cite, ...], tuple[Pred, ...]]:
    """The measured cites and the predicted points among ``items`` (None dropped), for a Part."""
    return (tuple(c for c in items if isinstance(c, Cite)), tuple(c for c in items if isinstance(c, Pred)))


def boundary(ctx: Context, layout: str, **axes: Any) -> tuple[Cite | None, Cite | None]:
    """The largest measured batch of a layout that fits the limit, and the smallest that does not."""
    cites = [c for b in ctx.ev.batches(layout, **axes) if (c := ctx.ev.find(layout, b, **axes)) is not None]
    fit = [c for c in cites if c.fits(ctx.limit)]
    fail = [c for c in cites if not c.fits(ctx.limit) and c.record.status in ("ok", "oom")]
    largest = max(fit, key=lambda c: c.record.key["batch_size"], default=None)
    smallest = min(fail, key=lambda c: c.record.key["batch_size"], default=None)
    return largest, smallest


def _batch_up_to(ctx: Context) -> Part:
    largest, smallest = boundary(ctx, MIDDLE)
    lb = int(largest.key["batch_size"]) if largest else 0
    sb = int(smallest.key["batch_size"]) if smallest else None
    cites = tuple(c for c in (largest, smallest) if c)
    said = (f"largest measured batch of {MIDDLE} within {gib(ctx.limit)}: {lb or 'none'}"
            + (f"; batch {sb} does not fit ({smallest.gib()})" if smallest and sb else ""))
    if lb >= BATCH_UP_TO:
        return Part(f"batch {BATCH_UP_TO} fits", Verdict.HOLDS, said + ".", f"batch {lb} fits", cites)
    if sb is not None and sb <= BATCH_UP_TO:
        return Part(f"batch {BATCH_UP_TO} fits", Verdict.FAILS, said + ".", f"batch {sb} does not fit", cites)
    found = ctx.pr.search_named(ctx.ev.scope, f"largest batch {MIDDLE}", ctx.limit)
    if found is not None:
        v, at, beyond = found.value, found.at, found.beyond
        text = (f"The largest batch of {MIDDLE} that fits {gib(ctx.limit)}: {v} ({at.gib()}, {fmt_tok(at)})"
                + (f"; batch {v + 1} needs {beyond.gib()}" if beyond is not None else
                   f" (or more: {v} is the largest searched)") + ".")
        six = ctx.predicted(MIDDLE, BATCH_UP_TO)
        if six is not None and v < BATCH_UP_TO:
            text += f" Batch {BATCH_UP_TO} needs {six.gib()}."
        preds = tuple(p for p in (at, beyond, six) if p is not None)
        if v >= BATCH_UP_TO:
            return Part(f"batch {BATCH_UP_TO} fits", Verdict.HOLDS, text, f"batch {v} fits (predicted)", cites,
                        predicted=preds)
        return Part(f"batch {BATCH_UP_TO} fits", Verdict.FAILS, text, f"largest batch {v} (predicted)", cites,
                    predicted=preds)
    pend = (Pending(STAGE_BATCH_MAX, f"{MIDDLE} batch_size: max under the budget"),)
    return Part(f"batch {BATCH_UP_TO} fits", Verdict.OPEN, f"Neither measured nor predicted ({said}).", "", cites,
                pend)


def last_few_layers(ctx: Context) -> Answer:
    """Claim 6: Checkpoint only the last 4-6 layers: memory down to about 50 GB."""
    none, full = ctx.ev.ok("none", 2), ctx.ev.ok("all", 2)
    floor = ""
    if none is not None and none.record.memory.static_bytes is not None:
        static = none.record.memory.static_bytes
        floor = (f" Parameters, gradients and AdamW state alone take {gib(static)} at any "
                 "batch" + (f"; even all peaks at {gib(full.mem)}." if full else "."))
    parts = []
    for k in (4, 5, 6):
        c = ctx.point(f"last:{k}", 2)
        if c is None or not c.ok:
            if k in (4, 6):
                parts.append(Part(f"last:{k}", Verdict.OPEN, f"last:{k} at batch 2 is neither measured nor "
                                  "predicted.", "", pending=(Pending(STAGE_CLAIMS, f"last:{k} at batch 2"),)))
            continue
        text = (f"At batch 2, last:{k} peaks at {fmt_gb(c)}"
                + (f", from {none.gb()} ({gib(none.mem)}) without checkpointing." if none else ".") + floor)
        verdict = Verdict.HOLDS if c.mem <= ABOUT_50_GB else Verdict.FAILS
        cites, preds = split(c, none, full)
        parts.append(Part(f"last:{k}", verdict, text, f"last:{k}: {c.gb()}", cites, predicted=preds))
    return Answer(6, "Checkpoint only the last 4-6 layers: memory down to about 50 GB.", tuple(parts))


@dataclass(frozen=True)
class CardRow:
    """How many layers to checkpoint at one batch size on the card, from what ran."""

    batch_size: int
    fewest: Cite | None  # the fitting whole-layer point with the fewest checkpointed layers
    fastest: Cite | None  # the fastest fitting plain point, any layout
    over: Cite | None  # the measured whole-layer point with the most layers below ``fewest`` that does not fit
    estimate_k: int | None  # fewest first:k that would fit, estimated from the measured saving per layer
    pending: tuple[Pending, ...]
    predicted: Found | None = None  # the fewest first:k that fit, found by prediction (when not measured)


def card_rows(ctx: Context) -> list[CardRow]:
    """Per measured batch size: the fewest measured layers that fit, the fastest fitting point, an estimate."""
    rows = []
    for b, cell in sorted(ctx.series.items()):
        whole = [c for p in _whole(cell) if (c := ctx.ev.find(p, b)) is not None]
        fit = sorted((c for c in whole if c.fits(ctx.limit)), key=lambda c: (c.record.num_checkpointed or 0, c.mem))
        fewest = fit[0] if fit else None
        k_fit = (fewest.record.num_checkpointed or 0) if fewest else cell.num_layers + 1
        below = [c for c in whole if (c.record.num_checkpointed or 0) < k_fit and not c.fits(ctx.limit) and c.ok]
        over = max(below, key=lambda c: (c.record.num_checkpointed or 0, -c.mem), default=None)
        plain = [c for lay in ctx.ev.layouts(b) if (c := ctx.ev.ok(lay, b)) is not None and c.fits(ctx.limit)]
        fastest = max(plain, key=lambda c: c.tps, default=None)
        k_over = (over.record.num_checkpointed or 0) if over else None
        # Exact only when nothing needs checkpointing or the two measured neighbours are one layer apart.
        exact = fewest is not None and (k_fit == 0 or (k_over is not None and k_over + 1 == k_fit))
        found = None if exact else ctx.pr.search_named(ctx.ev.scope, f"fewest first:k b={b}", ctx.limit)
        pend = () if exact or found is not None else (Pending(STAGE_LAYOUT_FIT, f"layout: fit at batch {b}"),)
        estimate = None if found is not None else _estimate_k(ctx, over, fewest)
        rows.append(CardRow(b, fewest, fastest, over, estimate, pend, found))
    return rows


def _whole(cell: CellSeries) -> list[str]:
    """Every whole-layer layout measured in the cell: none, all and each family's points."""
    ends = [p.layout for p in (cell.none, cell.all) if p is not None]
    return list(dict.fromkeys([*ends, *(p.layout for s in cell.series for p in s.points)]))


def _estimate_k(ctx: Context, over: Cite | None, fewest: Cite | None) -> int | None:
    """first:k from the measured reserved saving per layer between ``over`` and ``fewest`` (an estimate)."""
    if over is None or fewest is None:
        return None
    k0, k1 = over.record.num_checkpointed or 0, fewest.record.num_checkpointed or 0
    per_layer = (over.mem - fewest.mem) / (k1 - k0) if k1 > k0 else 0
    if per_layer <= 0:
        return None
    k = k0 + math.ceil((over.mem - ctx.limit) / per_layer)
    return k if k0 < k < k1 else None


def saving_per_layer(over: Cite, fewest: Cite) -> float:
    k0, k1 = over.record.num_checkpointed or 0, fewest.record.num_checkpointed or 0
    return (over.mem - fewest.mem) / (k1 - k0) if k1 > k0 else 0.0
