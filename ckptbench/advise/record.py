"""What `ckptbench advise` answers, as data (no torch, so renderers can read it): the rows, the answer
sentences, what fills the memory, the ways out, the code; and the JSON of it with every number labelled."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ckptbench.advise.request import PRECISION_MEANS, AdviseRequest
from ckptbench.advise.snippets import Snippets
from ckptbench.analysis.step_time import StepTimePrediction
from ckptbench.estimator.gpus import GpuModel
from ckptbench.estimator.record import Estimate


def gib(n: float | None) -> str:
    """A size as every advise output shows it: GiB with two decimals."""
    return "-" if n is None else f"{n / 2**30:.2f} GiB"


@dataclass(frozen=True)
class Option:
    """One row of the answer: a layout family at one batch and sequence length, predicted."""

    family: str  # 'none', 'all', 'first:k', 'last:k', 'every:n', 'all@attn', ...
    estimate: Estimate
    time: StepTimePrediction | None
    searched: str | None = None  # how the layout was found ('smallest k of 1..32 that fits: 6 predictions')

    @property
    def layout(self) -> str:
        return self.estimate.point.layout

    @property
    def fits(self) -> bool:
        return self.estimate.fits is True



@dataclass(frozen=True)
class Table:
    """The rows of one batch size and sequence length."""

    batch: int
    seq: int
    options: list[Option]


@dataclass(frozen=True)
class Part:
    """One part of what must fit at the peak."""

    name: str
    bytes: int
    label: str  # predicted (the estimator) or estimated (a card figure from its device model)


@dataclass(frozen=True)
class WayOut:
    """A setup that changes more than the layout, when no layout fits: what it changes and what it needs."""

    what: str
    layout: str
    needed_bytes: int | None
    fits: bool | None
    label: str  # 'predicted', or 'predicted by arithmetic on ...' where the estimator could not trace it
    changes_training: bool = False


@dataclass
class Advice:
    """The whole answer."""

    request: AdviseRequest
    card: GpuModel
    tables: list[Table]
    calibration: str | None  # the step-time source, or why there is none
    answers: list[str] = field(default_factory=list)
    largest: dict[int, tuple[int, Estimate]] = field(default_factory=dict)  # seq -> (batch, estimate)
    why_option: Option | None = None
    why: list[Part] = field(default_factory=list)
    observed: list[str] = field(default_factory=list)
    ways_out: list[WayOut] = field(default_factory=list)
    code: Snippets | None = None
    code_for: str = ""
    measure: str | None = None  # the sweep command (and config) that would measure what is not calibrated

    @property
    def assumptions(self) -> str:
        r, c = self.request, self.card
        seqs = ", ".join(map(str, r.seqs))
        return (
            f"Assumed: {r.model}, {r.precision} ({PRECISION_MEANS[r.precision]}), optimizer {r.optimizer}, "
            f"sdpa attention (flash/memory-efficient kernels), sequence {seqs}, no LoRA or offloading, "
            f"one {c.name}: {gib(c.total_bytes)} usable ({'measured' if c.measured else 'estimated'}), "
            f"CUDA context {gib(c.context_bytes)} ({'measured' if c.measured else 'estimated'})."
        )


def advice_json(advice: Advice) -> dict[str, Any]:
    """Every number with its label (the JSON ``--format json`` writes)."""
    def num(value: float | None, label: str, unit: str, **extra: Any) -> dict[str, Any]:
        return {"value": value, "label": label, "unit": unit, **extra}

    card_label = "measured" if advice.card.measured else "estimated"
    tables = []
    for t in advice.tables:
        rows = []
        for o in t.options:
            e, r = o.estimate, o.estimate.reserved
            time = o.time
            tl = time.label if time else "measure to know"
            rows.append({
                "family": o.family, "layout": o.layout, "searched": o.searched, "fits": e.fits,
                "peak_allocated_bytes": num(e.peak_bytes, "predicted", "bytes"),
                "peak_reserved_bytes": num(r.peak_reserved_bytes if r else None, "predicted", "bytes"),
                # The peak reserved raised by the worst under-prediction seen for its kind of layout (README):
                # what 'needed' and 'fits' are decided on.
                "peak_reserved_bound_bytes": num(e.reserved_bound_bytes, "predicted", "bytes"),
                "context_bytes": num(r.context_bytes if r else None, card_label, "bytes"),
                "needed_bytes": num(e.needed_bytes, "predicted", "bytes"),
                "predicted_oom": r.oom if r else None,
                "step_time_s": num(time.step_time_s if time else None, tl, "s",
                                   source=time.source if time else None,
                                   error_bound=time.error_bound if time else None),
                "tokens_per_s": num(time.tokens_per_s if time else None, tl, "tokens/s"),
            })
        tables.append({"batch_size": t.batch, "seq_len": t.seq, "rows": rows})
    return {
        "assumptions": advice.assumptions,
        "request": dataclasses.asdict(advice.request),
        "card": {"key": advice.card.key, "name": advice.card.name,
                 "usable_bytes": num(advice.card.total_bytes, card_label, "bytes", source=advice.card.total_source),
                 "context_bytes": num(advice.card.context_bytes, card_label, "bytes",
                                      source=advice.card.context_source)},
        "calibration": advice.calibration,
        "tables": tables,
        "answers": advice.answers,
        "largest_batch_all": {str(s): {"batch_size": b, "needed_bytes": num(e.needed_bytes, "predicted", "bytes")}
                              for s, (b, e) in advice.largest.items()},
        "why": {"layout": advice.why_option.layout if advice.why_option else None,
                "batch_size": advice.why_option.estimate.point.batch_size if advice.why_option else None,
                "parts": [{"name": p.name, **num(p.bytes, p.label, "bytes")} for p in advice.why]},
        "observed": advice.observed,
        "ways_out": [{"what": w.what, "layout": w.layout, "fits": w.fits, "changes_what_is_trained": w.changes_training,
                      "needed_bytes": num(w.needed_bytes, w.label, "bytes")} for w in advice.ways_out],
        "code": {"for": advice.code_for, **(advice.code.to_json() if advice.code else {})},
        "measure": advice.measure,
    }

