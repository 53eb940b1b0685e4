"""The C assembler of a full model's step (``_replay_native.assemble``) against ``EventAssembler``'s rules, its
reference: the same requests, segments, workspaces and keys for every layout, precision and micro-batch count, with
and without copying repeated micro-batches; its requests packed (int64 triples) replay as the list does, and a step
it cannot make is made by the rules."""

from __future__ import annotations

import dataclasses
import gc
import tracemalloc
from array import array
from collections.abc import Iterator
from typing import Any

import pytest

from ckptbench.config.alloc_conf import parse_alloc_conf
from ckptbench.config.layouts import parse_layout
from ckptbench.estimator import event_assembly
from ckptbench.estimator import replay as replay_module
from ckptbench.estimator.allocator import NATIVE, DeviceLimit
from ckptbench.estimator.assembly import layer_classes, plans_for, short_model_classes
from ckptbench.estimator.event_assembly import EventAssembler, StepEvents, segment_events, short_template
from ckptbench.estimator.events import ALLOC, FREE
from ckptbench.estimator.record import CATEGORIES
from ckptbench.estimator.replay import ProcessModel, fast_steps, replay_point
from ckptbench.estimator.step_trace import StepTrace
from ckptbench.estimator.trace import trace_step
from tests._native import WITH_NATIVE
from tests.conftest import tiny_config

pytestmark = WITH_NATIVE

LAYOUTS = ["none", "all", "every:2", "last:3", "first:2@mlp", "all@selective", "layers:1,4@attn", "all@attn+mlp",
           "first:1"]


@pytest.fixture(scope="module", params=["bf16", "amp_bf16"])
def traced(request: pytest.FixtureRequest) -> Iterator[tuple[Any, list[str], int, dict[int, Any]]]:
    """A tiny model's short traces (one and two micro-batches) for every layout's classes, at one precision."""
    cfg = tiny_config(device="cuda", sweep={"layout": LAYOUTS, "batch_size": [2], "seq_len": [32],
                                            "precision": [request.param]})
    num_layers = cfg.model.num_layers
    classes = short_model_classes({c for lay in LAYOUTS for c in layer_classes(parse_layout(lay, num_layers))})
    shorts = {micro: trace_step(cfg, cfg.points_list()[0], target="cuda", plans=plans_for(classes),
                                num_layers=len(classes), micro_batches=micro, defer_shared=True) for micro in (1, 2)}
    yield cfg, classes, num_layers, shorts


def _by_rules(template: Any, full: list[str], count: int, opt: Any, *, repeat: bool = True) -> StepEvents:
    """The step as the Python rules make it (the C assembler not asked; its copy loops still are)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(event_assembly, "_native", lambda name: None if name == "assemble" else NATIVE_PART(name))
        step = EventAssembler(template, full, count).run(opt, repeat=repeat)
    assert step.packed is None  # made by the rules: a list
    return step


NATIVE_PART = event_assembly._native


def test_c_assembly_is_the_rules_assembly(traced: tuple[Any, list[str], int, dict[int, Any]]) -> None:
    _, classes, num_layers, shorts = traced
    made = 0
    for micro, short in shorts.items():
        opt = segment_events(short, "opt")
        for layout in LAYOUTS:
            full = layer_classes(parse_layout(layout, num_layers))
            for count in ((1,) if micro == 1 else (2, 3, 4, 5, 9)):
                for repeat in (True, False):
                    template = short_template(short, classes, count)
                    fast = EventAssembler(template, full, count).run(opt, repeat=repeat)
                    assert fast.packed is not None, (layout, count)  # made in C, its requests packed
                    made += 1
                    assert fast == _by_rules(template, full, count, opt, repeat=repeat), (layout, count, repeat)
    assert made == len(LAYOUTS) * 2 * 6


def test_packed_steps_replay_as_their_lists(traced: tuple[Any, list[str], int, dict[int, Any]]) -> None:
    """The first warm-up step made from the packed steady one (``with_optimizer``) equals the one made from its
    list; the replay reads packed requests as it reads the list (peaks, retries, where it runs out)."""
    _, classes, num_layers, shorts = traced
    short = shorts[2]
    opt = segment_events(short, "opt")
    first_opt = segment_events(short, "opt")[1:]  # another optimizer step: its first allocation left out
    process = ProcessModel(warmup_steps=2, measured_steps=3, workspaces=(4096, 4096), build=(2**20,),
                           batch_bytes=512)
    outcomes = set()
    for layout in ("none", "all", "every:2", "first:2@mlp"):
        full = layer_classes(parse_layout(layout, num_layers))
        steady = EventAssembler(short_template(short, classes, 4), full, 4).run(opt)
        assert steady.packed is not None
        listed = StepEvents(list(steady.events), list(steady.bounds), set(steady.workspaces), steady.next_key)
        assert listed.packed is None and listed == steady
        steady = EventAssembler(short_template(short, classes, 4), full, 4).run(opt)  # packed again
        first = steady.with_optimizer(first_opt)
        assert first.packed is not None and first == listed.with_optimizer(first_opt), layout
        for limit in (DeviceLimit(2**40, None), DeviceLimit(steady_peak(listed) * 2, None),
                      DeviceLimit(steady_peak(listed) // 3, None)):
            settings = parse_alloc_conf("")
            packed_result = replay_point(first, steady, process, settings, limit)
            list_result = replay_point(listed.with_optimizer(first_opt), listed, process, settings, limit)
            assert packed_result == list_result, (layout, limit)
            outcomes.add(packed_result.oom is None)
    assert outcomes == {True, False}  # replays that ran through and replays that ran out


def steady_peak(step: StepEvents) -> int:
    """The most bytes the step holds at once (no allocator): a scale for the limits above."""
    live: dict[int, int] = {}
    peak = held = 0
    for op, key, nbytes in step.events:
        if op == ALLOC:
            live[key] = nbytes
            held += nbytes
            peak = max(peak, held)
        else:
            held -= live.pop(key, 0)
    return peak


def test_packed_requests_unpack_on_first_read() -> None:
    flat = [ALLOC, 0, 512, ALLOC, 1, 1024, FREE, 0, 0]
    step = StepEvents(None, [(0, "start")], set(), 2, packed=array("q", flat).tobytes())
    assert step.n_events == 3 and step.packed is not None
    assert step.events == [(ALLOC, 0, 512), (ALLOC, 1, 1024), (FREE, 0, 0)]
    assert step.packed is None  # the list is the step's requests from now on
    step.events.append((FREE, 1, 0))
    assert step.n_events == 4
    assert StepEvents([(ALLOC, 0, 512)]) != StepEvents([(ALLOC, 0, 513)])


def test_a_step_the_c_loop_cannot_make_is_left_to_the_rules(traced: tuple[Any, list[str], int, dict[int, Any]]
                                                            ) -> None:
    _, classes, num_layers, shorts = traced
    assert NATIVE is not None
    short = shorts[2]
    template = short_template(short, classes, 3)
    tables = template.native()
    assert tables is not None
    labels, _ = event_assembly.segment_labels(num_layers, 3)
    layer_of = array("q", [0] * num_layers).tobytes()
    opt = event_assembly._optimizer_relative(segment_events(short, "opt"))[0]
    args = (tables, layer_of, 3, labels, b"", opt, True, ALLOC, FREE, "opt")
    assert NATIVE.assemble(*args) is not None
    assert NATIVE.assemble(tables, layer_of, 3, labels[:-1], b"", opt, True, ALLOC, FREE, "opt") is None
    # a release in a segment whose tensor was not made by a global segment: the rules raise, the C loop declines
    bad_release = array("q", [len(labels) - 1, 0]).tobytes()
    assert NATIVE.assemble(tables, layer_of, 3, labels, bad_release, opt, True, ALLOC, FREE, "opt") is None
    with pytest.raises(TypeError):
        NATIVE.assemble(list(tables), layer_of, 3, labels, b"", opt, True, ALLOC, FREE, "opt")
    # an optimizer step freeing what it did not allocate
    bad_opt = array("q", [FREE, 0, 0]).tobytes()
    assert NATIVE.assemble(tables, layer_of, 3, labels, b"", bad_opt, True, ALLOC, FREE, "opt") is None


def test_fast_steps_hold_packed_requests(traced: tuple[Any, list[str], int, dict[int, Any]],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    cfg, classes, num_layers, shorts = traced
    point = dataclasses.replace(cfg.points_list()[0], layout="all", micro_batches=3)
    full = layer_classes(parse_layout(point.layout, num_layers))
    optim = shorts[2]  # (its 'opt' segment stands for the optimizer trace's here)
    monkeypatch.setattr(replay_module, "optimizer_steps", lambda _: (tuple(segment_events(optim, "opt")),) * 2)
    first, steady = fast_steps(shorts[2], classes, full, 3, optim)
    assert first.packed is not None and steady.packed is not None
    assert replay_module._requests(steady) is steady.packed


def test_assembling_leaves_no_objects_or_memory_behind(traced: tuple[Any, list[str], int, dict[int, Any]]) -> None:
    """``assemble`` counts its references by hand: made 300 times, and declined 300 times (a stream it cannot make),
    it leaves no object and no memory behind."""
    _, classes, num_layers, shorts = traced
    assert NATIVE is not None
    short = shorts[2]
    tables = short_template(short, classes, 5).native()
    labels, _ = event_assembly.segment_labels(num_layers, 5)
    layer_of = array("q", [0] * num_layers).tobytes()
    opt = event_assembly._optimizer_relative(segment_events(short, "opt"))[0]
    bad_opt = array("q", [FREE, 0, 0]).tobytes()

    def rounds(n: int) -> None:
        for _ in range(n):
            assert NATIVE is not None
            made = NATIVE.assemble(tables, layer_of, 5, labels, b"", opt, True, ALLOC, FREE, "opt")
            assert made is not None
            del made
            assert NATIVE.assemble(tables, layer_of, 5, labels, b"", bad_opt, True, ALLOC, FREE, "opt") is None

    rounds(20)  # warm-up: caches, free lists
    gc.collect()
    objects = len(gc.get_objects())
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    rounds(300)
    gc.collect()
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert grown < 64 * 1024, grown
    assert len(gc.get_objects()) - objects < 50


def _hand_made_trace() -> StepTrace:
    """A 3-layer short model's two micro-batches, made by hand: each layer's forward keeps a tensor that the same
    layer's backward frees one micro-batch later (a rule no traced LLaMA step has needed yet: the same layer, an
    earlier micro-batch), besides its local tensors and the gradient handed down."""
    labels: list[str] = ["start"]
    for m in (0, 1):
        labels += [f"pre@{m}", *(f"fwd:{t}@{m}" for t in range(3)), *(f"{g}@{m}" for g in ("head", "logits", "exit",
                                                                                          "back")),
                   *(f"bwd:{t}@{m}" for t in (2, 1, 0)), f"tail@{m}"]
    labels += ["opt", "zero", "end"]
    seg = {label: i for i, label in enumerate(labels)}
    events: list[tuple[int, int, int, int]] = []
    eid = 0

    def alloc(label: str, nbytes: int) -> int:
        nonlocal eid
        eid += 1
        events.append((ALLOC, eid, nbytes, seg[label]))
        return eid

    kept: dict[tuple[int, int], int] = {}
    for m in (0, 1):
        for t in range(3):
            local = alloc(f"fwd:{t}@{m}", 4096 * (t + 1))
            events.append((FREE, local, 0, seg[f"fwd:{t}@{m}"]))
            kept[(t, m)] = alloc(f"fwd:{t}@{m}", 1 << 20)
        for t in (2, 1, 0):
            if m == 1:  # the tensor the same layer's forward kept one micro-batch ago
                events.append((FREE, kept[(t, 0)], 0, seg[f"bwd:{t}@1"]))
            scratch = alloc(f"bwd:{t}@{m}", 8192)
            events.append((FREE, scratch, 0, seg[f"bwd:{t}@{m}"]))
    state = alloc("opt", 1 << 16)
    events.append((FREE, state, 0, seg["opt"]))
    return StepTrace(segments=(), static=(0,) * len(CATEGORIES), events=tuple(events), labels=tuple(labels))


def test_a_free_of_an_earlier_micro_batchs_forward_is_placed_alike() -> None:
    """The same-layer rule for a tensor made a micro-batch earlier (no traced step exercises it): at two micro-batches
    the C assembly places each free where the rules do, in every full layer copying the middle template layer. From
    three on, the rules find no such tensor in the micro-batch before (its template is the second micro-batch's, which
    made another) and raise; the C loop declines them, so the same error is raised."""
    short = _hand_made_trace()
    opt = segment_events(short, "opt")
    full = ["none"] * 6
    template = short_template(short, ["none", "none", "none"], 2)
    fast = EventAssembler(template, full, 2).run(opt)
    assert fast.packed is not None
    assert fast == _by_rules(template, full, 2, opt)
    frees = sum(1 for op, _, _ in fast.events if op == FREE)
    assert sum(1 for op, _, _ in fast.events if op == ALLOC) - frees == 6  # the last micro-batch's kept tensors
    for count in (3, 5):
        template = short_template(short, ["none", "none", "none"], count)
        with pytest.raises(KeyError):
            _by_rules(template, full, count, opt)
        with pytest.raises(KeyError):
            EventAssembler(template, full, count).run(opt)
