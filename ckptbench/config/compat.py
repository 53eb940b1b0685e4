"""Which techniques combine, in one table: the config's validation, the measured window, the optimizers and tune's
candidates all read it, so a rule added here reaches every one of them. A value that needs a CUDA device is declared on
its axis (config/grid.py, ``Axis.needs_cuda``) and read here too. No torch.

Each rule says when it is enforced: ``load`` (the config is refused, naming the field of the rule's first axis),
``measure`` (the measured window skips the point) or ``optimizer`` (building the point's optimizer raises
TechniqueUnavailable: the point is skipped, and the estimator does not trace it). tune never proposes a point any
rule refuses.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ckptbench.config.grid import KEY_AXES, Point, axis_named
from ckptbench.config.parallel import parse_parallel

Stage = Literal["load", "measure", "optimizer"]
STAGES: tuple[Stage, ...] = ("load", "measure", "optimizer")
# The optimizers torch itself implements: the only ones torchao's CPUOffloadOptimizer wraps (train/optimizers.py
# builds them; tests/test_axis_keys.py holds the two lists to the same names).
TORCH_OPTIMIZERS = ("adamw_fused", "adamw_foreach", "sgd", "adafactor")


@dataclass(frozen=True)
class Rule:
    """Techniques that do not combine: ``breaks(point)`` says when, ``why(point)`` what the refusal says."""

    axes: tuple[str, ...]  # the axes it reads; a refusal at load names the field of the first
    stage: Stage
    breaks: Callable[[Point], bool]
    why: Callable[[Point], str]


def _sharded(point: Point) -> bool:
    return parse_parallel(point.parallel).distributed


RULES: tuple[Rule, ...] = (
    # Sharded points (ddp, fsdp2) train eagerly on the device, one point per set of processes.
    Rule(("parallel", "offload"), "load", lambda p: _sharded(p) and p.offload != "none",
         lambda p: f"{p.parallel} with offload={p.offload} is not supported; "
                   "sharded points run without activation offloading"),
    Rule(("parallel", "compile"), "load", lambda p: _sharded(p) and p.compile,
         lambda p: f"{p.parallel} with compile is not supported; sharded points run eagerly"),
    Rule(("parallel", "optimizer_offload"), "load", lambda p: _sharded(p) and p.optimizer_offload != "none",
         lambda p: f"{p.parallel} with optimizer_offload={p.optimizer_offload} is not supported; "
                   "sharded points step their optimizer on the device"),
    # DDP writes the all-reduced gradients after the backward; per-parameter hooks would step each rank's own
    # gradient. FSDP2 calls them after its reduce-scatter, with the reduced shard.
    Rule(("parallel", "optimizer_in_backward"), "load",
         lambda p: p.optimizer_in_backward and parse_parallel(p.parallel).kind == "ddp",
         lambda p: f"{p.parallel} with optimizer_in_backward is not supported; "
                   "DDP reduces gradients after the backward"),
    Rule(("compile", "offload"), "measure", lambda p: p.compile and p.offload != "none",
         lambda p: "torch.compile with activation offloading is not supported"),
    # The loss scaler must unscale and check every gradient before any parameter is stepped.
    Rule(("optimizer_in_backward", "precision"), "measure",
         lambda p: p.optimizer_in_backward and p.precision == "amp_fp16",
         lambda p: "optimizer_in_backward with amp_fp16: the gradient scaler needs the whole step"),
    Rule(("optimizer_in_backward", "optimizer_offload"), "optimizer",
         lambda p: p.optimizer_in_backward and p.optimizer_offload != "none",
         lambda p: "optimizer_in_backward with optimizer_offload: both step from gradient hooks"),
    Rule(("optimizer_offload", "optimizer"), "optimizer",
         lambda p: p.optimizer_offload != "none" and p.optimizer not in TORCH_OPTIMIZERS,
         lambda p: f"optimizer_offload: {p.optimizer_offload} runs torch's own optimizers, not {p.optimizer}"),
)


def broken_rule(point: Point, stages: Sequence[Stage] = STAGES) -> Rule | None:
    """The first rule of ``stages`` the point's techniques break (None: they combine)."""
    return next((rule for rule in RULES if rule.stage in stages and rule.breaks(point)), None)


def refusal(point: Point, stages: Sequence[Stage] = STAGES) -> str | None:
    """Why the point's techniques do not combine (by the rules of ``stages``), or None when they do."""
    rule = broken_rule(point, stages)
    return None if rule is None else rule.why(point)


def first_refused(points: Iterable[Point], stages: Sequence[Stage] = STAGES) -> tuple[Point, Rule] | None:
    """The first point (and its rule) that breaks a rule of ``stages``: each combination of the rules' axes is
    judged once, so a grid of many layouts, batches and lengths costs a few rules' calls."""
    axes = tuple(dict.fromkeys(a for rule in RULES if rule.stage in stages for a in rule.axes))
    seen: set[tuple[Any, ...]] = set()
    for point in points:
        combination = tuple(getattr(point, a) for a in axes)
        if combination in seen:
            continue
        seen.add(combination)
        rule = broken_rule(point, stages)
        if rule is not None:
            return point, rule
    return None


def cuda_need(axis: str, value: Any) -> str | None:
    """'all moves activations to host memory and needs a CUDA device' where the value of ``axis`` needs CUDA (its
    declaration's ``needs_cuda``), else None. A refusal puts the field before it."""
    needs = axis_named(axis).needs_cuda
    return f"{value} {needs.why}" if needs is not None and needs.applies(value) else None


def cuda_only_axes() -> list[str]:
    """The axes with values only a CUDA device runs, in the key's order."""
    return [a.name for a in KEY_AXES if a.needs_cuda is not None]
