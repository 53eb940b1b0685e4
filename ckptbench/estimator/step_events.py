"""One training step's ordered requests (``StepEvents``), its segment labels, and a step copied from a full trace.

estimator/event_assembly.py builds a full model's step from a short trace into a ``StepEvents``;
``traced_step`` takes one straight from a trace of the whole model; estimator/replay.py replays either.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field

from ckptbench.estimator.events import ALLOC
from ckptbench.estimator.trace import StepTrace

FullEvent = tuple[int, int, int]  # (op, key, nbytes)


class AssemblyError(Exception):
    """The short trace has a free this assembly does not know how to place (use the full trace)."""


@functools.lru_cache(maxsize=4096)
def parse_label(label: str) -> tuple[str, int | None, int | None]:
    """'bwd:3@1' -> ('bwd', 3, 1); 'head@0' -> ('head', None, 0); 'zero' -> ('zero', None, None)."""
    body, _, micro = label.partition("@")
    kind, _, index = body.partition(":")
    return kind, int(index) if index else None, int(micro) if micro else None


def make_label(kind: str, layer: int | None, micro: int | None) -> str:
    body = kind if layer is None else f"{kind}:{layer}"
    return body if micro is None else f"{body}@{micro}"


@dataclass
class StepEvents:
    """One training step's requests, keys unique within the step, with the segment each starts."""

    events: list[FullEvent] = field(default_factory=list)
    bounds: list[tuple[int, str]] = field(default_factory=list)  # (index of the first event, label)
    workspaces: set[int] = field(default_factory=set)
    next_key: int = 0

    def begin(self, label: str) -> None:
        self.bounds.append((len(self.events), label))

    def alloc(self, nbytes: int, *, workspace: bool = False) -> int:
        key = self.next_key
        self.next_key += 1
        self.events.append((ALLOC, key, nbytes))
        if workspace:
            self.workspaces.add(key)
        return key

    def free(self, key: int) -> None:
        self.events.append((1, key, 0))

    def add_optimizer(self, events: Sequence[tuple[int, int, int]]) -> None:
        """The whole model's optimizer step, traced apart: its own allocations and frees."""
        self.begin("opt")
        own: dict[int, int] = {}
        for op, eid, nbytes in events:
            if op == ALLOC:
                own[eid] = self.alloc(nbytes)
            elif eid in own:
                self.free(own.pop(eid))
            else:
                raise AssemblyError("the optimizer step frees a tensor it did not allocate")

    def _segment_at(self, label: str) -> tuple[int, int, int]:
        """(position in ``bounds``, first event, end event) of segment ``label``."""
        for i, (start, name) in enumerate(self.bounds):
            if name == label:
                end = self.bounds[i + 1][0] if i + 1 < len(self.bounds) else len(self.events)
                return i, start, end
        raise KeyError(label)

    def keys_made_in(self, label: str) -> set[int]:
        """Keys allocated in segment ``label`` (the optimizer step's: its state on the first step)."""
        _, start, end = self._segment_at(label)
        return {key for op, key, _ in self.events[start:end] if op == ALLOC}

    def with_optimizer(self, optimizer_step: Sequence[tuple[int, int, int]]) -> StepEvents:
        """The same step with another optimizer step (the first one, which creates the state)."""
        at, start, end = self._segment_at("opt")
        out = StepEvents(list(self.events[:start]), list(self.bounds[:at]), set(self.workspaces), self.next_key)
        out.add_optimizer(optimizer_step)
        shift = len(out.events) - end
        out.events += self.events[end:]
        out.bounds += [(i + shift, name) for i, name in self.bounds[at + 1 :]]
        return out


def segment_events(
    trace: StepTrace, label: str, *, exclude: frozenset[int] = frozenset()
) -> list[tuple[int, int, int]]:
    """The (op, id, nbytes) events of one segment of a trace (e.g. the optimizer trace's 'opt')."""
    return [
        (op, eid, nbytes) for op, eid, nbytes, seg in trace.events
        if seg >= 0 and trace.labels[seg] == label and eid not in exclude
    ]


def traced_step(trace: StepTrace, optimizer_step: Sequence[tuple[int, int, int]] | None = None) -> StepEvents:
    """A fully traced step's events from 'start' to 'zero' (its own optimizer step unless one is given)."""
    out, keys = StepEvents(), dict[int, int]()
    by_segment: dict[int, list[tuple[int, int, int]]] = {}
    for op, eid, nbytes, seg in trace.events:
        by_segment.setdefault(seg, []).append((op, eid, nbytes))
    first = trace.labels.index("start")
    for seg in range(first, trace.labels.index("end", first)):
        label = trace.labels[seg]
        if label == "opt" and optimizer_step is not None:
            out.add_optimizer(optimizer_step)
            continue
        out.begin(label)
        for op, eid, nbytes in by_segment.get(seg, []):
            if op == ALLOC:
                keys[eid] = out.alloc(nbytes, workspace=eid in trace.workspaces)
            elif eid in keys:
                out.free(keys.pop(eid))
            else:
                raise AssemblyError(f"{label} frees a tensor that existed before the step")
    return out
