"""The notes above compare's table: environment and config differences, mixed GPUs, partial runs, weak verdicts."""

from __future__ import annotations

from typing import Any

from ckptbench.analysis.verdict import can_decide, disjoint_odds, least_decidable, mann_whitney_can_fire
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
    status = run.meta.get("status")
    if status != "complete":
        total = run.meta.get("num_points", "?")
        held = f"{len(run.points)} of {total} points"
        notes.append(f"{side} run {run.name} is {status} ({held}); compared on what it holds")
    return notes


def power_notes(pairs: list[tuple[PointRecord, PointRecord]], *, alpha: float) -> list[str]:
    """Say when too few measured steps weaken the step-time verdict (analysis/verdict.py), or rule it out."""
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
    return [
        f"with {n} and {m} measured steps the Mann-Whitney test cannot reach p < {alpha:g}: a step-time "
        "change is flagged only when the two runs' step times do not overlap "
        f"(1 in {disjoint_odds(n, m)} by chance with no change); measure 10 or more steps for CI"
    ]


def environment_differences(base: Run, new: Run) -> list[str]:
    """One line per environment or measurement-config field that differs between the runs."""
    lines = []
    for name in ENV_FIELDS:
        a, b = base.environment.get(name), new.environment.get(name)
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
