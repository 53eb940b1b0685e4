"""A sweep's run directory: created for a new run (run.json written), or reopened, locked and checked
for ``--resume``."""

from __future__ import annotations

import datetime as dt
import warnings
from pathlib import Path
from typing import Any

from ckptbench.bench.resume import check_resumable
from ckptbench.config.schema import SweepConfig
from ckptbench.errors import ResultsError
from ckptbench.results.store import RUN_FILE, Run, RunWriter, create_run_dir, load_run


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


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


def open_run(
    cfg: SweepConfig, *, resume: Path, environment: dict[str, Any], options: dict[str, Any]
) -> tuple[RunWriter, Run]:
    """Lock an existing run, re-read it under the lock, check it still matches, and mark it running."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a truncated last line is reported through Run.warnings
        check_resumable(cfg, load_run(resume), environment)  # before the lock: change nothing if refused
        writer = RunWriter.reopen(resume)
        try:
            run = load_run(resume)
            check_resumable(cfg, run, environment)
        except BaseException:
            writer.close()
            raise
    history = [*run.meta.get("resumes", []), {"at": _now(), "git_sha": environment["git_sha"], **options}]
    writer.meta = run.meta
    writer.set_status("running", resumes=history)
    return writer, run


def new_run(
    cfg: SweepConfig,
    *,
    out: Path | None,
    results_root: Path,
    environment: dict[str, Any],
    meta: dict[str, Any],
) -> RunWriter:
    """Create the run directory (``out``, or a new one under ``results_root``) and its run.json."""
    return RunWriter(
        _prepare_dir(cfg, out, results_root),
        {
            "ckptbench_version": environment["ckptbench_version"],
            "git_sha": environment["git_sha"],
            "created_at": _now(),
            "name": cfg.name,
            "status": "running",
            "environment": environment,
            "config": cfg.model_dump(mode="json"),
            **meta,
        },
    )
