"""Gradient accumulation weighed against checkpointing: a batch B as m micro-batches of B/m (m dividing B), each
count with its own best layout (no checkpointing where it fits, else every layout family at the micro-batch), and
the answer of a batch: the fastest setup that fits, at the batch itself or accumulated."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ckptbench.advise.predictor import Predictor, family_rows, warm_tables
from ckptbench.advise.record import Option
from ckptbench.config.grid import Point

MAX_ACCUMULATION_COUNTS = 6  # the divisors weighed, the largest micro-batches first (B = 64: 2, 4, 8, 16, 32, 64)


def divisors(batch: int) -> list[int]:
    """Every m > 1 that divides ``batch`` (micro-batches of batch / m), smallest first, at most
    MAX_ACCUMULATION_COUNTS of them (always including m = batch: micro-batches of 1)."""
    found = [m for m in range(2, batch + 1) if batch % m == 0]
    if len(found) > MAX_ACCUMULATION_COUNTS:
        found = [*found[: MAX_ACCUMULATION_COUNTS - 1], batch]
    return found


def micro_points(base: Point) -> list[Point]:
    """The question's batch as accumulated micro-batches, one point per count (layout 'none')."""
    return [dataclasses.replace(base, layout="none", batch_size=base.batch_size // m, micro_batches=m)
            for m in divisors(base.batch_size)]


def preferred(options: Sequence[Option]) -> Option | None:
    """The setup to answer with among those that fit, with a margin first: those with at least TIGHT_BYTES to
    spare before tight ones; then the fastest where every one has a step time, else (no time to weigh) the fewest
    layers at the largest micro-batch, whole layers first, least memory next."""
    fitting = [o for o in options if o.fits]
    if not fitting:
        return None
    roomy = [o for o in fitting if not o.verdict.tight] or fitting
    if all(o.time is not None for o in roomy):
        return min(roomy, key=lambda o: (o.time.step_time_s if o.time else 0.0, o.layers))
    return min(roomy, key=lambda o: (o.accumulation, "@" in o.layout, o.layers, o.verdict.needed_bytes or 0))


def accumulation_rows(pred: Predictor, base: Point) -> list[Option]:
    """For every count m of micro-batches: the best setup that fits at micro-batches of B/m (none when none
    fits at that count)."""
    rows = []
    warm_tables(pred, micro_points(base))
    for micro in micro_points(base):
        best = preferred(family_rows(pred, micro))
        if best is not None:
            rows.append(best)
    return rows
