"""Which points of a fanned-out sweep may run at the same time, and which wait. Pure: no torch.

A sweep in one process runs its points in order, and two of its rules depend on that order:

- after a batch size runs out of memory, larger batches of the same layout and setup are skipped:
  so a point waits for the next smaller batch of its chain (its key without the batch size);
- a point's losses are checked against the plain step of its cell (layout 'none', the loss-neutral
  techniques at their defaults: measure/loss_check.py): so a point waits for the plain point that will
  be its reference, if that point is still to run.

Everything else is independent and runs in parallel: different cells, and the layouts of a cell
once its reference has run. Searches (batch_size: max, layout: fit) run after the grid, each one
probe at a time (a probe depends on the answer before it), different searches in parallel.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ckptbench.config.grid import Point, key_without
from ckptbench.measure.loss_check import is_reference, loss_cell

Cell = tuple[Any, ...]


def prerequisites(
    todo: Sequence[Point],
    done: Iterable[Point],
    *,
    skip_after_oom: bool,
    reference_cells: Callable[[Point], list[Cell]],
) -> dict[str, set[str]]:
    """For every point to run (by key id): the key ids of the points it waits for.

    ``reference_cells(point)`` lists the loss cells whose plain point can be the point's loss reference,
    best first (``LossReferences.reference_cells``); the first one that has a plain point in the sweep
    is the reference: the point waits for it if it is still to run.
    """
    nones = {loss_cell(p): p.key_id for p in [*done, *todo] if is_reference(p)}
    pending = {p.key_id for p in todo}
    previous: dict[Cell, Point] = {}
    waits: dict[str, set[str]] = {}
    for point in todo:  # in execution order: batch sizes ascending within a chain
        before: set[str] = set()
        chain = key_without(point, "batch_size")
        if skip_after_oom and chain in previous and previous[chain].batch_size < point.batch_size:
            before.add(previous[chain].key_id)
        previous[chain] = point
        reference = next((nones[c] for c in reference_cells(point) if c in nones), None)
        if reference is not None and reference in pending and reference != point.key_id:
            before.add(reference)
        waits[point.key_id] = before
    return waits


def ready(waits: dict[str, set[str]], finished: set[str], started: set[str]) -> list[str]:
    """Key ids (in the order of ``waits``) not started yet whose prerequisites have all finished."""
    return [k for k, before in waits.items() if k not in started and before <= finished]
