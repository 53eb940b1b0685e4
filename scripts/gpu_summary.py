"""Print what the GPU check measured: tool overhead (wall vs steps) and, where present, estimate error.

Usage: python3 scripts/gpu_summary.py RUN_DIR [RUN_DIR ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ckptbench.results.store import load_run


def overhead(run_dir: str) -> None:
    run = load_run(run_dir)
    steps = sum(sum(p.warmup_times_s) + sum(p.step_times_s) for p in run.points)
    wall = run.meta.get("sweep_wall_s")
    statuses: dict[str, int] = {}
    for p in run.points:
        statuses[p.status] = statuses.get(p.status, 0) + 1
    ratio = f"{wall / steps:.3f}" if wall and steps else "n/a"
    print(f"{run.name}: {len(run.points)} points {statuses}; sweep wall {wall or 0:.1f} s, "
          f"warm-up + measured steps {steps:.1f} s, ratio {ratio}")
    for p in run.points:
        pred, meas = p.predicted_peak_allocated_bytes, p.peak_allocated_bytes
        if pred and meas:
            err = (pred - meas) / meas * 100
            print(f"  {p.key['layout']:<16} b={p.key['batch_size']:<3} predicted {pred / 2**30:8.3f} GiB "
                  f"measured {meas / 2**30:8.3f} GiB error {err:+.2f}%")


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        overhead(arg)
