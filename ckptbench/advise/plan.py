"""The answer as a training script takes it (``ckptbench.plan``): the layout to apply, the micro-batches, what it is
predicted to need and take, each figure with its label, the margin, and the sentence that chose it (no torch)."""

from __future__ import annotations

from dataclasses import dataclass

from ckptbench.advise.record import Advice, Option, Table
from ckptbench.advise.verdict import gib
from ckptbench.config.layouts import parse_layout


@dataclass(frozen=True)
class Plan:
    """What to run: the layout (and its decoder layers), the batch as micro-batches, and the prediction."""

    layout: str  # ckptbench's layout grammar ('first:24', 'every:4', 'none', 'all@attn+mlp')
    layers: tuple[int, ...]  # the decoder layers it checkpoints
    granularity: str  # 'block' (whole layers) or the part of each layer
    num_layers: int
    batch_size: int  # per step (per rank)
    micro_batch_size: int  # per_device_train_batch_size
    gradient_accumulation_steps: int
    seq_len: int
    precision: str
    optimizer: str
    gpu: str
    parallel: str
    fits: bool
    needed_bytes: int | None  # what must fit: reserved raised to its bound + the CUDA context
    needed_label: str  # 'predicted', or how else the figure was made
    limit_bytes: int  # the budget less the headroom
    margin_bytes: int | None
    tight: bool  # less than 1 GiB of margin
    step_time_s: float | None
    tokens_per_s: float | None
    step_time_label: str  # 'fitted', 'transferred' or 'measure to know'
    reason: str  # the answer's sentence for this batch

    def __str__(self) -> str:
        acc = (f", {self.gradient_accumulation_steps} micro-batches of {self.micro_batch_size}"
               if self.gradient_accumulation_steps > 1 else "")
        time = (f"{self.step_time_s:.2f} s/step ({self.step_time_label})" if self.step_time_s is not None
                else "step time: measure to know")
        fit = (f"needs {gib(self.needed_bytes)} of {gib(self.limit_bytes)} ({self.needed_label})" if self.fits
               else "does not fit")
        return f"{self.layout}{acc} at batch {self.batch_size}, sequence {self.seq_len}: {fit}; {time}"


def plan_of(advice: Advice) -> Plan:
    """The plan of the first batch and sequence length of ``advice``: its answer, or, when nothing fits, the
    layout that needs the least (``fits`` False, ``reason`` says why and the ways out are in the advice)."""
    t = advice.tables[0]
    option = t.choice or _least(t)
    return _plan(advice, t, option, advice.answers[0])


def _least(t: Table) -> Option:
    predicted = [o for o in t.rows if o.verdict.needed_bytes is not None]
    if predicted:
        return min(predicted, key=lambda o: o.verdict.needed_bytes or 0)
    return next(o for o in t.options if o.family == "all")


def _plan(advice: Advice, t: Table, o: Option, reason: str) -> Plan:
    n = o.num_layers
    plan = parse_layout(o.layout, n)
    v, time = o.verdict, o.time
    return Plan(
        layout=o.layout, layers=plan.layers, granularity=plan.granularity, num_layers=n, batch_size=t.batch,
        micro_batch_size=o.point.batch_size, gradient_accumulation_steps=o.accumulation, seq_len=t.seq,
        precision=t.precision, optimizer=o.point.optimizer, gpu=advice.card.key, parallel=o.point.parallel,
        fits=v.fits, needed_bytes=v.needed_bytes, needed_label=v.label, limit_bytes=v.limit.limit_bytes,
        margin_bytes=v.margin_bytes, tight=v.tight, step_time_s=time.step_time_s if time else None,
        tokens_per_s=time.tokens_per_s if time else None, step_time_label=time.label if time else "measure to know",
        reason=reason,
    )
