"""Large runs made from the committed H200 run (for the tests and scripts/bench_tool.py): the batch-2 record of each
layout repeated at batch sizes 1, 2, ... (activation memory and step times scaled with the batch)."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

COMMITTED_RUN = Path(__file__).resolve().parents[1] / "results" / "h200-gpu-check-2" / "check"


def synthetic_run(dest: Path, points: int, *, scale: float = 1.0) -> Path:
    """A run of ``points`` points under ``dest``; ``scale`` multiplies the step times."""
    records = [json.loads(line) for line in (COMMITTED_RUN / "points.jsonl").read_text().splitlines() if line]
    templates = list({r["key"]["layout"]: r for r in reversed(records) if r["status"] == "ok"
                      and r["key"]["batch_size"] == 2}.values())[::-1]
    dest.mkdir(parents=True)
    shutil.copy(COMMITTED_RUN / "run.json", dest / "run.json")
    with (dest / "points.jsonl").open("w") as fh:
        for i in range(points):
            rec = copy.deepcopy(templates[i % len(templates)])
            batch = 1 + i // len(templates)
            rec["key"]["batch_size"] = batch
            rec["step_times_s"] = [t * batch / 2 * scale * (1 + 0.001 * (i % 7)) for t in rec["step_times_s"]]
            static = rec["memory"]["window_start_allocated_bytes"]
            for k in ("peak_allocated_bytes", "peak_reserved_bytes"):
                rec[k] = static + (rec[k] - static) * batch // 2
            fh.write(json.dumps(rec, sort_keys=True) + "\n")
    return dest
