"""The whole model's optimizer trace is shared by the precisions whose weights have the same dtype (issue 24): fp32
and the amp precisions (fp32 weights) run one optimizer trace, and their estimates are those of separate traces."""

from __future__ import annotations

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
