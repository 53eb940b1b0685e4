"""The loss check: checkpointing must not change the loss, so every ok point is compared with a reference.

The reference is the plain step of the same cell (layout 'none', default loss, optimizer after
backward, ...: see ``LOSS_NEUTRAL_AXES``) when that point ran ok (every warm-up and measured step is
compared), else the first step's loss recomputed without checkpointing by transformers' default loss
(see ``measure.window.recompute_first_loss``), which exists whatever ran out of memory. The plain
step itself is checked against the recomputed loss. A sharded point (``parallel``: ddp, fsdp2) prefers
the unsharded plain step of its cell: every rank trains on the same batch, so sharding must not
change the losses either. Pure: no torch; the runner supplies the losses.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ckptbench.config.grid import AXIS_DEFAULTS, Point
from ckptbench.results.record import LossCheck, PointRecord

# Relative tolerance per precision, used when the config's loss_rtol is null. Layouts run the same
# operations (checkpointing only recomputes them), so their losses differ only where kernels or the
# order of reductions differ, and the optimizer carries that noise into later steps. The noise stays
# below one rounding of the dtype the model computes in; a real fault (a wrong recomputation, lost
# gradients) moves the loss by far more (LLaMA-7B's loss falls from 11.2 to 7.2 in 5 steps at lr 1e-5).
# - bf16, amp_bf16: 8 significand bits, one rounding = 2**-8 = 3.9e-3 relative. Measured on an H200
#   (LLaMA-7B, bf16, 10 layouts x 5 steps against 'none'): at most 2.7e-4, 14x below.
# - fp16, amp_fp16: 11 bits, one rounding = 2**-11 = 4.9e-4; allow two (2**-10 = 9.8e-4): not yet
#   measured on a GPU, and fp16's narrow range (underflowing gradients, the loss scaler's skipped
#   steps) can separate two trajectories by more than one rounding.
# - fp32: 24 bits (6e-8 per rounding). CPU runs differ by at most ~1e-7 (often exactly 0); 1e-5 leaves
#   room for GPU kernels that sum thousands of products in another order.
RTOL_BY_PRECISION: dict[str, float] = {
    "bf16": 2**-8,
    "amp_bf16": 2**-8,
    "fp16": 2**-10,
    "amp_fp16": 2**-10,
    "fp32": 1e-5,
}

# Axes that change how a step is computed but not what it computes: a point with any of them is
# checked against the plain step of its cell (layout 'none' and these axes at their defaults), so
# "checkpointing, a chunked or fused loss, the optimizer in backward... must not change the loss"
# is one check. micro_batches repeats the same batch, so the mean gradient and every loss are the same.
LOSS_NEUTRAL_AXES = (
    "layout", "loss", "optimizer_in_backward", "compile", "attn_implementation", "offload", "micro_batches",
)

NONE = "none"  # compared with the 'none' layout of the same cell, every step
RECOMPUTED = "recomputed"  # compared with the first step's loss recomputed without checkpointing


def loss_rtol(precision: str, configured: float | None) -> float:
    """The tolerance of the loss check: the config's loss_rtol, or the precision's default."""
    return configured if configured is not None else RTOL_BY_PRECISION[precision]


@dataclass(frozen=True)
class RecomputedLoss:
    """The first step's loss by forward passes alone: no checkpointing, no gradients, same weights and batch."""

    loss: float
    rows: int  # sequences per forward pass (fewer than the batch only when the whole batch ran out of memory)
    batch_size: int

    def describe(self) -> str:
        return (
            "first step's loss by forward passes without checkpointing or gradients, same initial weights "
            f"and batch ({self.rows} of {self.batch_size} sequences per pass)"
        )


def loss_cell(point: Point) -> tuple[Any, ...]:
    """The points whose losses must agree: the key without the loss-neutral axes."""
    return tuple(sorted((k, v) for k, v in point.key.items() if k not in LOSS_NEUTRAL_AXES))


def is_reference(point: Point) -> bool:
    """The plain step of its cell: no checkpointing and every loss-neutral technique at its default."""
    key = point.key
    return point.layout == "none" and all(key[a] == AXIS_DEFAULTS[a] for a in LOSS_NEUTRAL_AXES if a != "layout")


@dataclass
class LossReferences:
    """The plain step's losses per cell (``loss_cell``), kept while a sweep runs."""

    _by_cell: dict[tuple[Any, ...], tuple[str, list[float]]] = field(default_factory=dict)
    # The first step's loss recomputed without checkpointing, per cell: it depends only on the cell's
    # initial weights, batch and precision, so every layout of the cell shares one recomputation.
    _recomputed: dict[tuple[Any, ...], RecomputedLoss] = field(default_factory=dict)

    def remember(self, point: Point, record: PointRecord) -> None:
        """Keep a finished plain point's losses (this run's, or an earlier run's on --resume)."""
        if not is_reference(point) or not record.ok:
            return
        losses = [*record.warmup_losses, *record.losses]
        if losses:
            self._by_cell[loss_cell(point)] = (point.key_id, losses)

    def reference_cells(self, point: Point) -> list[tuple[Any, ...]]:
        """Cells whose plain step's losses can be the point's reference, best first: the unsharded cell
        (for a sharded point), then the point's own cell (unless the point is its plain step)."""
        cells = []
        if point.parallel != "none":
            cells.append(loss_cell(replace(point, parallel="none")))
        if not is_reference(point):
            cells.append(loss_cell(point))
        return cells

    def _reference(self, point: Point) -> tuple[str, list[float]] | None:
        return next((self._by_cell[c] for c in self.reference_cells(point) if c in self._by_cell), None)

    def needs_recomputed(self, point: Point) -> bool:
        """Whether the point's check needs a recomputed loss: no plain step's losses can be its reference."""
        return self._reference(point) is None

    def recomputed(self, point: Point) -> RecomputedLoss | None:
        """The cell's recomputed first loss, when an earlier point of the cell has made it."""
        return self._recomputed.get(loss_cell(point))

    def keep_recomputed(self, point: Point, loss: RecomputedLoss) -> None:
        self._recomputed[loss_cell(point)] = loss

    def check(
        self, point: Point, losses: Sequence[float], *, rtol: float, recomputed: RecomputedLoss | None
    ) -> LossCheck:
        """The record's ``loss_check`` for an ok point's losses (warm-up then measured steps)."""
        found = self._reference(point)
        if found is not None:
            reference_point, reference = found
            return compare(losses, reference, rtol=rtol, kind=NONE, reference_point=reference_point)
        if recomputed is None:
            raise ValueError(f"{point.key_id}: no 'none' losses for this cell and no recomputed loss")
        return compare(losses, [recomputed.loss], rtol=rtol, kind=RECOMPUTED, reference_point=recomputed.describe())


def compare(
    losses: Sequence[float], reference: Sequence[float], *, rtol: float, kind: str, reference_point: str
) -> LossCheck:
    """Compare the first steps that both have; a non-finite loss anywhere is a mismatch."""
    # Equal lengths unless an earlier, resumed run used other step counts; a recomputed reference has one.
    steps = min(len(losses), len(reference))
    pairs = list(zip(losses[:steps], reference[:steps], strict=True))
    finite = steps > 0 and all(math.isfinite(x) for x in [*losses, *reference[:steps]])
    diff = max(abs(a - b) / max(abs(b), 1e-12) for a, b in pairs) if finite else None
    return LossCheck(
        reference=kind,
        reference_point=reference_point,
        reference_losses=[float(x) for x in reference[:steps]],
        steps=steps,
        rtol=rtol,
        max_rel_diff=diff,
        match=diff is not None and diff <= rtol,
    )
