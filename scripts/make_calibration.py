"""Write the step-time calibration ckptbench ships (ckptbench/data/step_time_calibration.json) from the committed H200
runs: the measured points the step-time model is fitted to, with their runs' provenance.

    python scripts/make_calibration.py [--check]

``--check`` writes nothing and exits 1 when the shipped file differs from what the runs give (tests run it too).
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
    from ckptbench.results.store import load_run

    old = os.getcwd()
    os.chdir(ROOT)  # the runs are named relative to the repository root, as the sources say them
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # notes about single points are not the calibration's subject
            runs = [load_run(Path(r)) for r in RUNS]
        return json.dumps(calibration_of(runs), indent=1, sort_keys=True) + "\n"
    finally:
        os.chdir(old)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the shipped file, write nothing")
    args = parser.parse_args(argv)
    from ckptbench.analysis.step_time import CALIBRATION

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
