"""Write the step-time calibration ckptbench ships (ckptbench/data/step_time_calibration.json) from the committed H200
runs: the measured points the step-time model is fitted to and the op model calibrated on (each point's ops, traced on
fake tensors from its run's config: estimator.run_op_costs), with their runs' provenance.

    python scripts/make_calibration.py [--check] [--report]

``--check`` writes nothing and exits 1 when the shipped file differs from what the runs give (tests run it too).
``--report`` prints the op model's calibrated rates and its leave-one-out and leave-one-cell-out errors.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RUNS = ("results/h200-gpu-check-1/check", "results/h200-gpu-check-1/axes", "results/h200-gpu-check-2/check")


def calibration_text() -> str:
    import os

    from ckptbench.analysis.step_time import calibration_of
    from ckptbench.estimator.estimator import run_op_costs
    from ckptbench.results.store import load_run

    old = os.getcwd()
    os.chdir(ROOT)  # the runs are named relative to the repository root, as the sources say them
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # notes about single points are not the calibration's subject
            runs = [load_run(Path(r)) for r in RUNS]
        return json.dumps(calibration_of(runs, run_op_costs(runs)), indent=1, sort_keys=True) + "\n"
    finally:
        os.chdir(old)


def report() -> str:
    """The shipped op model: each calibrated rate, and each point's leave-one-out and leave-one-cell-out error, beside
    the fitted model's leave-one-out error (inside a measured cell: '-' where the cell's other points do not determine
    it, a cell of one or two points)."""
    from ckptbench.analysis.step_time import shipped_calibration

    model = shipped_calibration()
    fitted = {json.dumps(dict(e.point.key), sort_keys=True): e.error for c in model.cells for e in c.loo}
    lines = []
    for op_model in model.op_models:
        lines.append(f"{op_model.source()}")
        lines += [f"  {name:<28} {value:>10.4g} {_unit(name)}" for name, value in op_model.rates.achieved().items()]
        lines.append(f"  {'point':<58} {'measured s':>10} {'LOO':>8} {'LOCO':>8} {'fitted LOO':>10}")
        loco = {json.dumps(dict(c.key), sort_keys=True): c.error for c in op_model.loco}
        best = []
        for c in op_model.loo:
            k, text = c.key, json.dumps(dict(c.key), sort_keys=True)
            name = (f"{k['layout']} b={k['batch_size']} x{k['micro_batches']} {k['precision']} {k['optimizer']} "
                    f"{k['attn_implementation']} lora={k['lora']}")
            lines.append(f"  {name:<58} {c.measured_s:>10.4f} {_pct(c.error):>8} {_pct(loco.get(text)):>8} "
                         f"{_pct(fitted.get(text)):>10}")
            errors = [abs(e) for e in (c.error, fitted.get(text)) if e is not None]
            best.append(min(errors) if errors else None)
        within = [e for e in best if e is not None and e <= 0.03]
        worst = max(abs(c.error) for c in op_model.loo if c.error is not None)
        lines.append(f"  leave-one-out: the op model's largest error {worst:.2%}; {len(within)} of {len(best)} points "
                     "within 3% by the op model or the fitted one")
    return "\n".join(lines)


def _unit(name: str) -> str:
    return "TFLOP/s" if name.startswith("flop:") else "GB/s" if name.startswith("byte:") else "us"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.2%}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the shipped file, write nothing")
    parser.add_argument("--report", action="store_true", help="print the shipped op model's rates and errors")
    args = parser.parse_args(argv)
    from ckptbench.analysis.step_time import CALIBRATION

    if args.report:
        print(report())
        return 0

    target = ROOT / "ckptbench" / "data" / CALIBRATION
    text = calibration_text()
    if args.check:
        same = target.is_file() and target.read_text() == text
        print(f"{target}: {'up to date' if same else 'differs from the runs: run scripts/make_calibration.py'}")
        return 0 if same else 1
    target.write_text(text)
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
