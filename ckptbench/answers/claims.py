"""The fourteen claims about checkpointing LLaMA-7B on an 80 GB card, each answered from measured runs (pure).

``answer_claims(runs, budget, predictions=...)`` returns one :class:`~ckptbench.answers.verdicts.Answer` per
claim, in order. Every number comes from a point of the given runs (cited with its key and run), or, where
no run measured it, from the predictions handed in (answers/predictions.py: memory predicted by the
estimator, step times fitted to the runs), labelled as such; a claim that neither can settle says which
stage of the GPU campaign (``scripts/gpu_check.sh``) will measure it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ckptbench.analysis.layer_series import CellSeries, layer_series
from ckptbench.analysis.memory_split import MemorySplit, memory_splits
from ckptbench.answers.cost import precision_optimizers_lora, twice_as_slow, zero2_on_one_gpu
from ckptbench.answers.evidence import Evidence, Scope
from ckptbench.answers.layers import (
    attention_and_mlp_apart,
    every_fourth_layer,
    every_layer_or_nothing,
    every_second_or_second_half,
    first_half_only,
)
from ckptbench.answers.predictions import Predictions
from ckptbench.answers.ranges import CardRow, card_rows, last_few_layers, middle_layers
from ckptbench.answers.setup import (
    activation_offloading,
    gradient_accumulation,
    larger_batch_instead,
    static_memory_dominates,
)
from ckptbench.answers.verdicts import Answer, Budget, Context, Pending
from ckptbench.config.cards import BY_KEY
from ckptbench.config.grid import AXIS_DEFAULTS
from ckptbench.errors import ResultsError
from ckptbench.results.store import Run, latest_per_key

TARGET_CARD = "A100"  # the card the claims are about (80 GB); its dense bf16 peak is in config/cards.py

# In the order of their numbers (each Answer carries its number; answer_claims checks the order).
CLAIMS: tuple[Callable[[Context], Answer], ...] = (
    every_layer_or_nothing,  # 1
    every_fourth_layer,  # 2
    every_second_or_second_half,  # 3
    first_half_only,  # 4
    middle_layers,  # 5
    last_few_layers,  # 6
    attention_and_mlp_apart,  # 7
    activation_offloading,  # 8
    static_memory_dominates,  # 9
    larger_batch_instead,  # 10
    gradient_accumulation,  # 11
    precision_optimizers_lora,  # 12
    twice_as_slow,  # 13
    zero2_on_one_gpu,  # 14
)


@dataclass(frozen=True)
class Transfer:
    """What the measuring GPU and the target card are, for what carries over (speed: ratios only)."""

    gpu_name: str
    gpu_total_memory_bytes: int | None
    gpu_peak_tflops: float | None  # as recorded with the points
    target: str
    target_peak_tflops: float | None

    @property
    def speed_ratio(self) -> float | None:
        """How many times the measuring GPU's dense bf16 peak is the target's (datasheets, not measured)."""
        if not self.gpu_peak_tflops or not self.target_peak_tflops:
            return None
        return self.gpu_peak_tflops / self.target_peak_tflops


def transfer_of(runs: Sequence[Run]) -> Transfer:
    env = runs[0].environment
    peaks = [r.peak_tflops for run in runs for r in run.points if r.peak_tflops]
    return Transfer(str(env.gpu_name or env.device_type or "?"), env.gpu_total_memory_bytes,
                    peaks[0] if peaks else None, TARGET_CARD, BY_KEY["a100-80gb"].bf16_tflops)


@dataclass(frozen=True)
class Answers:
    """Every claim's answer, the bottom line for the card, and the inputs they came from."""

    runs: tuple[Run, ...]
    budget: Budget
    scope: Scope
    answers: tuple[Answer, ...]
    card: tuple[CardRow, ...]
    series: dict[int, CellSeries]
    splits: tuple[MemorySplit, ...]
    transfer: Transfer
    predictions: Predictions = field(default_factory=Predictions)

    @property
    def held(self) -> dict[tuple[str, str, str], int]:
        """What the runs measured: (model, seq_len, precision) -> ok points, most points first."""
        return held_cells(self.runs)

    @property
    def in_scope(self) -> bool:
        """Whether the runs hold any point of the claims' cell (the scope's model, seq_len, precision)."""
        return holds_scope(self.runs, self.scope)

    @property
    def unjudged(self) -> list[int]:
        """The claims no measured point of these runs bears on (no part cites one)."""
        return [a.number for a in self.answers if not any(p.cites for p in a.parts)]

    @property
    def pending(self) -> dict[str, list[tuple[int, Pending]]]:
        """Stage -> the (claim number, pending run) that wait for it, by stage name."""
        out: dict[str, list[tuple[int, Pending]]] = {}
        for a in self.answers:
            for p in a.pending:
                out.setdefault(p.stage, []).append((a.number, p))
        for row in self.card:
            for p in row.pending:
                out.setdefault(p.stage, []).append((0, p))
        return dict(sorted(out.items()))


def merged_run(runs: Sequence[Run]) -> Run:
    """One run holding every point of the given runs, the first run's record per key (for the series)."""
    seen: dict[str, object] = {}
    points = []
    for run in runs:
        for rec in run.points:
            if rec.key_id not in seen:
                seen[rec.key_id] = rec
                points.append(rec)
    return Run(path=Path("(merged)"), meta=runs[0].meta, points=latest_per_key(points))


def _scope_series(runs: Sequence[Run], scope: Scope) -> dict[int, CellSeries]:
    """The plain-training cells of the scope (model, sequence length, precision), by batch size."""
    out: dict[int, CellSeries] = {}
    for cell in layer_series(merged_run(runs)):
        key = cell.key
        plain = all(key.get(k, v) == v for k, v in AXIS_DEFAULTS.items())
        if plain and (key.get("model"), key.get("seq_len"), key.get("precision")) == (
            scope.model, scope.seq_len, scope.precision
        ):
            out.setdefault(int(str(key.get("batch_size"))), cell)
    return dict(sorted(out.items()))


def answer_claims(runs: Sequence[Run], *, budget: Budget, scope: Scope | None = None,
                  predictions: Predictions | None = None) -> Answers:
    """Answer every claim from the runs (given in order of preference: the first run holding a key is cited),
    and, where no run measured a point, from ``predictions`` (none: measured points only)."""
    if not runs:
        raise ResultsError("answers: give at least one run directory")
    scope = scope or Scope()
    series = _scope_series(runs, scope)
    pr = predictions or Predictions()
    ctx = Context(Evidence(runs, scope=scope), budget, series, pr)
    answers = tuple(claim(ctx) for claim in CLAIMS)
    assert [a.number for a in answers] == list(range(1, len(CLAIMS) + 1)), "claims out of order"
    labels = {c.label for c in series.values()}
    splits = tuple(s for s in memory_splits(merged_run(runs)) if s.cell in labels)
    return Answers(tuple(runs), budget, scope, answers, tuple(card_rows(ctx)), series, splits, transfer_of(runs), pr)


def held_cells(runs: Sequence[Run]) -> dict[tuple[str, str, str], int]:
    """What the runs measured: (model, seq_len, precision) -> ok points, most points first."""
    counts: dict[tuple[str, str, str], int] = {}
    for run in runs:
        for rec in run.points:
            if rec.ok:
                cell = (str(rec.key.get("model")), str(rec.key.get("seq_len")), str(rec.key.get("precision")))
                counts[cell] = counts.get(cell, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def holds_scope(runs: Sequence[Run], scope: Scope) -> bool:
    """Whether the runs hold any ok point of the claims' cell (the scope's model, seq_len, precision)."""
    return (scope.model, str(scope.seq_len), scope.precision) in held_cells(runs)
