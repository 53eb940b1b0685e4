"""The notes above compare's table: environment and config differences, mixed GPUs, partial runs, weak verdicts."""

from __future__ import annotations

from typing import Any

from ckptbench.analysis.verdict import (
    CPU_MIN_EFFECT,
    FAMILY_RULE,
    can_decide,
    least_decidable,
    mann_whitney_can_fire,
)
from ckptbench.results.record import PointRecord
from ckptbench.results.store import Run

# Environment fields and measurement-config fields whose differences are reported above the table;
# differences in the grid itself show up as added/removed points instead.
ENV_FIELDS = (
    "gpu_name",
    "driver_version",
    "cuda_version",
    "torch",
    "transformers",
    "ckptbench_version",
    "device_type",
    "probe",
    "torch_num_threads",  # intra-op threads: on CPU they change step times by far more than 2%
)
CONFIG_FIELDS = (
    "model",
    "warmup_steps",
    "measured_steps",
    "optimizer",
    "lr",
    "seed",
    "memory_cap_gib",
    "peak_tflops",
)


def gpu_notes(run: Run, side: str) -> list[str]:
    mixed = run.mixed_gpus
    return [f"{side} run {run.name}: its points ran on different GPU models: {mixed}"] if mixed else []


def run_notes(run: Run, side: str) -> list[str]:
    notes = [f"{side} run {run.name}: {w}" for w in run.warnings]
    status = run.meta.status
    if status != "complete":
        total = run.meta.num_points if run.meta.num_points is not None else "?"
        held = f"{len(run.points)} of {total} points"
        notes.append(f"{side} run {run.name} is {status} ({held}); compared on what it holds")
    return notes


def power_notes(
    pairs: list[tuple[PointRecord, PointRecord]], *, alpha: float, time_rtol: float = 0.02, cpu: bool = False
) -> list[str]:
    """Say when too few measured steps weaken the step-time verdict, or rule it out, in the words of the rule
    that then decides (analysis/verdict.py family_verdicts): on a GPU Benjamini-Hochberg over the points'
    p-values or ranges apart by the noise band; on a CPU only ranges apart by ``CPU_MIN_EFFECT``; a point
    flagged busy or spread is never judged."""
    sizes = {(len(b.step_times_s), len(n.step_times_s)) for b, n in pairs if b.ok and n.ok}
    sizes = {(n, m) for n, m in sizes if n and m}
    blind = sorted((n, m) for n, m in sizes if not can_decide(n, m, alpha=alpha))
    if blind:
        n, m = blind[0]
        least = least_decidable(alpha)
        return [
            f"with {n} and {m} measured steps no step-time verdict is possible (at least {least} and {least} "
            "are needed): those rows say 'too few samples'; measure more steps (10 or more for CI)"
        ]
    weak = sorted((n, m) for n, m in sizes if not mann_whitney_can_fire(n, m, alpha=alpha))
    if not weak:
        return []
    n, m = weak[0]
    never = "points flagged busy or spread are never judged"
    if cpu:
        return [
            f"with {n} and {m} measured steps on a CPU p-values do not count (a busy host slows steps together): "
            f"a step-time change is declared only when the two runs' step times lie at least "
            f"{CPU_MIN_EFFECT * 100:g}% apart; {never}"
        ]
    return [
        f"with {n} and {m} measured steps the Mann-Whitney test cannot reach p < {alpha:g}, so "
        f"{FAMILY_RULE} over the points cannot either: a step-time change is declared only when the two runs' "
        f"step times lie at least {time_rtol * 100:g}% apart; {never}; measure 10 or more steps for CI"
    ]


def environment_differences(base: Run, new: Run) -> list[str]:
    """One line per environment or measurement-config field that differs between the runs."""
    lines = []
    for name in ENV_FIELDS:
        a, b = getattr(base.environment, name, None), getattr(new.environment, name, None)
        if a != b:
            lines.append(f"{name}: {a} -> {b}")
    for name in CONFIG_FIELDS:
        a, b = base.config.get(name), new.config.get(name)
        if a != b:
            lines.append(f"config.{name}: {_flat(a)} -> {_flat(b)}")
    return lines


def _flat(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_flat(v)}" for k, v in sorted(value.items())) + "}"
    return str(value)
