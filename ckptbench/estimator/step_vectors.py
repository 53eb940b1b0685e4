"""Per-category byte vectors of a traced step and the ``StepSegment`` (start, peak, end vectors) they describe.

No torch: estimator/tracker.py fills them while a step runs; estimator/assembly.py adds them up for a
model with more layers.
"""

from __future__ import annotations

from dataclasses import dataclass

from ckptbench.estimator.record import CATEGORIES

PARAMS, GRADS, OPTIMIZER_STATE, ACTIVATIONS, LOGITS_LOSS, TRANSIENT, OTHER = range(len(CATEGORIES))

Vector = tuple[int, ...]


@dataclass(frozen=True)
class StepSegment:
    """One stretch of the step: byte vectors (one entry per category) at its start, its peak and its end."""

    label: str
    start: Vector
    peak: Vector
    end: Vector

    @property
    def rise(self) -> Vector:
        """The peak above the start, per category."""
        return tuple(p - s for p, s in zip(self.peak, self.start, strict=True))

    @property
    def delta(self) -> Vector:
        """What the segment leaves behind (end minus start), per category."""
        return tuple(e - s for e, s in zip(self.end, self.start, strict=True))


def is_layer(label: str) -> bool:
    """Whether a segment label is a decoder layer's forward or backward ('fwd:3@0', 'bwd:3@0')."""
    return label.startswith(("fwd:", "bwd:"))


def add(a: Vector, b: Vector, scale: int = 1) -> Vector:
    """Element-wise ``a + scale * b``."""
    return tuple(x + scale * y for x, y in zip(a, b, strict=True))


def only(category: int, nbytes: int) -> Vector:
    """A byte vector holding ``nbytes`` in ``category`` and nothing elsewhere."""
    vec = [0] * len(CATEGORIES)
    vec[category] = nbytes
    return tuple(vec)
