"""The whole model's optimizer trace is shared by the precisions whose weights have the same dtype (issue 24): fp32
and the amp precisions (fp32 weights) run one optimizer trace, and their estimates are those of separate traces. Its
first step, traced first (issue 38: the state made once), leaves every figure an estimate reads as the old order did."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

from ckptbench.config.grid import Point
from ckptbench.estimator.estimator import Estimator, card
from tests.conftest import tiny_config

_SWEEP = {"layout": ["none", "all"], "batch_size": [2], "seq_len": [64], "precision": ["fp32", "amp_bf16", "bf16"]}


def _optimizer_jobs(est: Estimator, points: list[Point]) -> list[str]:
    return [label for label, _ in est.jobs(points) if "optimizer step" in label]


def test_fp32_weights_share_one_optimizer_trace_and_estimate_as_if_traced_apart() -> None:
    cfg = tiny_config(device="cuda", sweep=_SWEEP)
    points = cfg.points_list()
    shared = Estimator(cfg, target="cuda", gpu=card(None))
    assert sorted(_optimizer_jobs(shared, points)) == [
        "bfloat16 weights adamw_fused: optimizer step of the whole model",
        "float32 weights adamw_fused: optimizer step of the whole model",
    ]
    shared.run_traces(points, workers=1)
    together = [shared.estimate(p) for p in points]
    for precision in ("fp32", "amp_bf16", "bf16"):  # each on its own: an optimizer trace of its own
        alone_points = [p for p in points if p.precision == precision]
        alone = Estimator(cfg, target="cuda", gpu=card(None))
        assert len(_optimizer_jobs(alone, alone_points)) == 1
        alone.run_traces(alone_points, workers=1)
        for p in alone_points:
            assert alone.estimate(p) == together[points.index(p)], p


def test_fsdp2_keeps_one_optimizer_trace_per_precision() -> None:
    """FSDP2's mixed-precision policy depends on the precision itself, not only on the weights' dtype."""
    cfg = tiny_config(device="cuda", sweep={**_SWEEP, "parallel": ["fsdp2:2"]})
    est = Estimator(cfg, target="cuda", gpu=card(None))
    labels = _optimizer_jobs(est, cfg.points_list())
    expected = [f"{p} adamw_fused: optimizer step of the whole model" for p in ("amp_bf16", "bf16", "fp32")]
    assert sorted(labels) == expected


def test_an_optimizer_traces_steps_are_read_once_and_are_its_own() -> None:
    """``optimizer_steps`` reads a trace's two optimizer steps once for every point that replays them: the same
    requests as reading them anew, and another trace's own (not those of the trace read before it)."""
    from ckptbench.estimator.event_assembly import segment_events
    from ckptbench.estimator.replay import optimizer_steps

    cfg = tiny_config(device="cuda", sweep=_SWEEP)
    est = Estimator(cfg, target="cuda", gpu=card(None))
    est.run_traces(cfg.points_list(), workers=1)
    traces = list(est._optim.values())
    assert len(traces) == 2
    for optim in traces:
        first, later = optimizer_steps(optim)
        assert list(first) == segment_events(optim, "opt_first", exclude=optim.host) and first
        assert list(later) == segment_events(optim, "opt")  # none for fused AdamW: it steps in place
        assert optimizer_steps(optim)[0] is first  # read once
    assert optimizer_steps(traces[0]) != optimizer_steps(traces[1])


def _renamed(events: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """Events with their ids numbered in order of first appearance (what an id stands for, not its number)."""
    names: dict[int, int] = {}
    return [(op, names.setdefault(eid, len(names)), nbytes) for op, eid, nbytes in events]


def _as_read(optim: Any) -> tuple[Any, ...]:
    """Everything an estimate reads of a whole model's optimizer trace (estimator.py, assembly.py, replay.py)."""
    from ckptbench.estimator.event_assembly import segment_events

    return (
        optim.static, [optim.get(label) for label in ("grads", "opt", "zero")],
        _renamed(segment_events(optim, "opt_first", exclude=optim.host)), _renamed(segment_events(optim, "opt")),
        optim.build, optim.ops("opt"), optim.ops("zero"),
    )


def _traced_after_a_later_step(cfg: Any, point: Point) -> Any:
    """The optimizer trace as it was made before the first step came first: the state made by preparing, the later
    step traced, then a new optimizer's first step (the reference of ``trace_optimizer``)."""
    from dataclasses import replace

    from ckptbench.estimator import optim_8bit
    from ckptbench.estimator.device_model import kernel_model
    from ckptbench.estimator.fake_mode import fake_mode
    from ckptbench.estimator.trace import (
        _prepare,
        _result,
        creation_order,
        fake_process_group,
        first_optimizer_step,
        later_optimizer_step,
    )
    from ckptbench.estimator.tracker import StepTracker
    from ckptbench.train.optimizers import build_optimizer

    tracker = StepTracker(kernel_model("cuda"))
    with (optim_8bit.traceable(point.optimizer, target="cuda"), fake_process_group(point.parallel) as mesh,
          fake_mode() as mode):
        model, _, params, opt = _prepare(cfg, point, tracker, None, mode, mesh)
        static = tuple(tracker.by_cat)
        later_optimizer_step(tracker, params, opt, in_backward=point.optimizer_in_backward,
                             set_to_none=cfg.zero_grad_to_none)
        with tracker:  # (after 'end', as the later step left the tag)
            first = build_optimizer(point, params, lr=cfg.lr, zero_grad_to_none=cfg.zero_grad_to_none)
            host = first_optimizer_step(tracker, params, first)
    return replace(_result(tracker, static), build=creation_order(model), host=host)


@pytest.mark.parametrize("zero_grad_to_none", [True, False])
def test_the_first_step_traced_first_leaves_what_an_estimate_reads_as_it_was(zero_grad_to_none: bool) -> None:
    """trace_optimizer traces the optimizer's first step first and the later step from the state it leaves (the
    whole model's state made once, not twice: a third of the trace): every figure an estimate reads of it is the one
    the trace made the other way gave, for every optimizer, in backward or not, gradients kept or set to None."""
    from ckptbench.estimator.trace import trace_optimizer

    sweep = {"layout": ["none"], "batch_size": [2], "seq_len": [64],
             "precision": ["amp_bf16" if zero_grad_to_none else "bf16"],  # fp32 and bf16 weights, a case each
             "optimizer": ["adamw_fused", "adamw_foreach", "sgd", "adafactor", "adamw_8bit"],
             "optimizer_in_backward": [False, True]}
    cfg = tiny_config(device="cuda", sweep=sweep, zero_grad_to_none=zero_grad_to_none)
    for point in cfg.points_list():
        if point.optimizer == "adamw_8bit" and importlib.util.find_spec("bitsandbytes") is None:
            continue
        now = trace_optimizer(cfg, point, target="cuda")
        assert _as_read(now) == _as_read(_traced_after_a_later_step(cfg, point)), point
