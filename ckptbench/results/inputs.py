"""A command's input that may be a YAML config or a run directory: the config, and what the run measured."""

from __future__ import annotations

from pathlib import Path

from ckptbench.config.load import load_config, parse_config
from ckptbench.config.schema import SweepConfig
from ckptbench.errors import ResultsError
from ckptbench.results.store import RUN_FILE, load_run

Measured = dict[str, int | str]  # by point key_id: peak allocated bytes of an ok point, else its status


def load_input(path: str | Path) -> tuple[SweepConfig, Measured]:
    """A YAML config, or a run directory: its resolved config and what it measured, by ``key_id``:
    the peak allocated bytes of an ``ok`` point, else its status ('oom', 'skipped', ...)."""
    p = Path(path)
    if not (p / RUN_FILE).is_file():
        return load_config(p), {}
    run = load_run(p)
    if not run.config:
        raise ResultsError(f"{p / RUN_FILE}: holds no config (the field is missing or damaged); nothing to estimate")
    cfg = parse_config(run.config, source=str(p / RUN_FILE))
    measured: Measured = {}
    for rec in run.points:
        ok = rec.ok and rec.peak_allocated_bytes is not None
        measured[rec.key_id] = int(rec.peak_allocated_bytes or 0) if ok else rec.status
    return cfg, measured


def measured_reserved(path: str | Path) -> dict[str, int]:
    """Peak reserved bytes of a run directory's ok points by ``key_id`` (empty for a config)."""
    p = Path(path)
    if not (p / RUN_FILE).is_file():
        return {}
    return {r.key_id: int(r.peak_reserved_bytes) for r in load_run(p).points if r.ok and r.peak_reserved_bytes}


def measured_gpu(path: str | Path) -> str | None:
    """The GPU a run directory was measured on (torch's device name), or None."""
    p = Path(path)
    if not (p / RUN_FILE).is_file():
        return None
    return load_run(p).environment.gpu_name or None
