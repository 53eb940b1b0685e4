"""Digests of every estimate a change must leave byte-identical: the configs' points (CUDA target, the default card)
and the committed runs' points (each from its stored config, on its own card), as ``Estimate.to_record()`` JSON.

    python scripts/estimate_digests.py [--out FILE]

Prints one line per input, ``<sha256 prefix>  <points>  <input>``; run it before and after a refactor and compare.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CONFIGS = ("configs/llama7b.yaml", "configs/llama7b-estimate-grid.yaml")
# Cards other than the default one whose estimates are kept too: another cuBLAS workspace (Ampere), another size.
OTHER_CARDS = (("configs/llama7b.yaml", "a100-80gb"), ("configs/llama7b.yaml", "a100-40gb"))
RUNS = ("results/h200-gpu-check-1/check", "results/h200-gpu-check-1/axes", "results/h200-gpu-check-2/check")


def digest(records: Sequence[object]) -> str:
    text = json.dumps(records, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="also write the lines to this file")
    args = parser.parse_args(argv)
    from ckptbench.config.load import load_config, parse_config
    from ckptbench.estimator.estimator import estimate_config, estimate_points
    from ckptbench.estimator.gpus import DEFAULT_GPU, gpu_for_name, gpu_model
    from ckptbench.results.store import load_run

    lines = []
    for config in CONFIGS:
        cfg = load_config(ROOT / config)
        estimates = estimate_config(cfg, target="cuda")
        lines.append(f"{digest([e.to_record() for e in estimates])}  {len(estimates):4d}  {config}")
    for config, gpu in OTHER_CARDS:
        estimates = estimate_config(load_config(ROOT / config), target="cuda", gpu=gpu)
        lines.append(f"{digest([e.to_record() for e in estimates])}  {len(estimates):4d}  {config} --gpu {gpu}")
    for name in RUNS:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run = load_run(ROOT / name)
        cfg = parse_config(run.config, source=name)
        card = gpu_for_name(run.environment.gpu_name) or gpu_model(DEFAULT_GPU)
        estimates = estimate_points(cfg, cfg.points_list(), target="cuda", gpu=card)
        lines.append(f"{digest([e.to_record() for e in estimates])}  {len(estimates):4d}  {name}")
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.out is not None:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
