"""One training step's ordered requests (``StepEvents``, labelled by segment), and a full model's, rebuilt from a
short model's trace (the replay's fast path).

The byte model (estimator/assembly.py) re-assembles per-layer byte vectors; the allocator replay
needs every request in execution order. Decoder layers of one checkpoint class issue the same
requests, so each full-model segment copies the events of a *template*: the short model's segment of
the same kind (global segments) or of a layer of the same class (layer 0 and the last layer take the
short model's boundary layers when their class is the short model's first class, else a middle
layer of their class). Each free is then pointed at the full model's allocation it frees:

- allocated in the same segment, or in the same layer's forward (saved activations): the copy's own;
- a *role*: the output of the layer below (a layer's input), or the gradient coming from above (the
  final norm's backward for the top layer): the output of the full model's neighbour;
- a tensor every layer receives (rotary tables, position ids) or layer 0's input, whose free depends
  on which layers hold it: placed as estimator/assembly.py places it (``_placement``), at the end of
  the segment where it is freed (the trace defers these frees to a segment's end for that reason);
- a layer's allocation freed in a global segment (weight gradients at zero_grad, autocast's cast
  weights when the forward's autocast exits): one free per full layer of that template, in layer order.

Micro-batches after the first copy the short model's second micro-batch. The optimizer step comes
from a trace of the whole model's optimizer (estimator/trace.py, ``trace_optimizer``). The step's
container (``StepEvents``), its labels and a fully traced step are estimator/event_assembly.py's.
"""

from __future__ import annotations

import functools
from array import array
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ckptbench.estimator.events import ALLOC, FREE
from ckptbench.estimator.step_trace import StepTrace

# How the assembler copies a template event (ShortTemplate.program): the C loop's codes (_replay_native.c).
COPY_ALLOC, COPY_LOCAL, COPY_PLACED, COPY_FORWARD = range(4)
# How the assembler places a free the copies leave to it (ShortTemplate.rules): its rule, the kind, layer and
# micro-batch of the segment that made the tensor, the index of its role, and the error where none places it.
Rule = tuple[int, str, int | None, int | None, int, str | None]
_MISSING, _CROSSING, _ROLE, _OTHER = range(4)


class ShortTemplate:
    """A short model's trace prepared for copying: events per segment, roles, shared frees."""

    def __init__(self, trace: StepTrace, classes: Sequence[str], micro_batches: int) -> None:
        self.classes, self.micro_batches = list(classes), micro_batches
        self.last = len(classes) - 1
        self.segments: dict[str, list[tuple[int, int, int]]] = {}
        self.alloc_at: dict[int, str] = {}
        self.workspaces = trace.workspaces
        for op, eid, nbytes, seg in trace.events:
            label = trace.labels[seg] if seg >= 0 else "PRE"
            self.segments.setdefault(label, []).append((op, eid, nbytes))
            if op == ALLOC:
                self.alloc_at[eid] = label
        self.released = {eid for _, _, eid in trace.release_events}
        self.releases = list(trace.release_events)
        self.outputs = self._roles(trace)
        self.role = {eid: (label, i) for label, eids in self.outputs.items() for i, eid in enumerate(eids)}
        self.middle = {c: i for i, c in reversed(list(enumerate(classes))) if 0 < i < self.last}
        self._holds: dict[str, bool] = {}
        self._programs: dict[str, list[tuple[int, int, int, bool]]] = {}
        self._crossings: dict[str, dict[int, list[tuple[str, int | None, int]]]] = {}
        self._rules: dict[str, dict[int, Rule]] = {}
        self._native: bytes | bool | None = False  # native_tables, made once (False: not yet)

    def native(self) -> bytes | None:
        """``native_tables`` of this template, made once."""
        if self._native is False:
            self._native = native_tables(self)
        return self._native if isinstance(self._native, bytes) else None

    def program(self, template: str) -> list[tuple[int, int, int, bool]]:
        """Segment ``template``'s events as the assembler copies them: ``(COPY_ALLOC, id, bytes, workspace)``;
        ``(COPY_LOCAL, id, 0, False)``, a free of an allocation of the same segment that hands nothing on (the
        copy's own); ``(COPY_FORWARD, id, 0, False)``, a layer's backward freeing what the same layer's forward of
        the same micro-batch saved (the copy's forward's: the most common free the rules would place);
        ``(COPY_PLACED, id, 0, False)``, any other free, placed by the assembler's rules. The frees of shared tensors
        (``released``) are left out: the assembler places them at a segment's end."""
        found = self._programs.get(template)
        if found is None:
            found = self._programs[template] = [
                (COPY_ALLOC, eid, nbytes, eid in self.workspaces) if op == ALLOC
                else (COPY_LOCAL, eid, 0, False) if self.alloc_at.get(eid) == template and eid not in self.role
                else (COPY_FORWARD, eid, 0, False) if self._forward_free(template, eid)
                else (COPY_PLACED, eid, 0, False)
                for op, eid, nbytes in self.segments.get(template, [])
                if op == ALLOC or eid not in self.released
            ]
        return found

    def _forward_free(self, template: str, eid: int) -> bool:
        """Whether a free in ``template`` is of an allocation (no role) of the same layer's forward, same micro-batch:
        what the rules place in the copy's forward (``EventAssembler._place_free``'s same-layer rule)."""
        kind, layer, micro = parse_label(template)
        made = self.alloc_at.get(eid)
        return (kind == "bwd" and layer is not None and made is not None and eid not in self.role
                and parse_label(made) == ("fwd", layer, micro))

    @staticmethod
    def _roles(trace: StepTrace) -> dict[str, list[int]]:
        """Per producing segment, the allocations it hands on (a layer's output, a gradient going down)."""
        outputs: dict[str, list[int]] = {}
        for eid, label in trace.roles:
            outputs.setdefault(label, []).append(eid)
        return outputs

    def template_layer(self, j: int, full: Sequence[str]) -> int:
        """The short layer whose events full layer ``j`` copies."""
        c0 = self.classes[0]
        if j == 0 and full[0] == c0:
            return 0
        if j == len(full) - 1 and full[j] == c0:
            return self.last
        return self.middle[full[j]]

    def rules(self, template: str) -> dict[int, Rule]:
        """What places each free ``program(template)`` leaves to the assembler, by id (made once per segment): the
        rule (a layer allocation freed in a global segment, expanded per full layer; a role, the output of the layer
        below or the gradient from above; any other, the same layer's forward or a global segment), where the tensor
        was made, the role's index, and the error to raise where no rule can place it."""
        found = self._rules.get(template)
        if found is None:
            found = self._rules[template] = {}
            _, consumer, _ = parse_label(template)
            for code, eid, _, _ in self.program(template):
                if code != COPY_PLACED:
                    continue
                made = self.alloc_at.get(eid)
                if made is None:
                    missing = f"{template} frees a tensor that existed before the step"
                    found[eid] = (_MISSING, "", None, None, -1, missing)
                    continue
                kind, producer, micro = parse_label(made)
                if consumer is None and producer is not None and eid not in self.role:
                    found[eid] = (_CROSSING, kind, producer, micro, -1, None)
                elif eid in self.role:
                    expected = None if consumer is None or producer is None else \
                        consumer - 1 if kind == "fwd" else consumer + 1
                    error = (f"layer {consumer} frees what layer {producer} handed on"
                             if expected is not None and producer != expected else None)
                    found[eid] = (_ROLE, kind, producer, micro, self.role[eid][1], error)
                else:
                    found[eid] = (_OTHER, kind, producer, micro, -1, None)
        return found

    def crossing_frees(self, template: str) -> dict[int, list[tuple[str, int | None, int]]]:
        """The frees in segment ``template`` of layer allocations (its rules' crossings), which the assembler expands
        per full layer, by the short layer that made them: (kind, micro-batch, id) in the segment's order."""
        found = self._crossings.get(template)
        if found is None:
            found = self._crossings[template] = {}
            for eid, (how, kind, layer, micro, _, _) in self.rules(template).items():  # in the program's order
                if how == _CROSSING and layer is not None:
                    found.setdefault(layer, []).append((kind, micro, eid))
        return found

    def holds_input(self, cls: str) -> bool:
        """Whether a (middle) layer of the class keeps its input until its backward."""
        if cls not in self._holds:
            t = self.middle[cls]
            eids = self.outputs.get(make_label("fwd", t - 1, 0), [])
            self._holds[cls] = any(self._freed_in_bwd(eid, t) for eid in eids)
        return self._holds[cls]

    def _freed_in_bwd(self, eid: int, layer: int) -> bool:
        return any(op != ALLOC and key == eid for op, key, _ in self.segments.get(make_label("bwd", layer, 0), []))


# The kinds of segment the C assembler knows (_replay_native.c's K_*): any other label is K_OTHER (never looked up).
_KINDS = {"start": 0, "pre": 1, "fwd": 2, "head": 3, "logits": 4, "exit": 5, "back": 6, "bwd": 7, "tail": 8, "zero": 9}
_K_OTHER = len(_KINDS)
_HEADER = 16  # the tables' header: L, T, template count, id count, then the offsets of each table


def native_tables(tmpl: ShortTemplate) -> bytes | None:
    """The template as the C assembler reads it (``_replay_native.assemble``), int64: a header, each template
    segment's kind, layer and micro-batch (-1: none) and its id by (kind, layer, micro-batch), its program (COPY_ALLOC:
    bytes and workspace; COPY_LOCAL: the rank of the allocation it frees among the segment's allocations;
    COPY_FORWARD: the id; COPY_PLACED: its rule), the rules (how, kind, layer, micro-batch, role index, whether it
    raises, id), each segment's outputs (roles), its crossing frees by template layer, and each id's segment and
    rank. None where an id is negative (the C side indexes by id)."""
    labels = list(tmpl.segments)
    tid = {label: i for i, label in enumerate(labels)}
    meta: list[int] = []
    for label in labels:
        kind, layer, micro = parse_label(label)
        meta += [_KINDS.get(kind, _K_OTHER), -1 if layer is None else layer, -1 if micro is None else micro]
    L, T = len(tmpl.classes), tmpl.micro_batches
    rank: dict[int, tuple[int, int]] = {}
    for label in labels:
        allocs = 0
        for op, eid, _ in tmpl.segments[label]:
            if op == ALLOC:
                rank[eid] = (tid[label], allocs)
                allocs += 1
    tid_of = [-1] * (_K_OTHER + 1) * (L + 1) * (T + 1)
    for i in range(len(labels)):
        code, layer, micro = meta[3 * i : 3 * i + 3]
        if code != _K_OTHER and -1 <= layer < L and -1 <= micro < T:
            tid_of[(code * (L + 1) + layer + 1) * (T + 1) + micro + 1] = i
    prog_index: list[int] = []
    prog: list[int] = []
    rules: list[int] = []
    out_index: list[int] = []
    outs: list[int] = []
    cx_index: list[int] = []
    cx: list[int] = []
    ids: list[int] = list(rank)
    for label in labels:
        program, placed = tmpl.program(label), tmpl.rules(label)
        prog_index += [len(prog) // 4, len(program)]
        for code, eid, nbytes, workspace in program:
            ids.append(eid)
            if code == COPY_ALLOC:
                prog += [code, nbytes, int(workspace), 0]
            elif code == COPY_LOCAL:
                prog += [code, rank[eid][1], eid, 0]
            elif code == COPY_FORWARD:
                prog += [code, 0, eid, 0]
            else:
                how, kind, layer, micro, index, error = placed[eid]
                prog += [code, len(rules) // 7, eid, 0]
                rules += [how, _KINDS.get(kind, _K_OTHER), -1 if layer is None else layer,
                          -1 if micro is None else micro, index, int(error is not None), eid]
        found = tmpl.outputs.get(label, [])
        out_index += [len(outs), len(found)]
        outs += found
        ids += found
        crossings = tmpl.crossing_frees(label)
        for t in range(L):
            entries = crossings.get(t, [])
            cx_index += [len(cx) // 3, len(entries)]
            for kind, micro, eid in entries:
                cx += [_KINDS.get(kind, _K_OTHER), -1 if micro is None else micro, eid]
                ids.append(eid)
    ids += [eid for _, _, eid in tmpl.releases]
    if ids and min(ids) < 0:
        return None
    neid = max(ids, default=-1) + 1
    alloc = [-1, -1] * neid
    for eid, (t, r) in rank.items():
        alloc[2 * eid : 2 * eid + 2] = [t, r]
    parts = [tid_of, meta, prog_index, prog, rules, out_index, outs, cx_index, cx, alloc]
    header = [L, T, len(labels), neid]
    at = _HEADER
    for part in parts:
        header.append(at)
        at += len(part)
    header += [0] * (_HEADER - len(header))
    data = array("q", header)
    for part in parts:
        data.extend(part)
    return data.tobytes()


@functools.lru_cache(maxsize=64)
def segment_labels(n: int, micro: int) -> tuple[list[str], dict[str, int]]:
    """Every full segment's label by the C assembler's index (start, zero, then per micro-batch: pre, head, logits,
    exit, back, tail, each layer's forward, each layer's backward), and the index of each label."""
    labels = ["start", "zero"]
    for kk in range(micro):
        labels += [f"{g}@{kk}" for g in ("pre", "head", "logits", "exit", "back", "tail")]
        labels += [f"fwd:{j}@{kk}" for j in range(n)]
        labels += [f"bwd:{j}@{kk}" for j in range(n)]
    return labels, {label: i for i, label in enumerate(labels)}


def _native(name: str) -> Any:
    """A function of the C part (``_replay_native``: ``assemble``, ``EventAssembler.run`` in C; ``copy_program``, the
    copies of ``_segment``; ``shift_events``, ``_repeat``'s copy), or None where the C part is not used (not built,
    CKPTBENCH_NATIVE=0: read each time, tests switch it off)."""
    from ckptbench.estimator import allocator  # the C part, loaded and checked against its source there

    native = allocator.NATIVE
    return None if native is None else getattr(native, name)


class EventAssembler:
    """Copies a short model's events into one training step of a full model with these layer classes."""

    def __init__(self, template: ShortTemplate, full: Sequence[str], micro_batches: int) -> None:
        self.tmpl, self.full, self.n, self.micro = template, list(full), len(full), micro_batches
        self.layer_of = [template.template_layer(j, full) for j in range(self.n)]
        self.out = StepEvents()
        self.keys: dict[str, dict[int, int]] = {}  # full label -> {template event id: key}
        self.copy = _native("copy_program")
        self._placed: dict[str, list[tuple[str, str, int]]] = {}  # full label -> the releases freed at its end
        for kk in range(self.micro):
            tm = min(kk, template.micro_batches - 1)
            for where, what, eid in template.releases:
                if parse_label(where)[2] == tm:
                    self._placed.setdefault(self._placement(where, what, kk), []).append((where, what, eid))

    def run(self, optimizer_step: Sequence[tuple[int, int, int]], *, repeat: bool = True) -> StepEvents:
        """The step: start, every micro-batch, the optimizer step (given, whole model), zero_grad. ``repeat``:
        micro-batches from the fourth on copy the one before (``_repeat``) rather than their templates."""
        native = _native("assemble")
        tables = self.tmpl.native() if native is not None else None
        if tables is not None:
            labels, index = segment_labels(self.n, self.micro)
            releases = sorted(((index[label], eid) for label, placed in self._placed.items() if label in index
                               for _, _, eid in placed), key=lambda x: (x[0], -x[1]))
            found = native(tables, array("q", self.layer_of).tobytes(), self.micro, labels,
                           array("q", [v for pair in releases for v in pair]).tobytes(),
                           _optimizer_relative(optimizer_step)[0], repeat, ALLOC, FREE, "opt")
            if found is not None:  # else: the rules below raise where the C loop stopped (or copy what it cannot)
                packed, bounds, workspaces, next_key = found
                self.out = StepEvents(None, bounds, set(workspaces), next_key, packed=packed)
                return self.out
        out = self.out
        self._segment("start", "start")
        starts: list[tuple[int, int, int]] = []  # each micro-batch's first event, bound and key
        for kk in range(self.micro):
            starts.append((len(out.events), len(out.bounds), out.next_key))
            tm = min(kk, self.tmpl.micro_batches - 1)
            if repeat and kk >= 3 and tm == 1 and self._repeat(kk, starts):
                continue
            for label, template in self._micro_labels(kk, tm):
                self._segment(label, template)
        out.add_optimizer(optimizer_step)
        self._segment("zero", "zero")
        return out

    def _repeat(self, kk: int, starts: Sequence[tuple[int, int, int]]) -> bool:
        """Micro-batch ``kk`` as a copy of micro-batch ``kk - 1``, its keys moved on by the keys one micro-batch
        allocates; whether it was made so (the two before it allocated alike: else the rules copy it).

        The same as copying its templates: micro-batches from the second on copy the same templates (the short
        model's second micro-batch), and every free the rules place in one refers to a tensor made before the
        micro-batches (the same key in each) or in its own or the previous micro-batch (a key that many keys on:
        ``_micros`` counts micro-batches back from the one copied, the rules look no further back than one). From
        the fourth micro-batch on, the two before are both copies of the second template."""
        out = self.out
        (e_prev, b_prev, k_prev), (_, _, k_before) = starts[kk - 1], starts[kk - 2]
        step = out.next_key - k_prev  # keys micro-batch kk - 1 allocated
        if step != k_prev - k_before:
            return False
        events, bounds = out.events, out.bounds
        at, moved = len(events) - e_prev, f"@{kk}"
        copied = [(i + at, label.rpartition("@")[0] + moved) for i, label in bounds[b_prev:]]
        for (_, label), (_, new) in zip(bounds[b_prev:], copied, strict=True):
            self.keys[new] = {eid: key + step for eid, key in self.keys[label].items()}
        out.workspaces.update([key + step for key in out.workspaces if key >= k_prev])
        shift = _native("shift_events")
        if shift is not None:  # the same copies, in C
            shift(events, e_prev, k_before, step)
        else:
            events += [(op, key + step if key >= k_before else key, nbytes) for op, key, nbytes in events[e_prev:]]
        bounds += copied
        out.next_key += step
        return True

    def _micro_labels(self, kk: int, tm: int) -> list[tuple[str, str]]:
        pairs = [(f"pre@{kk}", f"pre@{tm}")]
        pairs += [(f"fwd:{j}@{kk}", f"fwd:{self.layer_of[j]}@{tm}") for j in range(self.n)]
        pairs += [(f"{g}@{kk}", f"{g}@{tm}") for g in ("head", "logits", "exit", "back")]
        pairs += [(f"bwd:{j}@{kk}", f"bwd:{self.layer_of[j]}@{tm}") for j in reversed(range(self.n))]
        return [*pairs, (f"tail@{kk}", f"tail@{tm}")]

    def _segment(self, label: str, template: str) -> None:
        tmpl, out = self.tmpl, self.out
        out.begin(label)
        own = self.keys[label] = {}
        events, workspaces = out.events, out.workspaces
        expanded = False
        program, copy, rules = tmpl.program(template), self.copy, tmpl.rules(template)
        where = parse_label(label)
        kind, layer, micro = where
        forward = self.keys.get(make_label("fwd", layer, micro)) if kind == "bwd" else None  # the same layer's
        i, n = 0, len(program)
        while i < n:
            if copy is not None:  # the copies in C, up to the next free placed by the rules below
                out.next_key, i = copy(program, i, events, own, workspaces, out.next_key, ALLOC, FREE, forward)
                if i >= n:
                    break
            code, eid, nbytes, workspace = program[i]  # StepEvents.alloc and .free, inlined
            i += 1
            if code == COPY_ALLOC:
                key = own[eid] = out.next_key
                out.next_key = key + 1
                events.append((ALLOC, key, nbytes))
                if workspace:
                    workspaces.add(key)
                continue
            if code == COPY_LOCAL:
                events.append((FREE, own[eid], 0))
                continue
            if code == COPY_FORWARD:
                if forward is None:
                    raise KeyError(make_label("fwd", layer, micro))
                events.append((FREE, forward[eid], 0))
                continue
            rule = rules[eid]
            if rule[0] == _CROSSING:
                if not expanded:
                    self._expand_crossings(label, template)
                    expanded = True
                continue
            for key in self._place_free(where, template, eid, rule):
                out.free(key)
        for key in self._releases_into(label):
            out.free(key)

    def _expand_crossings(self, label: str, template: str) -> None:
        """Each layer allocation ``template`` frees in a global segment, once per full layer of its template layer, in
        layer order (the frees of one layer in the template's order)."""
        by_layer = self.tmpl.crossing_frees(template)
        lm, tm = parse_label(label)[2], parse_label(template)[2]
        micros: dict[int | None, list[int | None]] = {}  # of each micro-batch an allocation was made in
        events, keys = self.out.events, self.keys
        for j in range(self.n):
            made: dict[tuple[str, int | None], dict[int, int]] = {}  # the keys of full layer j's segments
            for kind, micro, eid in by_layer.get(self.layer_of[j], ()):
                if micro not in micros:
                    micros[micro] = self._micros_at(lm, tm, micro)
                for m in micros[micro]:
                    found = made.get((kind, m))
                    if found is None:
                        found = made[(kind, m)] = keys[make_label(kind, j, m)]
                    events.append((FREE, found[eid], 0))

    def _micros_at(self, lm: int | None, tm: int | None, made_micro: int | None) -> list[int | None]:
        """The full micro-batches an allocation of template micro-batch ``made_micro`` stands for, in a full segment of
        micro-batch ``lm`` copying a template of micro-batch ``tm``."""
        if made_micro is None:
            return [None]
        if lm is not None and tm is not None:
            return [lm - (tm - made_micro)]
        last = self.tmpl.micro_batches - 1  # freed after every micro-batch (zero_grad): each later one too
        return [made_micro] if made_micro < last else list(range(made_micro, self.micro))

    def _place_free(self, where: tuple[str, int | None, int | None], template: str, eid: int, rule: Rule
                    ) -> list[int]:
        """The full keys one template free stands for in the full segment ``where`` (parsed), by its rule (none for
        layer 0's input: freed as 'input0')."""
        how, yk, yt, ym, index, error = rule
        if error is not None:
            raise AssemblyError(error)
        lk, lj, lm = where
        _, tt, tm = parse_label(template)
        micros = self._micros_at(lm, tm, ym)
        if how == _ROLE:
            return [k for m in micros for k in self._role(lk, lj, yk, index, m)]
        if yt is not None and yt == tt and lj is not None:  # the same layer's forward (saved activations)
            return [self.keys[make_label(yk, lj, m)][eid] for m in micros]
        if yt is None and tt is None:
            return [self.keys[make_label(yk, None, m)][eid] for m in micros]
        raise AssemblyError(f"no rule places a free in {template} of a tensor made in {make_label(yk, yt, ym)}")

    def _role(self, lk: str, lj: int | None, yk: str, index: int, micro: int | None) -> list[int]:
        if yk == "fwd":  # the layer below's output (the final norm takes the top layer's)
            below = lj - 1 if lj is not None else self.n - 1
            return [] if below < 0 else [self._output("fwd", below, micro, index)]
        above = lj + 1 if lj is not None else 0  # the gradient from above (the embedding's: layer 0's)
        if lk == "bwd" and above >= self.n:
            return [self._output("back", None, micro, index)]
        return [self._output("bwd", above, micro, index)]

    def _output(self, kind: str, j: int | None, micro: int | None, index: int) -> int:
        tm = None if micro is None else min(micro, self.tmpl.micro_batches - 1)
        template = make_label(kind, None if j is None else self.layer_of[j], tm)
        outputs = self.tmpl.outputs.get(template, [])
        if index >= len(outputs):
            raise AssemblyError(f"{template} has no output #{index}")
        return self.keys[make_label(kind, j, micro)][outputs[index]]

    def _releases_into(self, label: str) -> list[int]:
        """Keys of the shared tensors (and layer 0's input) freed at the end of full segment ``label``."""
        kk = parse_label(label)[2]
        if kk is None:
            return []
        tm = min(kk, self.tmpl.micro_batches - 1)
        keys: list[tuple[int, int]] = []
        for _, _, eid in self._placed.get(label, ()):  # those of micro-batch kk placed here (__init__)
            mk, ml, mm = parse_label(self.tmpl.alloc_at[eid])
            if ml is not None or mm is None:
                raise AssemblyError(f"a shared tensor made in {self.tmpl.alloc_at[eid]}")
            keys.append((eid, self.keys[make_label(mk, None, kk - (tm - mm))][eid]))
        # Freed together when the holder lets go of them (a checkpoint's saved inputs, the decoder's
        # locals): CPython drops a tuple's items last to first, so the last allocated goes first.
        return [key for _, key in sorted(keys, reverse=True)]

    def _placement(self, where: str, what: str, kk: int) -> str:
        """estimator/assembly.py's ``_placement`` and ``_releases_after``, for one free, in the full model."""
        kind, layer, _ = parse_label(where)
        if what == "input0":
            if self.tmpl.holds_input(self.full[0]):
                return f"bwd:0@{kk}"
            return f"{kind if layer is None else 'head'}@{kk}"
        if layer is None:
            return f"{kind}@{kk}"
        if kind != "bwd":
            return f"head@{kk}"
        classes = self.tmpl.classes
        holders = {classes[layer], *classes[layer + 1 :]} - set(classes[:layer])
        held = [j for j, c in enumerate(self.full) if c in holders]
        return f"bwd:{held[0]}@{kk}" if held else f"head@{kk}"


def assemble_step(
    trace: StepTrace, classes: Sequence[str], full: Sequence[str], micro_batches: int,
    optimizer_step: Sequence[tuple[int, int, int]],
) -> StepEvents:
    """The full model's step (layer classes ``full``) from a short trace with layer classes ``classes``."""
    return EventAssembler(short_template(trace, classes, micro_batches), full, micro_batches).run(optimizer_step)


K = TypeVar("K")
S = TypeVar("S")
V = TypeVar("V")


def of_trace(memo: dict[K, tuple[S, V]], key: K, trace: S, make: Callable[[], V], kept: int) -> V:
    """``make()`` once per ``key`` (which holds ``id(trace)``: a trace, or an optimizer step's events) for every point
    that uses it; the last ``kept`` are held, each with what it was made of, so that another object at a reused
    address is not taken for it."""
    hit = memo.get(key)
    if hit is not None and hit[0] is trace:
        return hit[1]
    made = make()
    if len(memo) >= kept:
        memo.pop(next(iter(memo)))
    memo[key] = (trace, made)
    return made


_TEMPLATES: dict[tuple[int, tuple[str, ...], int], tuple[StepTrace, ShortTemplate]] = {}


def short_template(trace: StepTrace, classes: Sequence[str], micro_batches: int) -> ShortTemplate:
    """The template of a short trace, prepared once for every point that copies it (the last few are kept)."""
    micro = max(1, min(micro_batches, 2))
    return of_trace(_TEMPLATES, (id(trace), tuple(classes), micro), trace,
                    lambda: ShortTemplate(trace, classes, micro), kept=16)


FullEvent = tuple[int, int, int]  # (op, key, nbytes)

# Optimizer steps compiled into copy programs, by the id of the events (held, so that another at a reused address is
# not taken for them): every point of a question copies the same few.
_OPTIMIZER_PROGRAMS: dict[int, tuple[Sequence[tuple[int, int, int]], list[tuple[int, int, int, bool]]]] = {}


def _optimizer_program(events: Sequence[tuple[int, int, int]]) -> list[tuple[int, int, int, bool]]:
    """An optimizer step's (op, id, bytes) as a program of ``EventAssembler._segment``'s copies: each allocation
    a COPY_ALLOC, each free a COPY_LOCAL of it. AssemblyError where it frees a tensor it did not allocate."""

    def compiled() -> list[tuple[int, int, int, bool]]:
        program: list[tuple[int, int, int, bool]] = []
        live: set[int] = set()
        for op, eid, nbytes in events:
            if op == ALLOC:
                live.add(eid)
                program.append((COPY_ALLOC, eid, nbytes, False))
            elif eid in live:
                live.discard(eid)
                program.append((COPY_LOCAL, eid, 0, False))
            else:
                raise AssemblyError("the optimizer step frees a tensor it did not allocate")
        return program

    return of_trace(_OPTIMIZER_PROGRAMS, id(events), events, compiled, kept=8)


_EVENT_BYTES = 24  # a packed request: op, key, bytes as int64
_OPTIMIZER_RELATIVE: dict[int, tuple[Sequence[tuple[int, int, int]], tuple[bytes, int]]] = {}


def _optimizer_relative(events: Sequence[tuple[int, int, int]]) -> tuple[bytes, int]:
    """An optimizer step's requests as ``add_optimizer`` makes them from key 0, packed (a free's key is then the rank
    of the allocation it frees: how the C assembler copies it), and how many keys it allocates (made once per
    optimizer step, ``_optimizer_program``'s checks first)."""

    def made() -> tuple[bytes, int]:
        keys: dict[int, int] = {}
        flat: list[int] = []
        for code, eid, nbytes, _ in _optimizer_program(events):
            if code == COPY_ALLOC:
                keys[eid] = len(keys)
                flat += [ALLOC, keys[eid], nbytes]
            else:
                flat += [FREE, keys[eid], 0]
        return array("q", flat).tobytes(), len(keys)

    return of_trace(_OPTIMIZER_RELATIVE, id(events), events, made, kept=8)


def _optimizer_packed(events: Sequence[tuple[int, int, int]], first_key: int) -> bytes:
    """``add_optimizer``'s requests from key ``first_key``, packed."""
    flat = array("q", _optimizer_relative(events)[0])
    for i in range(1, len(flat), 3):
        flat[i] += first_key
    return flat.tobytes()


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


class StepEvents:
    """One training step's requests, keys unique within the step, with the segment each starts.

    The requests are ``events``, (op, key, bytes) tuples; the C assembler (``EventAssembler.run``) gives them packed
    instead, int64 triples in ``packed`` (what the C replay reads, no tuple made), and ``events`` unpacks them the first
    time it is read (the list is the step's requests from then on: ``packed`` is dropped)."""

    def __init__(self, events: list[FullEvent] | None = None, bounds: list[tuple[int, str]] | None = None,
                 workspaces: set[int] | None = None, next_key: int = 0, extra_micro_batches: int = 0, *,
                 packed: bytes | None = None) -> None:
        self._events = events if events is not None or packed is not None else []
        self.packed = packed if events is None else None
        self.bounds = bounds if bounds is not None else []  # (index of the first event, label)
        self.workspaces = workspaces if workspaces is not None else set()
        self.next_key = next_key
        # Micro-batches the step stands for beyond those it holds: repeats of its later ones, which the replay
        # skips without their requests (estimator/replay.py, ``fast_steps(compact=True)``).
        self.extra_micro_batches = extra_micro_batches

    @property
    def events(self) -> list[FullEvent]:
        if self._events is None:
            flat = array("q", self.packed or b"")
            self._events = list(zip(flat[0::3], flat[1::3], flat[2::3], strict=True))
            self.packed = None
        return self._events

    @events.setter
    def events(self, value: list[FullEvent]) -> None:
        self._events, self.packed = value, None

    @property
    def n_events(self) -> int:
        """How many requests the step makes (without unpacking them)."""
        return len(self._events) if self._events is not None else len(self.packed or b"") // _EVENT_BYTES

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StepEvents):
            return NotImplemented
        return (self.events, self.bounds, self.workspaces, self.next_key, self.extra_micro_batches) == (
            other.events, other.bounds, other.workspaces, other.next_key, other.extra_micro_batches)

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value (as the dataclass it was)

    def __repr__(self) -> str:
        return (f"StepEvents({self.n_events} events, {len(self.bounds)} segments, next_key={self.next_key}, "
                f"extra_micro_batches={self.extra_micro_batches})")

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
        self.events.append((FREE, key, 0))

    def add_optimizer(self, events: Sequence[tuple[int, int, int]]) -> None:
        """The whole model's optimizer step, traced apart: its own allocations and frees (copied as a segment's
        program: compiled once per optimizer step, ``_optimizer_program``, the copies in C where it is built)."""
        self.begin("opt")
        program, copy = _optimizer_program(events), _native("copy_program")
        if copy is not None:
            self.next_key, _ = copy(program, 0, self.events, {}, self.workspaces, self.next_key, ALLOC, FREE, None)
            return
        own: dict[int, int] = {}
        for code, eid, nbytes, _ in program:
            if code == COPY_ALLOC:
                own[eid] = self.alloc(nbytes)
            else:
                self.free(own[eid])

    def _segment_at(self, label: str) -> tuple[int, int, int]:
        """(position in ``bounds``, first event, end event) of segment ``label``."""
        for i, (start, name) in enumerate(self.bounds):
            if name == label:
                end = self.bounds[i + 1][0] if i + 1 < len(self.bounds) else self.n_events
                return i, start, end
        raise KeyError(label)

    def segment_range(self, label: str) -> tuple[int, int]:
        """(first event, end event) of segment ``label`` (KeyError when the step has none)."""
        _, start, end = self._segment_at(label)
        return start, end

    def keys_made_in(self, label: str) -> set[int]:
        """Keys allocated in segment ``label`` (the optimizer step's: its state on the first step)."""
        _, start, end = self._segment_at(label)
        return {key for op, key, _ in self.events[start:end] if op == ALLOC}

    def with_optimizer(self, optimizer_step: Sequence[tuple[int, int, int]]) -> StepEvents:
        """The same step with another optimizer step (the first one, which creates the state)."""
        at, start, end = self._segment_at("opt")
        if self.packed is not None:  # the same, on the packed requests
            made = _optimizer_packed(optimizer_step, self.next_key)
            packed = self.packed[: start * _EVENT_BYTES] + made + self.packed[end * _EVENT_BYTES :]
            shift = len(made) // _EVENT_BYTES - (end - start)
            return StepEvents(None, [*self.bounds[: at + 1], *((i + shift, name) for i, name in self.bounds[at + 1 :])],
                              set(self.workspaces), self.next_key + _optimizer_relative(optimizer_step)[1],
                              self.extra_micro_batches, packed=packed)
        out = StepEvents(list(self.events[:start]), list(self.bounds[:at]), set(self.workspaces), self.next_key,
                         self.extra_micro_batches)
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
