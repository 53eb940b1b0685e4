"""Fast path of the estimator: per-layer costs from a short model, re-assembled for a full one.

Decoder layers are identical, so one traced step of a *short* model (same widths, one layer per
checkpoint class a config needs: none, block, attn, mlp, attn+mlp, selective) gives, for each
class, how far the live bytes rise inside one layer's forward and backward and what each leaves
behind. ``assemble`` walks the full model's step in execution order (embedding, layer forwards
0..L-1, loss head, layer backwards L-1..0, embedding backward, per micro-batch; then optimizer
step and zero_grad), keeping the running level per category and its maximum. Which layers are
checkpointed decides where the peak falls: at the loss when activations dominate, inside the
backward of an early layer once most gradients exist, or in the optimizer step.

The short model's layers are [c0, c0, c1, ..., cm, c0]; positions 1..m give each class's cost.
Three things do not belong to one layer and are placed explicitly:

- the first and last layers differ slightly from middle ones (their input is the embedding,
  their output goes to the final norm): corrections = boundary layer minus middle layer of c0;
- tensors every layer receives (rotary tables, position ids, an eager attention mask) are freed
  by the lowest layer that holds them, or when the forward returns if none does. The short
  model, whose classes are ordered so that classes that hold fewer of them come first, shows
  which classes hold each; the full model frees it after the backward of its lowest such layer;
- bytes a layer allocates but a later non-layer segment frees (autocast's per-layer cast weights,
  freed when the forward's autocast exits) scale with the number of layers of each class.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ckptbench.config.layouts import LayoutPlan, parse_layout
from ckptbench.estimator.step_trace import StepSegment, StepTrace, Vector, add
from ckptbench.train.flops import OpCosts

# Ordered so that classes holding fewer shared tensors come first (see the module docstring).
CLASS_ORDER: tuple[str, ...] = ("none", "mlp", "attn", "attn+mlp", "block", "selective")
GLOBALS: tuple[str, ...] = ("pre", "head", "logits", "exit", "back", "tail")
ZERO: Vector = (0,) * 7


def layer_classes(plan: LayoutPlan) -> list[str]:
    """The checkpoint class of every decoder layer: 'none' or the plan's granularity."""
    chosen = set(plan.layers)
    return [plan.granularity if i in chosen else "none" for i in range(plan.num_layers)]


def short_model_classes(needed: set[str]) -> list[str]:
    """Layer classes of the short model that measures ``needed``: [c0, c0, c1, ..., c0]."""
    ordered = [c for c in CLASS_ORDER if c in needed]
    return [ordered[0], *ordered, ordered[0]]


def plans_for(classes: Sequence[str]) -> list[LayoutPlan]:
    """One layout plan per checkpointed class, together realising a per-layer class list."""
    plans = []
    for granularity in CLASS_ORDER[1:]:
        layers = [i for i, c in enumerate(classes) if c == granularity]
        if layers:
            plans.append(parse_layout(f"layers:{','.join(map(str, layers))}@{granularity}", len(classes)))
    return plans


@dataclass(frozen=True)
class Step:
    """A segment reduced to what assembly needs: its rise above its start and its net change."""

    rise: Vector
    delta: Vector

    @classmethod
    def of(cls, seg: StepSegment) -> Step:
        return cls(seg.rise, seg.delta)

    def shifted(self, other: Step, scale: int = 1) -> Step:
        return Step(add(self.rise, other.rise, scale), add(self.delta, other.delta, scale))

    def freeing(self, freed: Vector, scale: int = 1) -> Step:
        """The same step with ``scale`` times ``freed`` more bytes freed (after its peak)."""
        return Step(self.rise, add(self.delta, freed, -scale))


def _split(label: str) -> tuple[str, int | None]:
    """'bwd:3@0' -> ('bwd', 3); 'head@0' -> ('head', None)."""
    kind, _, index = label.partition("@")[0].partition(":")
    return kind, int(index) if index else None


@dataclass(frozen=True)
class LayerCosts:
    """Costs of one micro-batch (the first, or any later one) measured on a short model."""

    globals: dict[str, Step]  # GLOBALS, without the middle layers' crossing frees
    fwd: dict[str, Step]
    bwd: dict[str, Step]
    crossing: dict[tuple[str, str], Vector]  # (global segment, class) -> bytes a middle layer frees there
    c0: str  # the class of the short model's first and last layers
    first: tuple[Step, Step]  # boundary corrections (forward, backward): layer 0 minus a middle layer
    last: tuple[Step, Step]
    releases: tuple[tuple[frozenset[str] | str, Vector], ...]  # shared frees: holder classes, or a segment
    holds_input: dict[str, bool]  # whether a layer of the class keeps its input until its backward
    input0: tuple[Vector, str]  # layer 0's input, and where it is freed when layer 0 does not hold it

    @classmethod
    def from_trace(cls, trace: StepTrace, classes: Sequence[str], micro: int) -> LayerCosts:
        def get(label: str) -> Step:
            return Step.of(trace.get(f"{label}@{micro}"))

        last, c0 = len(classes) - 1, classes[0]
        middle = {c: i for i, c in reversed(list(enumerate(classes))) if 0 < i < last}
        fwd = {c: get(f"fwd:{i}") for c, i in middle.items()}
        bwd = {c: get(f"bwd:{i}") for c, i in middle.items()}
        glob, crossing = _crossings(trace, classes, micro, {g: get(g) for g in GLOBALS})
        frees = dict(trace.input_frees)
        holds = {c: frees[i][0].startswith("bwd") for c, i in middle.items()}
        x = frees[middle[c0]][1]
        # Layer 0 never frees its input itself; a middle layer frees it in its forward or its backward.
        first = (
            get("fwd:0").shifted(fwd[c0], -1).freeing(x, int(not holds[c0])),
            get("bwd:0").shifted(bwd[c0], -1).freeing(x, int(holds[c0])),
        )
        input0 = _micro_releases(trace, micro, "input0")
        return cls(
            globals=glob,
            fwd=fwd,
            bwd=bwd,
            crossing=crossing,
            c0=c0,
            first=first,
            last=(get(f"fwd:{last}").shifted(fwd[c0], -1), get(f"bwd:{last}").shifted(bwd[c0], -1)),
            releases=tuple(_placement(label, vec, classes) for label, vec in _micro_releases(trace, micro, "shared")),
            holds_input=holds,
            input0=(input0[0][1], "head" if holds[c0] else _split(input0[0][0])[0]) if input0 else (ZERO, "head"),
        )

    def named_steps(self, classes: Sequence[str], micro: int) -> list[tuple[str, Step]]:
        """This micro-batch's segments for a model with these layer classes, in execution order."""
        n = len(classes)
        fwd = [self.fwd[c] for c in classes]
        bwd = [self.bwd[c] for c in classes]
        holds0 = int(self.holds_input[classes[0]])
        fwd[0] = fwd[0].shifted(self.first[0]).freeing(self.input0[0], holds0 - 1)
        bwd[0] = bwd[0].shifted(self.first[1]).freeing(self.input0[0], -holds0)
        fwd[n - 1], bwd[n - 1] = fwd[n - 1].shifted(self.last[0]), bwd[n - 1].shifted(self.last[1])
        glob = dict(self.globals)
        for (kind, cls_), vec in self.crossing.items():
            # Middle layers free their share; a first/last layer of another class than c0 the difference.
            count = sum(1 for c in classes[1 : n - 1] if c == cls_)
            count += sum((classes[b] == cls_) - (self.c0 == cls_) for b in sorted({0, n - 1}))
            glob[kind] = glob[kind].freeing(vec, count)
        named = [("pre", glob["pre"]), *((f"fwd:{i}", fwd[i]) for i in range(n))]
        named += [(g, glob[g]) for g in ("head", "logits", "exit", "back")]
        named += [(f"bwd:{i}", bwd[i]) for i in reversed(range(n))]
        named.append(("tail", glob["tail"]))
        releases = self._releases_after(classes)
        return [(f"{label}@{micro}", step.freeing(releases[label]) if label in releases else step)
                for label, step in named]

    def _releases_after(self, classes: Sequence[str]) -> dict[str, Vector]:
        """Shared frees placed in the full model: after the backward of its lowest holding layer."""
        vec0, where0 = self.input0
        placed = [("bwd:0" if self.holds_input[classes[0]] else where0, vec0)]
        for where, vec in self.releases:
            if isinstance(where, str):
                placed.append((where, vec))
            else:
                holders = [i for i, c in enumerate(classes) if c in where]
                placed.append((f"bwd:{holders[0]}" if holders else "head", vec))  # head: the stack returns
        out: dict[str, Vector] = {}
        for label, vec in placed:
            out[label] = add(out.get(label, ZERO), vec)
        return out


def _micro_releases(trace: StepTrace, micro: int, kind: str) -> list[tuple[str, Vector]]:
    return [(label, vec) for label, vec, k in trace.releases if k == kind and label.endswith(f"@{micro}")]


def _crossings(
    trace: StepTrace, classes: Sequence[str], micro: int, glob: dict[str, Step]
) -> tuple[dict[str, Step], dict[tuple[str, str], Vector]]:
    """Take the frees of middle layers' bytes out of the global segments, and keep them per class."""
    last = len(classes) - 1
    crossing: dict[tuple[str, str], Vector] = {}  # the short model's middle classes are distinct
    for (freed_in, allocated_in), vec in trace.crossings:
        kind, _ = _split(freed_in)
        _, j = _split(allocated_in)
        if not freed_in.endswith(f"@{micro}") or kind not in glob or j is None or not 0 < j < last:
            continue
        glob[kind] = glob[kind].freeing(vec, -1)  # as if the short model's middle layers kept it
        crossing[(kind, classes[j])] = add(crossing.get((kind, classes[j]), ZERO), vec)
    return glob, crossing


def _placement(label: str, vec: Vector, classes: Sequence[str]) -> tuple[frozenset[str] | str, Vector]:
    """Where a shared tensor freed in short segment ``label`` is freed in another layout.

    Freed in the backward of short layer j: layers of its class hold it, layers below j do not,
    and the classes only found above j are assumed to hold it too. Freed elsewhere: no layer does.
    """
    kind, j = _split(label)
    if kind in GLOBALS:
        return kind, vec
    if kind != "bwd" or j is None:
        return frozenset(), vec  # freed during the forward: no layer holds it
    below = set(classes[:j])
    return frozenset({classes[j], *classes[j + 1 :]} - below), vec


@dataclass(frozen=True)
class StepCosts:
    """A short model's step reduced to reusable parts: the first micro-batch, and a later one if traced."""

    start: Vector  # live bytes when the step starts
    static: Vector  # of which the model, its optimizer state and workspaces (replaced by the full model's)
    retained: Vector  # what one step leaves for the next (the returned loss): the same for any depth
    begin: Step
    micro: tuple[LayerCosts, ...]

    @classmethod
    def from_trace(cls, trace: StepTrace, classes: Sequence[str], micro_batches: int) -> StepCosts:
        micro = tuple(LayerCosts.from_trace(trace, classes, k) for k in range(micro_batches))
        retained = add(trace.segments[-1].end, trace.start, -1)
        return cls(trace.start, trace.static, retained, Step.of(trace.get("start")), micro)


@dataclass(frozen=True)
class Peak:
    """Bytes per category at a step's peak, where it happens, and bytes each step leaves behind."""

    vector: Vector
    label: str
    retained: Vector

    @classmethod
    def of_trace(cls, trace: StepTrace) -> Peak:
        """The peak of a fully traced step."""
        best = max(trace.segments, key=lambda seg: sum(seg.peak))
        return cls(best.peak, best.label, add(trace.segments[-1].end, trace.start, -1))

    def after_steps(self, steps: int) -> Vector:
        """The peak over ``steps`` identical steps (what each step keeps adds up, like the losses)."""
        return add(self.vector, self.retained, max(steps - 1, 0))


def assemble(costs: StepCosts, optimizer: StepTrace, classes: Sequence[str], micro_batches: int = 1) -> Peak:
    """The peak of a full model's step whose decoder layers have these checkpoint classes.

    Micro-batches after the first accumulate into existing gradients, so they reuse the costs
    of the short model's second micro-batch.
    """
    start = add(costs.start, add(optimizer.static, costs.static, -1))
    walk = _Walk(start)
    walk.through([("start", costs.begin)])
    for k in range(min(micro_batches, 2)):
        walk.through(costs.micro[min(k, len(costs.micro) - 1)].named_steps(classes, k))
    if micro_batches > 2:
        # Micro-batches 1, 2, ... take the same steps: each moves the level by the same vector. Rising, only the
        # last can hold the peak (each step of it is above the same step of any before); else the first did.
        later, before = costs.micro[-1], walk.level
        rise = add(before, walk.level_before_last_micro, -1)
        if sum(rise) > 0:
            walk.level = add(before, rise, micro_batches - 3)
            walk.through(later.named_steps(classes, micro_batches - 1))
        else:
            walk.level = add(before, rise, micro_batches - 2)
    walk.through([("opt", Step.of(optimizer.get("opt"))), ("zero", Step.of(optimizer.get("zero")))])
    return Peak(walk.peak, walk.where, costs.retained)


class _Walk:
    """The level and the first highest point of a step walked segment by segment."""

    def __init__(self, start: Vector) -> None:
        self.level, self.peak, self.where = start, start, "start"
        self.level_before_last_micro = start

    def through(self, named: Sequence[tuple[str, Step]]) -> None:
        self.level_before_last_micro = self.level
        level, peak, where = self.level, self.peak, self.where
        level_sum, peak_sum = sum(level), sum(peak)  # (integers: a sum of sums is the sum of the sum)
        for label, step in named:
            rise = step.rise
            if level_sum + sum(rise) > peak_sum:  # the level plus the step's rise, made only for a new peak
                peak, where = add(level, rise), label
                peak_sum = sum(peak)
            delta = step.delta
            level = add(level, delta)
            level_sum += sum(delta)
        self.level, self.peak, self.where = level, peak, where


def assemble_ops(
    trace: StepTrace, short: Sequence[str], optimizer: StepTrace, classes: Sequence[str], micro_batches: int = 1
) -> OpCosts:
    """Every op of a full model's step whose decoder layers have these checkpoint classes, from a short model's
    trace (``short``: its layer classes) and the whole model's optimizer trace: what the step-time model times.

    As ``assemble`` walks the bytes: each layer's forward and backward segments are those of the short model's
    middle layer of its class (a checkpointed layer's backward holds its recomputed forward), the first and last
    layers corrected by the short model's boundary layers less its middle layer of their class, the segments
    before and after the layers once per micro-batch (micro-batches after the first as the short model's second),
    then the optimizer step and zero_grad.
    """
    last, c0 = len(short) - 1, short[0]
    middle = {c: i for i, c in reversed(list(enumerate(short))) if 0 < i < last}
    parts: list[tuple[OpCosts, int]] = [(trace.ops("start"), 1)]
    traced = min(micro_batches, 2)
    for k in range(traced):
        times = 1 if k == 0 else micro_batches - 1
        at = f"@{k}"
        parts += [(trace.ops(g + at), times) for g in GLOBALS]
        for c in sorted(set(classes)):
            n = sum(1 for x in classes if x == c) * times
            parts += [(trace.ops(f"fwd:{middle[c]}{at}"), n), (trace.ops(f"bwd:{middle[c]}{at}"), n)]
        for short_layer in (0, last):  # the full model's first and last layers (it has more than three)
            for kind in ("fwd", "bwd"):
                boundary, typical = trace.ops(f"{kind}:{short_layer}{at}"), trace.ops(f"{kind}:{middle[c0]}{at}")
                parts += [(boundary, times), (typical, -times)]
    parts += [(optimizer.ops("opt"), 1), (optimizer.ops("zero"), 1)]
    return OpCosts.of(parts)


def trace_ops(trace: StepTrace) -> OpCosts:
    """Every op of a fully traced step (its own optimizer step included)."""
    return OpCosts.of((costs, 1) for _, costs in trace.op_costs)


def describe_segment(label: str) -> str:
    """Human words for a segment label such as 'bwd:3@0'."""
    label, _, micro = label.partition("@")
    kind, _, index = label.partition(":")
    words = {
        "start": "start of the step",
        "pre": "forward, before the decoder layers",
        "head": "final norm",
        "logits": "forward of the loss and logits",
        "exit": "end of the forward",
        "back": "backward of the loss and logits",
        "tail": "embedding backward",
        "opt": "optimizer step",
        "zero": "zero_grad",
        "fwd": f"forward of layer {index}",
        "bwd": f"backward of layer {index}",
    }
    text = words.get(kind, label)
    return f"{text} (micro-batch {int(micro) + 1})" if micro and micro != "0" else text
