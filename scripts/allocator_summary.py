"""Stages 02 and 10 summed up: each reserved prediction next to its measurement, fresh vs in-process, trace replays.

    python scripts/allocator_summary.py R      # R: a stage's results folder (scripts/gpu_stages/02-*.sh, 10-*.sh)

Writes R/allocator_summary.md and prints it. Predictions are the ones each record carries (made before
the point ran); nothing here is estimated anew except the trace replays, which are exact or fail.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path
from typing import Any

from ckptbench.estimator.recorded import load_trace, replay_recorded
from ckptbench.results.record import PointRecord
from ckptbench.results.store import load_run
from ckptbench.units import fmt_bytes


def _err(pred: int | None, meas: int | None) -> str:
    return "-" if not pred or not meas else f"{(pred - meas) / meas:+.2%}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(r) + " |" for r in rows] + [""]


def _name(rec: PointRecord) -> str:
    k = rec.key
    extra = f" {k['allocator']}" if k.get("allocator", "default") != "default" else ""
    return f"{k['model']} {k['layout']} b={k['batch_size']} s={k['seq_len']}{extra}"


def _runs(root: Path, prefix: str) -> list[PointRecord]:
    recs: list[PointRecord] = []
    for run in sorted(root.glob(prefix + "*")):
        if (run / "points.jsonl").exists():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                recs += load_run(run).points
    return recs


def _fresh(root: Path) -> dict[str, PointRecord]:
    out = {}
    for path in sorted(root.glob("traces*/records.jsonl")):
        for line in path.read_text().splitlines():
            data = json.loads(line)
            if "key" in data:
                rec = PointRecord.read({k: v for k, v in data.items() if k != "trace_file"})
                out[rec.key_id] = rec
    return out


def fresh_vs_inprocess(root: Path) -> list[str]:
    fresh, rows = _fresh(root), []
    for rec in _runs(root, "inprocess"):
        f = fresh.get(rec.key_id)
        fr = f.peak_reserved_bytes if f is not None and f.ok else None
        pred, inproc = rec.predicted_peak_reserved_bytes, rec.peak_reserved_bytes
        rows.append([
            _name(rec), fmt_bytes(fr), fmt_bytes(inproc), fmt_bytes(pred),
            _err(pred, fr), _err(pred, inproc), _err(inproc, fr), str(rec.points_before),
        ])
    header = ["point", "reserved (fresh)", "reserved (in-process)", "predicted", "error vs fresh",
              "error vs in-process", "in-process vs fresh", "points before"]
    return ["## Fresh process vs in-process (peak reserved)", "", *_table(header, rows)]


def trace_replays(root: Path) -> list[str]:
    rows = []
    for path in sorted(root.glob("traces*/*.json.gz")):
        try:
            result = replay_recorded(load_trace(path))
        except Exception as exc:  # a replay that cannot even run is a finding too
            rows.append([path.name, "-", "-", f"replay failed: {exc.__class__.__name__}: {exc}", "-"])
            continue
        same = result.replayed_segments == result.recorded_segments
        rows.append([
            path.name, fmt_bytes(result.recorded_peak_reserved), fmt_bytes(result.replayed_peak_reserved),
            f"{'identical' if same else 'DIFFERENT'} ({len(result.recorded_segments)} recorded)",
            str(result.address_mismatches),
        ])
    header = ["trace", "recorded peak reserved", "replayed", "segment allocs/frees", "blocks at another address"]
    return ["## Allocator traces replayed", "", *_table(header, rows)]


def search(root: Path) -> list[str]:
    lines = ["## batch_size: max under the 80 GiB cap", ""]
    for run_dir in sorted(root.glob("search*")):
        if not (run_dir / "run.json").exists():
            continue
        run = load_run(run_dir)
        for outcome in run.meta.searches:
            seen = outcome.to_json()
            lines.append(f"- {outcome.group}: predicted {seen.get('predicted')}, measured {seen.get('answer')}, "
                         f"probes {outcome.probes}")
        rows = [[_name(r), r.status, r.process or "-", fmt_bytes(r.peak_reserved_bytes),
                 fmt_bytes(r.predicted_peak_reserved_bytes),
                 _err(r.predicted_peak_reserved_bytes, r.peak_reserved_bytes),
                 (r.predicted_oom.segment if r.predicted_oom else None) or "-"] for r in run.points]
        header = ["probe", "status", "process", "reserved", "predicted", "error", "predicted OOM at"]
        lines += ["", *_table(header, rows)]
    return lines


def axis(root: Path) -> list[str]:
    rows = [[_name(r), r.status, r.process or "-", fmt_bytes(r.peak_allocated_bytes), fmt_bytes(r.peak_reserved_bytes),
             fmt_bytes(r.predicted_peak_reserved_bytes), _err(r.predicted_peak_reserved_bytes, r.peak_reserved_bytes),
             str(r.num_alloc_retries)] for r in _runs(root, "axis")]
    header = ["point", "status", "process", "allocated", "reserved", "predicted reserved", "error", "retries"]
    return ["## The allocator axis", "", *_table(header, rows)]


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(".")
    parts: list[Any] = ["# Predicted vs measured reserved memory", ""]
    for section in (trace_replays, fresh_vs_inprocess, search, axis):
        parts += section(root)
    text = "\n".join(parts) + "\n"
    (root / "allocator_summary.md").write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
