"""Random periodic request streams for the replay's tests: steps of micro-batches making the same requests."""

from __future__ import annotations

import random

from ckptbench.estimator.event_assembly import StepEvents
from ckptbench.estimator.events import ALLOC, FREE


def random_step(rng: random.Random, count: int, *, small: int = 0) -> StepEvents:
    """A step of ``count`` micro-batches making the same requests: some of its blocks freed in the same
    micro-batch, some by the next one, some kept to the end (freed by the optimizer step's segment). ``small``: that
    many requests of the small pool's sizes (up to 1 MiB) more in each micro-batch."""
    sizes = [rng.choice([1, 3, 5, 9, 17]) * 2**20 + rng.randrange(0, 2**20) for _ in range(rng.randint(3, 9))]
    for _ in range(small):
        sizes.insert(rng.randrange(len(sizes) + 1), rng.choice([1, 100, 512, 513, 70_000, 2**20]))
    fate = [rng.choice(["self", "next", "next", "end"]) for _ in sizes]
    first_only = rng.random() < 0.9  # the first micro-batch allocates what later ones accumulate into
    step = StepEvents()
    step.begin("start")
    previous: list[int] = []
    kept: list[int] = []
    for k in range(count):
        step.begin(f"pre@{k}")
        made = []
        for size, what in zip(sizes, fate, strict=True):
            key = step.alloc(size)
            made.append(key)
            if what == "self":
                step.free(key)
            elif what == "end" and (k == 0 or not first_only):
                kept.append(key)
            elif what == "end":
                step.free(key)
        for key, what in zip(previous, fate, strict=False):  # none before the first
            if what == "next":
                step.free(key)
        previous = made
    step.begin("opt")
    for key, what in zip(previous, fate, strict=False):  # none before the first
        if what == "next":
            step.free(key)
    for key in kept:
        step.free(key)
    step.begin("zero")
    return step


def with_state(step: StepEvents, sizes: list[int], *, transient: int = 0) -> StepEvents:
    """``step`` as a first step: its optimizer segment also makes the optimizer state (``sizes``), kept for good, after
    ``transient`` bytes allocated and freed (the first step's peak: above any later step's, when large)."""
    at, _, end = step._segment_at("opt")
    key = step.next_key
    made = [(ALLOC, key, transient), (FREE, key, 0)] if transient else []
    made += [(ALLOC, key + 1 + i, n) for i, n in enumerate(sizes)]
    return StepEvents([*step.events[:end], *made, *step.events[end:]],
                      [*step.bounds[: at + 1], *((i + len(made), name) for i, name in step.bounds[at + 1:])],
                      next_key=key + 1 + len(sizes))
