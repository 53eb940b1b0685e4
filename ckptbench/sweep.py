"""A whole sweep: check the machine, create the run directory, run every point, record each one."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptbench import env
from ckptbench.config import SweepConfig, check_cpu_compatible
from ckptbench.errors import ConfigError, ResultsError
from ckptbench.model import llama_config
from ckptbench.results import RUN_FILE, RunWriter, create_run_dir
from ckptbench.runner import Progress, Runner, make_probe, resolve_device
from ckptbench.search import make_searches


@dataclass
class SweepOutcome:
    """Where the run was written and how it ended."""

    run_dir: Path
    records: list[dict[str, Any]]
    status: str


def _prepare_dir(cfg: SweepConfig, out: Path | None, results_root: Path) -> Path:
    if out is None:
        stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
        return create_run_dir(results_root, cfg.name, stamp)
    if (out / RUN_FILE).exists():
        raise ResultsError(f"{out}: already holds a run; choose another --out (nothing was overwritten)")
    if out.exists() and not out.is_dir():
        raise ResultsError(f"{out}: exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    return out


def run_sweep(
    cfg: SweepConfig,
    *,
    out: Path | None = None,
    results_root: Path = Path("results"),
    on_progress: Callable[[Progress], None] | None = None,
) -> SweepOutcome:
    """Run every point of ``cfg``; each finished point is on disk before the next one starts."""
    device = resolve_device(cfg)
    if device.type == "cpu":
        try:
            check_cpu_compatible(cfg)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    llama_config(cfg.model)  # unknown override names fail here, before anything is created
    points = cfg.points_list()
    run_dir = _prepare_dir(cfg, out, results_root)
    environment = env.collect(device.type)
    probe = make_probe(cfg, device)
    environment["probe"] = probe.kind
    writer = RunWriter(
        run_dir,
        {
            "ckptbench_version": environment["ckptbench_version"],
            "git_sha": environment["git_sha"],
            "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "name": cfg.name,
            "status": "running",
            "num_points": len(points),
            "environment": environment,
            "config": cfg.model_dump(mode="json"),
        },
    )
    records: list[dict[str, Any]] = []

    def record(event: Progress) -> None:
        if event.record is not None:
            writer.append(event.record)
            records.append(event.record)
        if on_progress is not None:
            on_progress(event)

    runner = Runner(cfg, device, probe, gpu_name=environment.get("gpu_name"))
    try:
        searches = runner.run(points, record, make_searches(cfg))
    except KeyboardInterrupt:
        writer.set_status("interrupted", finished_points=len(records))
        raise
    except BaseException:
        writer.set_status("failed", finished_points=len(records))
        raise
    writer.set_status("complete", finished_points=len(records), searches=searches)
    return SweepOutcome(run_dir=run_dir, records=records, status="complete")
