"""The step-time model checked without a GPU: a small LLaMA's CPU step times, measured in one cell, calibrate the op
model (analysis/op_time.py), which then predicts the other cells (sequence length, precision, attention kernel,
optimizer, batch); writes the errors.

    python scripts/bench_step_time.py [--out results/step-time-cpu/DATE] [--force] [--analyse RUN]

It waits for a quiet machine (1-minute load average below --max-load, checked every 30 s), times a calibration unit
(a fixed one-thread fp32 matmul) before and after, runs one ``ckptbench sweep`` (``cpu_threads: 1``) into OUT/run,
traces every measured point on fake tensors for its op costs (estimator.run_op_costs), calibrates on the calibration
cell alone and predicts every other cell, then calibrates on every cell but one, for each cell (leave-one-cell-out),
and writes OUT/step_time_cpu.json and OUT/README.md. ``--analyse RUN`` redoes the analysis of a finished run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# A small LLaMA (LlamaForCausalLM, as 7B): large enough that its matmuls, not the per-op dispatch, take most of a step.
MODEL = {"preset": "tiny", "overrides": {"hidden_size": 512, "intermediate_size": 1376, "num_hidden_layers": 4,
                                         "num_attention_heads": 8, "num_key_value_heads": 8, "vocab_size": 4096,
                                         "max_position_embeddings": 2048}}
BASE = {"seq_len": 256, "precision": "bf16", "optimizer": "adamw_fused", "attn_implementation": "sdpa"}
CALIBRATION = "calibration"
# The calibration cell: each layout at batch 1 and 2 (the batch separates per-op costs from per-byte and per-FLOP
# ones; attention and the MLP recomputed apart separate their rates; selective recomputes the memory-bound ops only).
CALIBRATION_POINTS = [{"layout": layout, "batch_size": b}
                      for layout in ("none", "all", "every:2", "all@attn", "all@mlp", "all@selective") for b in (1, 2)]
# The cells predicted from it: one axis changed each, none and all at batch 2 (batch 4: the batch itself).
CELLS: dict[str, dict[str, Any]] = {
    "seq 512": {"seq_len": 512},
    "amp_bf16": {"precision": "amp_bf16"},
    "eager attention": {"attn_implementation": "eager"},
    "adamw_foreach": {"optimizer": "adamw_foreach"},
    "sgd": {"optimizer": "sgd"},
    "batch 4": {"batch_size": 4},
}
TARGET = 0.15  # the bar for a cell nobody measured, on a quiet machine


def config(steps: int) -> dict[str, Any]:
    points = [{**BASE, **p} for p in CALIBRATION_POINTS]
    points += [{**BASE, "batch_size": 2, "layout": layout, **axes} for axes in CELLS.values() for layout in
               ("none", "all")]
    return {"name": "step-time-cpu", "device": "cpu", "model": MODEL, "warmup_steps": 2, "measured_steps": steps,
            "seed": 0, "cpu_threads": 1, "sweep": {"layout": ["none"], "batch_size": [2]}, "points": points}


def cell_name(key: Mapping[str, Any]) -> str:
    """Which of the benchmark's cells a point belongs to."""
    for name, axes in CELLS.items():
        if all(key[a] == v for a, v in axes.items()) and all(key[a] == v for a, v in BASE.items() if a not in axes):
            return name
    return CALIBRATION


def load_1m() -> float:
    return os.getloadavg()[0]


def wait_quiet(max_load: float, *, patience_s: float) -> float:
    """Wait until the 1-minute load average is below ``max_load`` (at most ``patience_s``); the load then."""
    start = time.monotonic()
    while load_1m() >= max_load and time.monotonic() - start < patience_s:
        print(f"load average {load_1m():.2f} >= {max_load}: waiting", file=sys.stderr)
        time.sleep(30)
    return load_1m()


def calibration_unit_s() -> float:
    """The median time of a fixed one-thread fp32 matmul (512 x 512 x 512, 20 times): this machine's speed."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a, b = torch.randn(512, 512), torch.randn(512, 512)
        times = []
        for _ in range(7):
            t0 = time.perf_counter()
            for _ in range(20):
                a @ b
            times.append(time.perf_counter() - t0)
        return statistics.median(times)
    finally:
        torch.set_num_threads(threads)


def measure(out: Path, steps: int) -> Path:
    from ckptbench.api import SweepOptions, run_sweep

    run_dir = out / "run"
    outcome = run_sweep(config(steps), SweepOptions(out=run_dir))
    (Path(outcome.run_dir) / ".lock").unlink(missing_ok=True)  # the sweep's lock, released: not a result
    return Path(outcome.run_dir)


def analyse(run_dir: Path) -> dict[str, Any]:
    """Calibrate on the calibration cell, predict the others; then leave each cell out of a calibration on all."""
    from ckptbench.analysis.op_time import PRIOR_WEIGHT, Sample, calibrate, held_out
    from ckptbench.estimator.estimator import run_op_costs
    from ckptbench.results.store import load_run

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = load_run(run_dir)
    ops = run_op_costs([run])
    samples = [Sample(r.key, cell_name(r.key), ops[r.key_id], float(r.median_step_time_s))
               for r in run.points if r.ok and r.median_step_time_s and r.key_id in ops]
    fitted = [s for s in samples if s.cell == CALIBRATION]
    rates = calibrate(fitted, card=None)
    assert rates is not None
    rows = []
    for s in samples:
        predicted = rates.time(s.ops)
        rows.append({"cell": s.cell, "layout": s.key["layout"], "batch_size": s.key["batch_size"],
                     "measured_s": s.step_time_s, "predicted_s": predicted,
                     "error": None if predicted is None else predicted / s.step_time_s - 1,
                     "busy": any("busy" in w for w in _warnings(run, s.key))})
    loco = {(c.cell, c.key["layout"], c.key["batch_size"]): c.error for c in held_out(samples, card=None, by_cell=True)}
    loo = {(c.key["layout"], c.key["batch_size"]): c.error for c in held_out(fitted, card=None, by_cell=False)}
    for row in rows:
        row["leave_one_cell_out_error"] = loco.get((row["cell"], row["layout"], row["batch_size"]))
        if row["cell"] == CALIBRATION:
            row["leave_one_out_error"] = loo.get((row["layout"], row["batch_size"]))
    others = [r for r in rows if r["cell"] != CALIBRATION and r["error"] is not None]
    departing = [r["leave_one_cell_out_error"] for r in rows if r["cell"] != CALIBRATION]
    everything = calibrate(samples, card=None)
    return {
        "rates": rates.achieved(),
        "rates_all_cells": everything.achieved() if everything is not None else {},
        "terms_none_b2": {k: v for k, v in (rates.terms(next(s.ops for s in fitted if s.key["layout"] == "none"
                                                              and s.key["batch_size"] == 2)) or {}).items()},
        "points": rows,
        "max_error_other_cells": max(abs(r["error"]) for r in others) if others else None,
        "max_leave_one_cell_out_error": max((abs(e) for e in departing if e is not None), default=None),
        "cells_within_target": sorted({r["cell"] for r in rows if r["cell"] != CALIBRATION} - {
            r["cell"] for r in rows if r["cell"] != CALIBRATION and (r["leave_one_cell_out_error"] is None
                                                                     or abs(r["leave_one_cell_out_error"]) > TARGET)}),
        "calibration_cell_from_the_others": max((abs(r["leave_one_cell_out_error"]) for r in rows
                                                 if r["cell"] == CALIBRATION and r["leave_one_cell_out_error"]
                                                 is not None), default=None),
        "prior_weight": PRIOR_WEIGHT,
        "cells_predicted": sorted({r["cell"] for r in others}),
        "target": TARGET,
    }


def _warnings(run: Any, key: Mapping[str, Any]) -> list[str]:
    rec = next((r for r in run.points if r.key == key), None)
    return list(getattr(rec, "warnings", []) or []) if rec is not None else []


def machine() -> dict[str, Any]:
    import torch

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    return {"cpu": cpu, "cpus": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
            "platform": platform.platform()}


def markdown(result: Mapping[str, Any]) -> str:
    a = result["analysis"]
    m = result["machine"]
    lines = [
        "# Step times on the CPU: the op model calibrated on one cell, predicting the others",
        "",
        f"Written by `python scripts/bench_step_time.py` on {result['date']}: a small LLaMA (hidden 512, 4 layers, "
        "vocab 4096), `cpu_threads: 1`, measured by `ckptbench sweep` (median of "
        f"{result['measured_steps']} steps after 2 warm-up steps); each point's ops traced on fake tensors "
        "(estimator/op_costs.py) and timed by analysis/op_time.py.",
        "",
        f"- machine: {m['cpu']}, {m['cpus']} CPUs, {m['platform']}, torch {m['torch']}",
        f"- load average (1 min): {result['load_before']:.2f} before, {result['load_after']:.2f} after "
        + ("(a quiet machine: below the 1.2 the script waits for on 2 cores; each step ran on one thread)"
           if max(result["load_before"], result["load_after"]) < 1.2 else
           "(a busy machine: other processes shared it, so the times carry their noise; each step ran on one thread)"),
        f"- calibration unit (one-thread fp32 512^3 matmul x 20, median of 7): "
        f"{result['unit_before_s'] * 1e3:.1f} ms before, {result['unit_after_s'] * 1e3:.1f} ms after",
        "",
        "Calibrated on the calibration cell alone (seq 256, bf16, sdpa, adamw_fused; layouts none, all, every:2, "
        "all@attn, all@mlp, all@selective at batch 1 and 2):",
        "",
    ]
    lines += [f"- `{k}`: {v:.4g} {_unit(k)}" for k, v in a["rates"].items()]
    lines += ["", "Calibrated on every cell (what each leave-one-cell-out calibration differs from by one cell):", ""]
    lines += [f"- `{k}`: {v:.4g} {_unit(k)}" for k, v in a.get("rates_all_cells", {}).items()]
    lines += ["", "Predicted: from the calibration cell alone (its own points: leave-one-out); leave-one-cell-out: "
              "from every other cell.", "",
              "| cell | layout | batch | measured s | predicted s | error | leave-one-cell-out |",
              "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in a["points"]:
        error = r["leave_one_out_error"] if r["cell"] == CALIBRATION else r["error"]
        lines.append(f"| {r['cell']} | {r['layout']} | {r['batch_size']} | {r['measured_s']:.4f} | "
                     f"{_num(r['predicted_s'])} | {_pct(error)}{' (LOO)' if r['cell'] == CALIBRATION else ''} | "
                     f"{_pct(r['leave_one_cell_out_error'])} |")
    worst, loco = a["max_error_other_cells"], a["max_leave_one_cell_out_error"]
    departing = sorted({r["cell"] for r in a["points"] if r["cell"] != CALIBRATION})
    within = a["cells_within_target"]
    lines += [
        "",
        f"**Leave-one-cell-out** (the issue's check: each cell that departs from the calibration cell predicted by "
        f"the op model calibrated on every other cell, the calibration cell among them): largest error "
        f"{_pct(loco)} over {len(departing)} cells; {len(within)} of them within {a['target']:.0%} "
        f"({', '.join(within) or 'none'}).",
        "",
        f"From the calibration cell alone (one cell: what it cannot separate, e.g. the optimizer's bandwidth from the "
        f"fixed cost, it takes from the fallbacks): largest error {_pct(worst)} over {len(a['cells_predicted'])} "
        f"cells. The calibration cell from the other cells alone (only it varies the layout): largest error "
        f"{_pct(a.get('calibration_cell_from_the_others'))}, not part of the check.",
        "",
        f"Prior weight (analysis/op_time.py PRIOR_WEIGHT, the pull of an uncalibrated parameter toward its "
        f"fallback): {a.get('prior_weight', 0):g}.",
        "",
    ]
    return "\n".join(lines)


def _unit(name: str) -> str:
    return "TFLOP/s" if name.startswith("flop:") else "GB/s" if name.startswith("byte:") else "us"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1%}"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    today = datetime.date.today().isoformat()
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "step-time-cpu" / today)
    parser.add_argument("--steps", type=int, default=7, help="measured steps per point")
    parser.add_argument("--max-load", type=float, default=1.2, help="the 1-minute load average to wait below")
    parser.add_argument("--force", action="store_true", help="do not wait for a quiet machine")
    parser.add_argument("--analyse", type=Path, help="analyse this finished run instead of measuring")
    args = parser.parse_args(argv)
    args.out = args.out.resolve()  # before the chdir: as given, relative to where it was called from
    args.analyse = args.analyse.resolve() if args.analyse is not None else None
    os.chdir(ROOT)
    if args.analyse is not None:
        result = json.loads((args.out / "step_time_cpu.json").read_text())
        result["analysis"] = analyse(args.analyse)
    else:
        args.out.mkdir(parents=True, exist_ok=True)
        load_before = load_1m() if args.force else wait_quiet(args.max_load, patience_s=3600)
        unit_before = calibration_unit_s()
        run_dir = measure(args.out, args.steps)
        unit_after, load_after = calibration_unit_s(), load_1m()
        result = {"date": datetime.date.today().isoformat(), "machine": machine(), "measured_steps": args.steps,
                  "load_before": load_before, "load_after": load_after, "unit_before_s": unit_before,
                  "unit_after_s": unit_after, "run": str(run_dir.relative_to(ROOT)), "model": MODEL,
                  "analysis": analyse(run_dir)}
    (args.out / "step_time_cpu.json").write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    (args.out / "README.md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
