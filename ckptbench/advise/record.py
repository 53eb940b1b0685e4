"""What `ckptbench advise` answers, as data (no torch, so renderers can read it): each candidate setup judged
(``Option``), every count of a layout family (``FamilyScan``), the rows of every batch, the answer sentences, what
fills the memory, the ways out, the code; and the JSON of it with every number labelled."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from ckptbench.advise.request import PRECISION_MEANS, AdviseRequest
from ckptbench.advise.snippets import Snippets
from ckptbench.advise.verdict import Limit, Verdict, gib
from ckptbench.analysis.step_time import StepTimePrediction
from ckptbench.config.grid import Point, PointKey
from ckptbench.config.layouts import parse_layout
from ckptbench.config.parallel import parse_parallel
from ckptbench.estimator.gpus import GpuModel
from ckptbench.estimator.record import Estimate
from ckptbench.json_object import JsonObject


@dataclass(frozen=True)
class Option:
    """One candidate setup at one batch and sequence length, predicted and judged: a layout, at the batch itself
    or as micro-batches with gradient accumulation."""

    family: str  # 'none', 'all', 'first:k', 'last:k', 'every:n', 'all@attn', ...
    estimate: Estimate
    verdict: Verdict
    time: StepTimePrediction | None
    num_layers: int
    scan: FamilyScan | None = None  # how a family's count was found (every count predicted)

    @property
    def point(self) -> Point:
        return self.estimate.point

    @property
    def layout(self) -> str:
        return self.point.layout

    @property
    def fits(self) -> bool:
        return self.verdict.fits

    @property
    def accumulation(self) -> int:
        """Gradient accumulation steps (1: the whole batch in one pass)."""
        return self.point.micro_batches

    @property
    def setup(self) -> str:
        """'first:24' at the batch itself, 'none, 8 x 1' as 8 accumulated micro-batches of 1."""
        if self.accumulation == 1:
            return self.layout
        return f"{self.layout}, {self.accumulation} x {self.point.batch_size}"

    @property
    def layers(self) -> int:
        """How many decoder layers the layout checkpoints."""
        return len(parse_layout(self.layout, self.num_layers).layers)


@dataclass(frozen=True)
class FamilyScan:
    """Every count of one layout family at one point, judged: first:k and last:k (k = 1..n layers), every:n
    (n = 1..layers: fewer layers as n grows)."""

    family: str
    num_layers: int
    verdicts: tuple[Verdict, ...]  # index c - 1 holds the verdict of count c

    def layout(self, count: int) -> str:
        return f"{self.family}:{count}"

    def layers(self, count: int) -> int:
        """Layers checkpointed at ``count``: k for first:k and last:k, ceil(layers / n) for every:n."""
        return math.ceil(self.num_layers / count) if self.family == "every" else count

    @property
    def counts(self) -> range:
        return range(1, self.num_layers + 1)

    @property
    def order(self) -> list[int]:
        """The counts from the most layers to the fewest: k = n..1 for first:k and last:k, n = 1..layers for
        every:n."""
        return list(self.counts) if self.family == "every" else list(reversed(self.counts))

    def more_layers(self, count: int) -> list[int]:
        """The counts with more layers than ``count``, nearest first (k + 1, k + 2, ...; n - 1, n - 2, ...)."""
        order = self.order
        return order[: order.index(count)][::-1]

    def fits(self, count: int) -> bool:
        return self.verdicts[count - 1].fits

    @property
    def robust(self) -> int | None:
        """The count with the fewest layers that fits and from which every count with more layers fits too (one
        more layer cannot break it); None when the most layers (all) do not fit."""
        best = None
        for count in self.order:
            if not self.fits(count):
                break
            best = count
        return best

    @property
    def isolated(self) -> int | None:
        """A count with still fewer layers than ``robust`` that fits too, alone (the one with the fewest layers),
        if any."""
        order = self.order
        robust = self.robust
        beyond = order[order.index(robust) + 1:] if robust is not None else order
        fitting = [c for c in beyond if self.fits(c)]
        return fitting[-1] if fitting else None

    @property
    def monotone(self) -> bool:
        """Whether fitting never stops and starts again as layers are taken away."""
        return self.isolated is None

    def describe(self) -> str:
        """How the row was found: 'every k of 1..32 predicted; first:24 and every larger k fit'."""
        var, more = ("n", "smaller") if self.family == "every" else ("k", "larger")
        head = f"every {var} of 1..{self.num_layers} predicted"
        robust = self.robust
        if robust is None:
            return f"{head}; none fits"
        text = f"{head}; {self.layout(robust)} and every {more} {var} fit"
        isolated = self.isolated
        if isolated is not None:
            text += (f"; {self.layout(isolated)} fits too, but not every count between (the caching allocator "
                     "makes fitting non-monotone here)")
        return text


def safer(row: Option) -> str | None:
    """For a tight row found by a scan: the next count with more layers whose margin is at least TIGHT_BYTES."""
    scan = row.scan
    if scan is None or not row.verdict.tight:
        return None
    count = int(row.layout.split(":")[1])
    acc = f", {row.accumulation} x {row.point.batch_size}" if row.accumulation > 1 else ""
    for c in scan.more_layers(count):
        v = scan.verdicts[c - 1]
        if v.fits and not v.tight:
            return f"{scan.layout(c)}{acc} ({v.needs()})"
    return None


@dataclass(frozen=True)
class Table:
    """One batch size and sequence length of one precision: the layouts at the batch itself, the best setup of
    each count of accumulated micro-batches, the answer (the fastest setup that fits) and the fewest layers
    that fit at the batch itself."""

    batch: int
    seq: int
    precision: str
    options: list[Option]
    accumulation: list[Option] = field(default_factory=list)
    choice: Option | None = None
    fewest: Option | None = None

    @property
    def none(self) -> Option:
        return next(o for o in self.options if o.family == "none")

    @property
    def rows(self) -> list[Option]:
        return [*self.options, *self.accumulation]

    @property
    def stuck(self) -> bool:
        """Nothing fits: no layout at the batch, no accumulation of micro-batches."""
        return self.choice is None


@dataclass(frozen=True)
class Part:
    """One part of what a setup needs at its peak (the parts add up to the table's 'needed')."""

    name: str
    bytes: int
    label: str  # predicted (the estimator), estimated (a card figure), or the bound's margin


@dataclass(frozen=True)
class WayOut:
    """A setup that changes more than the layout, when nothing at the batch fits: what it changes, at which
    point (its batch and sequence length), and its verdict."""

    what: str
    point: Point
    verdict: Verdict
    changes_training: bool = False
    setup: PointKey = field(default_factory=dict)  # the point's axes that differ from the question's

    @property
    def fits(self) -> bool:
        return self.verdict.fits

    @property
    def where(self) -> str:
        return f"{self.point.layout} at batch {self.point.batch_size}, sequence {self.point.seq_len}"


@dataclass
class Advice:
    """The whole answer."""

    request: AdviseRequest
    limit: Limit
    tables: list[Table]
    calibration: str | None  # the step-time source, or why there is none
    also: list[Table] = field(default_factory=list)  # the second precision's tables (no --precision: amp_bf16)
    answers: list[str] = field(default_factory=list)
    largest: dict[int, tuple[int, Estimate, Verdict]] = field(default_factory=dict)  # seq -> (batch, ...)
    why_option: Option | None = None
    why: list[Part] = field(default_factory=list)
    observed: list[str] = field(default_factory=list)
    ways_out: list[WayOut] = field(default_factory=list)
    ways_out_for: Table | None = None
    code: Snippets | None = None
    code_for: str = ""
    measure: str | None = None  # the sweep command (and config) that would measure what is not calibrated

    @property
    def card(self) -> GpuModel:
        return self.limit.card

    @property
    def cards_words(self) -> str:
        """'one NVIDIA H100 80GB HBM3', or '8 x NVIDIA H100 80GB HBM3 (FSDP2; every figure per rank, rank 0)'."""
        spec = parse_parallel(self.request.parallel)
        name = self.card.name
        if spec.kind == "none":
            return name if name.startswith("a ") else f"one {name}"  # a card given by its size: 'a 24.00 GiB card'
        how = {"ddp": "DDP: every rank holds the whole model", "fsdp2": "FSDP2: parameters, gradients and optimizer "
               "state sharded"}[spec.kind]
        return f"{spec.world_size} x {name.removeprefix('a ')} ({how}; every figure per rank, rank 0)"

    @property
    def attention_words(self) -> str:
        """The attention the answer assumes, and why when it is not sdpa (asked for, or the family's code has no
        other)."""
        if self.request.attention == "sdpa":
            return "sdpa attention (flash/memory-efficient kernels)"
        if self.request.attn == self.request.attention:
            return (f"{self.request.attention} attention (asked for: attn_implementation=\"{self.request.attention}\", "
                    "the S x S attention scores are materialised)")
        family = self.request.model_spec().family
        return (f"{self.request.attention} attention ({family.name}'s {family.special.split(',')[0]} needs it: "
                "the S x S attention scores are materialised)")

    @property
    def assumptions(self) -> str:
        r, c = self.request, self.card
        seqs = ", ".join(map(str, r.seqs))
        p = r.answered_precision
        also = f" (and {r.also_precision} in one sentence)" if r.also_precision else ""
        return (
            f"Assumed: {r.model_name}, {p} ({PRECISION_MEANS[p]}){also}, optimizer {r.optimizer}, "
            f"{self.attention_words}, sequence {seqs}, no LoRA or offloading, "
            f"{self.cards_words}: {gib(c.total_bytes)} usable ({c.memory_label}), "
            f"CUDA context {gib(c.context_bytes)} ({c.context_label}); fits: "
            f"within the {self.limit.describe()}."
        )


def _num(value: float | None, label: str, unit: str, **extra: Any) -> JsonObject:
    return {"value": value, "label": label, "unit": unit, **extra}


def _row(o: Option, card_label: str) -> JsonObject:
    e, r, v, time = o.estimate, o.estimate.reserved, o.verdict, o.time
    tl = time.label if time else "measure to know"
    return {
        "family": o.family, "layout": o.layout, "setup": o.setup, "micro_batch_size": o.point.batch_size,
        "accumulation_steps": o.accumulation, "searched": o.scan.describe() if o.scan else None,
        "fits": v.fits, "outcome": v.outcome.value, "reason": None if v.fits else v.reason(),
        "tight": v.tight,
        "peak_allocated_bytes": _num(e.peak_bytes, "predicted", "bytes"),
        "peak_reserved_bytes": _num(r.peak_reserved_bytes if r else None, "predicted", "bytes"),
        # The peak reserved raised by the worst under-prediction seen for its kind of layout (results/fit.py): what
        # 'needed' is decided on.
        "peak_reserved_bound_bytes": _num(e.reserved_bound_bytes, "predicted", "bytes"),
        "context_bytes": _num(r.context_bytes if r else None, card_label, "bytes"),
        "needed_bytes": _num(v.needed_bytes, v.label, "bytes"),
        "margin_bytes": _num(v.margin_bytes, v.label, "bytes"),
        "predicted_oom": r.oom if r else None,
        # A step time only where the setup fits: a row that does not fit has none.
        "step_time_s": _num(time.step_time_s if time and v.fits else None, tl, "s",
                            source=time.source if time else None, error_bound=time.error_bound if time else None),
        "tokens_per_s": _num(time.tokens_per_s if time and v.fits else None, tl, "tokens/s"),
    }


def _table(t: Table, card_label: str) -> JsonObject:
    return {
        "batch_size": t.batch, "seq_len": t.seq, "precision": t.precision,
        "rows": [_row(o, card_label) for o in t.options],
        "accumulation": [_row(o, card_label) for o in t.accumulation],
        "choice": t.choice.setup if t.choice else None, "fewest_layers": t.fewest.setup if t.fewest else None,
    }


def advice_json(advice: Advice) -> JsonObject:
    """Every number with its label (the JSON ``--format json`` writes)."""
    card_label = advice.card.context_label
    lim = advice.limit
    return {
        "assumptions": advice.assumptions,
        "request": dataclasses.asdict(advice.request),
        "card": {"key": advice.card.key, "name": advice.card.name,
                 "usable_bytes": _num(advice.card.total_bytes, advice.card.memory_label, "bytes",
                                      source=advice.card.total_source),
                 "context_bytes": _num(advice.card.context_bytes, card_label, "bytes",
                                       source=advice.card.context_source)},
        "limit": {"budget_bytes": _num(lim.budget_bytes, "given" if lim.budget_given else advice.card.memory_label,
                                       "bytes"),
                  "headroom_bytes": _num(lim.headroom_bytes, "given", "bytes", text=lim.headroom_text),
                  "limit_bytes": _num(lim.limit_bytes, "given" if lim.budget_given else advice.card.memory_label,
                                      "bytes")},
        "calibration": advice.calibration,
        "tables": [_table(t, card_label) for t in advice.tables],
        "also": [_table(t, card_label) for t in advice.also],
        "answers": advice.answers,
        "largest_batch_all": {str(s): {"batch_size": b, "needed_bytes": _num(v.needed_bytes, v.label, "bytes")}
                              for s, (b, _, v) in advice.largest.items()},
        "why": {"layout": advice.why_option.setup if advice.why_option else None,
                "batch_size": advice.why_option.point.batch_size if advice.why_option else None,
                "parts": [{"name": p.name, **_num(p.bytes, p.label, "bytes")} for p in advice.why]},
        "observed": advice.observed,
        "ways_out": [{"what": w.what, "layout": w.point.layout, "batch_size": w.point.batch_size,
                      "seq_len": w.point.seq_len, "fits": w.fits, "changes_what_is_trained": w.changes_training,
                      "reason": None if w.fits else w.verdict.reason(),
                      "needed_bytes": _num(w.verdict.needed_bytes, w.verdict.label, "bytes")}
                     for w in advice.ways_out],
        "code": {"for": advice.code_for, **(advice.code.to_json() if advice.code else {})},
        "measure": advice.measure,
    }
