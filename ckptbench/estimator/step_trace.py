"""What a traced training step leaves behind, as plain data: its segments' byte vectors, its allocation events and its
ops (``StepTrace``), with the vocabulary of byte vectors (one entry per memory category). No torch: traces kept on
disk (estimator/trace_cache.py) are read, assembled and replayed without importing torch or transformers; only
tracing one (estimator/trace.py, estimator/tracker.py) needs them."""

from __future__ import annotations

import operator
from dataclasses import dataclass

from ckptbench.estimator.events import Event
from ckptbench.estimator.record import CATEGORIES
from ckptbench.train.flops import NO_OPS, OpCosts

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
    """Element-wise ``a + scale * b`` (the assembly adds hundreds of thousands of them per question: map, not a
    generator)."""
    if len(a) != len(b):
        raise ValueError(f"byte vectors of {len(a)} and {len(b)} categories")
    return tuple(map(operator.add, a, b)) if scale == 1 else tuple(x + scale * y for x, y in zip(a, b, strict=True))


def only(category: int, nbytes: int) -> Vector:
    """A byte vector holding ``nbytes`` in ``category`` and nothing elsewhere."""
    vec = [0] * len(CATEGORIES)
    vec[category] = nbytes
    return tuple(vec)


@dataclass(frozen=True)
class StepTrace:
    """The segments of one traced training step (see the module docstring for their labels)."""

    segments: tuple[StepSegment, ...]
    static: Vector  # live bytes of the model, its optimizer state (and kept gradients) and workspaces
    releases: tuple[tuple[str, Vector, str], ...] = ()  # deferred frees (StepTracker.share)
    crossings: tuple[tuple[tuple[str, str], Vector], ...] = ()  # StepTracker.crossings
    input_frees: tuple[tuple[int, tuple[str, Vector]], ...] = ()  # StepTracker.input_frees
    events: tuple[Event, ...] = ()  # every allocation and free, in order (estimator/events.py)
    labels: tuple[str, ...] = ()  # segment labels, indexed by an event's segment number
    workspaces: frozenset[int] = frozenset()  # event ids of kernel scratch buffers
    release_events: tuple[tuple[str, str, int], ...] = ()  # StepTracker.release_events
    roles: tuple[tuple[int, str], ...] = ()  # StepTracker.roles: (event id, producing segment)
    build: tuple[int, ...] = ()  # bytes of each parameter and buffer, in the order a build allocates them
    host: frozenset[int] = frozenset()  # event ids of tensors that live in host memory on the target
    # Each segment's ops: class, FLOPs and bytes (estimator/op_costs.py), in the order the segments opened.
    op_costs: tuple[tuple[str, OpCosts], ...] = ()

    def ops(self, label: str) -> OpCosts:
        """The ops of the segment ``label`` (none when it ran no op)."""
        return dict(self.op_costs).get(label, NO_OPS)

    def get(self, label: str) -> StepSegment:
        for seg in self.segments:
            if seg.label == label:
                return seg
        raise KeyError(label)

    @property
    def start(self) -> Vector:
        return self.segments[0].start
