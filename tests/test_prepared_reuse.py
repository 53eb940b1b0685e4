"""Short models prepared once for the traces of every batch size and sequence length (issue 24): the estimates are
those of freshly prepared models, to the byte, and the preparing happens once per precision."""

from __future__ import annotations

from typing import Any

import pytest

from ckptbench.estimator import trace as trace_module
from ckptbench.estimator.estimator import Estimator, card
from tests.conftest import tiny_config

_SWEEP = {
    "layout": ["none", "every:2"],
    "batch_size": [1, 3],
    "seq_len": [32, 64],
    "precision": ["fp32", "amp_bf16", "bf16"],
}


class _Forgetting(dict[tuple[Any, ...], Any]):
    """A reuse store that keeps nothing: every trace prepares its own model."""

    def __setitem__(self, key: tuple[Any, ...], value: Any) -> None:
        pass


@pytest.mark.parametrize(("target", "zero_grad_to_none"), [("cuda", True), ("cpu", False)])
def test_traces_on_a_prepared_model_estimate_as_freshly_prepared_ones(
    target: str, zero_grad_to_none: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = tiny_config(device=target, sweep=_SWEEP, zero_grad_to_none=zero_grad_to_none)
    points = cfg.points_list()
    prepares: list[str] = []
    original = trace_module._prepare

    def counted(cfg: Any, point: Any, *args: Any, **kwargs: Any) -> Any:
        prepares.append(point.precision)
        return original(cfg, point, *args, **kwargs)

    monkeypatch.setattr(trace_module, "_prepare", counted)
    gpu = card(None) if target == "cuda" else None
    reused = Estimator(cfg, target=target, gpu=gpu)  # type: ignore[arg-type]
    reused.run_traces(points, workers=1)
    shapes = 2 * 2
    # one short model per precision, and the whole model of the two optimizer traces (fp32 and bf16 weights)
    assert len(prepares) == 3 + 2 and set(prepares) == {"fp32", "amp_bf16", "bf16"}, prepares
    prepares.clear()
    fresh = Estimator(cfg, target=target, gpu=gpu)  # type: ignore[arg-type]
    fresh._prepared = _Forgetting()
    fresh.run_traces(points, workers=1)
    assert len(prepares) == 3 * shapes + 2
    for p in points:
        assert reused.estimate(p) == fresh.estimate(p), p
