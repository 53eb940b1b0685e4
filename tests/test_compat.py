"""Which techniques combine is one table (config/compat.py): the config's validation, the measured window, the
optimizers and tune's candidates read it, so a rule added there reaches each of them."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from torch import nn

from ckptbench.analysis.tune_space import runnable
from ckptbench.config import compat
from ckptbench.config.compat import RULES, Rule, Stage, broken_rule
from ckptbench.config.grid import Point
from ckptbench.errors import ConfigError
from ckptbench.measure.window import unsupported
from ckptbench.train.optimizers import build_optimizer
from ckptbench.train.unavailable import TechniqueUnavailable
from tests.conftest import tiny_config

PLAIN = Point("fp32", "none", "none", 32, 2, "tiny", "adamw_fused")
# A point that breaks each rule of the table (and no rule before it), in the table's order.
BREAKING: list[dict[str, Any]] = [  # fields of a Point, for dataclasses.replace
    dict(parallel="ddp:2", offload="all"),
    dict(parallel="fsdp2:2", compile=True),
    dict(parallel="fsdp2:2", optimizer_offload="cpu"),
    dict(parallel="ddp:2", optimizer_in_backward=True),
    dict(compile=True, offload="all"),
    dict(optimizer_in_backward=True, precision="amp_fp16"),
    dict(optimizer_in_backward=True, optimizer_offload="cpu"),
    dict(optimizer_offload="cpu", optimizer="adamw_8bit"),
]


def _refused_when_its_optimizer_is_built(point: Point) -> str | None:
    params = list(nn.Linear(2, 2).parameters())
    try:
        opt = build_optimizer(point, params, lr=1e-3, zero_grad_to_none=True)
    except TechniqueUnavailable as exc:
        return str(exc)
    if hasattr(opt, "remove_hooks"):
        opt.remove_hooks()
    return None


def _refused_at_load(point: Point) -> str | None:
    sweep = {a: [getattr(point, a)] for a in ("precision", "optimizer", "offload", "compile", "loss",
                                             "optimizer_in_backward", "optimizer_offload", "parallel")}
    try:
        tiny_config(device="auto", sweep={**sweep, "layout": ["none"], "batch_size": [2], "seq_len": [32]})
    except ConfigError as exc:
        return str(exc)
    return None


def _consumers(point: Point, rule: Rule) -> None:
    """Each consumer refuses ``point`` as ``rule`` says where its stage says, and only there (the config naming the
    field of the rule's first axis); tune never offers it."""
    why = rule.why(point)
    assert not runnable(point)
    assert unsupported(point) == (why if rule.stage in ("load", "measure") else None)
    # (another refusal, such as a CUDA device an offloaded optimizer needs, may come from the optimizer on a CPU)
    assert (_refused_when_its_optimizer_is_built(point) == why) == (rule.stage == "optimizer")
    refused = _refused_at_load(point)
    if rule.stage == "load":
        assert refused is not None and refused.endswith(f"sweep.{rule.axes[0]}: {why}"), refused
    else:
        assert refused is None


def test_the_table_holds_the_rules_in_the_order_they_are_reported() -> None:
    assert len(BREAKING) == len(RULES)
    for rule, values in zip(RULES, BREAKING, strict=True):
        point = dataclasses.replace(PLAIN, **values)
        assert broken_rule(point) is rule, values
    assert runnable(PLAIN) and unsupported(PLAIN) is None and _refused_when_its_optimizer_is_built(PLAIN) is None


@pytest.mark.parametrize("index", range(len(RULES)))
def test_every_rule_is_refused_where_its_stage_says_and_never_tuned(index: int) -> None:
    _consumers(dataclasses.replace(PLAIN, **BREAKING[index]), RULES[index])


@pytest.mark.parametrize("stage", ["load", "measure", "optimizer"])
def test_a_rule_added_to_the_table_reaches_every_consumer(stage: Stage, monkeypatch: pytest.MonkeyPatch) -> None:
    new = Rule(("loss", "optimizer_in_backward"), stage, lambda p: p.loss == "chunked" and p.optimizer_in_backward,
               lambda p: "a chunked loss with the optimizer in backward: a test's rule")
    monkeypatch.setattr(compat, "RULES", (*RULES, new))
    point = dataclasses.replace(PLAIN, loss="chunked", optimizer_in_backward=True)
    _consumers(point, new)
    alone = dataclasses.replace(PLAIN, loss="chunked")
    assert runnable(alone) and unsupported(alone) is None and _refused_at_load(alone) is None
