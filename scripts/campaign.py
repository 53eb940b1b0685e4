"""Helpers of the GPU campaign's stage scripts (scripts/gpu_stages/), runnable without an install.

    python3 scripts/campaign.py estimate CONFIG...      the GPU time of each config and their sum (an estimate)
    python3 scripts/campaign.py stage STAGE.sh          the same for the configs a stage script names
    python3 scripts/campaign.py dry CONFIG OUT_DIR      write the CPU (DRY=1) form of CONFIG, print its path

Estimates are calibrated on the committed runs named by CALIBRATION_RUNS (scripts/campaign_lib/gpu_time.py).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from ckptbench.config.load import load_config, parse_config  # noqa: E402
from ckptbench.results.store import load_run  # noqa: E402
from scripts.campaign_lib.gpu_time import SweepTime, calibrate, estimate_sweep  # noqa: E402
from scripts.campaign_lib.shrink import dry_config  # noqa: E402

CALIBRATION_RUNS = ("results/h200-gpu-check-2/check", "results/h200-gpu-check-1/axes")
CONFIG_IN_STAGE = re.compile(r"configs/[\w/.-]+\.yaml")
# `ckptbench tune` measures the points it chooses, within its --time-budget: its config's grid is the
# space it searches, not a sweep to estimate. Such a stage's '# gpu-seconds' header is its time limit.
TUNE_IN_STAGE = re.compile(r"\$CK tune\b")


def estimates(configs: list[str]) -> list[SweepTime]:
    cal = calibrate([load_run(ROOT / r) for r in CALIBRATION_RUNS])
    return [estimate_sweep(cal, load_config(ROOT / c)) for c in configs]


def stage_configs(stage: Path) -> list[str]:
    """The configs a stage script runs (named outside its comments), in order of first mention."""
    code = [line for line in stage.read_text(encoding="utf-8").splitlines() if not line.lstrip().startswith("#")]
    if TUNE_IN_STAGE.search("\n".join(code)):
        return []
    return list(dict.fromkeys(CONFIG_IN_STAGE.findall("\n".join(code))))


def print_estimates(configs: list[str]) -> float:
    times = estimates(configs)
    for t in times:
        print(f"  {t.describe()}")
    total = sum(t.seconds for t in times)
    print(f"  total: about {total:.0f} s of GPU time (estimate, calibrated on {', '.join(CALIBRATION_RUNS)})")
    return total


def write_dry(config: str, out_dir: str) -> Path:
    data = yaml.safe_load((ROOT / config).read_text(encoding="utf-8"))
    small = dry_config(data)
    parse_config(small)  # the shrunk config must be valid, or the stage fails here and says why
    path = Path(out_dir) / f"{Path(config).stem}.dry.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(small, sort_keys=False), encoding="utf-8")
    return path


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "estimate":
        print_estimates(argv[1:])
    elif len(argv) == 2 and argv[0] == "stage":
        print_estimates(stage_configs(Path(argv[1])))
    elif len(argv) == 3 and argv[0] == "dry":
        print(write_dry(argv[1], argv[2]))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
