"""Print what the GPU check measured: the tool's own time (whole command vs steps, and its parts) and,
where present, the estimate error per point.

Usage: python3 scripts/gpu_summary.py RUN_DIR [RUN_DIR ...]

The target on the H200 is an end-to-end wall time within 1.05x of the warm-up plus measured steps.
Runs written before run.json had a 'timing' section show only the points' wall time (sweep_wall_s).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ckptbench.results.record import PointRecord
from ckptbench.results.store import load_run

# (label, run.json timing field): the parts of the command's wall time, in the order they happen.
PARTS = (
    ("start-up (interpreter, imports, config)", "startup_s"),
    ("environment probe, runner, run dir", "environment_s"),
    ("predictions made before the points", "predictions_s"),
    ("warm-up + measured steps", "steps_s"),
    ("per-point overhead (wall - steps)", "point_overhead_s"),
    ("  of which model builds", "model_build_s"),
    ("between points (records, progress)", "between_points_s"),
    ("  of which waiting for predictions", "predictions_wait_s"),
    ("finish (summaries, table)", "finish_s"),
)


def _ratio(wall: float | None, steps: float) -> str:
    return f"{wall / steps:.3f}x" if wall and steps else "n/a"


def timing(run_dir: str) -> None:
    run = load_run(run_dir)
    steps = sum(sum(p.warmup_times_s) + sum(p.step_times_s) for p in run.points)
    statuses: dict[str, int] = {}
    for p in run.points:
        statuses[p.status] = statuses.get(p.status, 0) + 1
    t: dict[str, Any] = run.meta.timing.to_json() if run.meta.timing is not None else {}
    wall, points_wall = t.get("command_wall_s"), run.meta.sweep_wall_s
    print(f"{run.name}: {len(run.points)} points {statuses}; warm-up + measured steps {steps:.1f} s")
    whole = f"{wall:.1f} s = {_ratio(wall, steps)} the steps" if wall else "not recorded (run.json has no timing)"
    print(f"  whole command {whole} (points alone {points_wall or 0:.1f} s = {_ratio(points_wall, steps)}); "
          "target 1.05x")
    for label, name in PARTS:
        if t.get(name) is not None:
            share = f"{t[name] / wall * 100:5.1f}%" if wall else ""
            print(f"    {label:<40} {t[name]:8.2f} s {share}")
    invocations = t.get("invocations", [])
    if len(invocations) > 1 or t.get("untimed_earlier_points"):
        each = ", ".join(f"{e.get('status')} ({e.get('points')} points)" for e in invocations)
        untimed = t.get("untimed_earlier_points", 0)
        print(f"  {len(invocations)} invocations: {each}; untimed earlier points: {untimed}")
    modes = {e.get("predictions_mode") for e in invocations} - {None}
    if modes:
        background = sum(e.get("predictions_background_s") or 0.0 for e in invocations)
        print(f"  predictions: {', '.join(sorted(modes))}; background process busy {background:.1f} s")
    _point_overhead(run.points)


def _point_overhead(points: list[PointRecord]) -> None:
    """The per-point overhead and its measured parts (medians over points), and timing warnings."""
    ran = [p for p in points if p.overhead_s is not None]
    if not ran:
        return
    parts: dict[str, list[float]] = {}
    for p in ran:
        for name, seconds in p.overhead_parts_s.items():
            parts.setdefault(name, []).append(seconds)
    shown = ", ".join(f"{k} {statistics.median(v) * 1e3:.1f} ms (x{len(v)})" for k, v in sorted(parts.items()))
    overhead = [p.overhead_s or 0.0 for p in ran]
    print(f"  per-point overhead: median {statistics.median(overhead) * 1e3:.1f} ms, "
          f"max {max(overhead) * 1e3:.1f} ms; parts (median): {shown or 'not recorded'}")
    warned = [p for p in points if p.warnings]
    if warned:
        kinds = sorted({k for p in warned for k in p.warning_kinds})
        print(f"  {len(warned)} point(s) with timing warnings: {', '.join(kinds)}")


def estimates(run_dir: str) -> None:
    for p in load_run(run_dir).points:
        pred, meas = p.predicted_peak_allocated_bytes, p.peak_allocated_bytes
        if pred and meas:
            err = (pred - meas) / meas * 100
            print(f"  {p.key['layout']:<16} b={p.key['batch_size']:<3} predicted {pred / 2**30:8.3f} GiB "
                  f"measured {meas / 2**30:8.3f} GiB error {err:+.2f}%")


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        timing(arg)
        estimates(arg)
