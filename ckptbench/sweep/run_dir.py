"""The run directory of a sweep: where it may go (checked before anything runs), created new or reopened
for ``--resume`` (checked against the config and machine, locked), and the writer that holds it."""

from __future__ import annotations

import datetime as dt
import warnings
from pathlib import Path

from ckptbench.config.schema import SweepConfig
from ckptbench.errors import ResultsError, RunFailure
from ckptbench.json_object import JsonObject
from ckptbench.results.meta import Resume, RunEnvironment, RunMeta, RunOptions
from ckptbench.results.paths import check_writable_dir
from ckptbench.results.record import PointRecord
from ckptbench.results.store import (
    RUN_FILE,
    SCHEMA_VERSION,
    Run,
    RunWriter,
    create_run_dir,
    load_run,
    resolve_run_path,
)
from ckptbench.sweep.resume import check_resumable, done_records


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def check_paths(*, out: Path | None, resume: Path | None, results_root: Path) -> Path | None:
    """Check where the run will be written, before anything runs; the resolved ``--resume`` directory."""
    if resume is None:
        where, option = (out, "--out") if out is not None else (results_root, "--results")
        check_writable_dir(where, option=option)
        if out is not None and (out / RUN_FILE).exists():
            raise ResultsError(f"{out}: already holds a run; choose another --out (nothing was overwritten)")
        return None
    try:
        resolved = resolve_run_path(resume, results_root=results_root)
    except ResultsError as exc:
        raise ResultsError(f"--resume {exc}") from None
    check_writable_dir(resolved, option="--resume")
    return resolved


def start_run(
    cfg: SweepConfig, *, out: Path | None, resume: Path | None, results_root: Path,
    environment: RunEnvironment, options: RunOptions, num_points: int, meta: JsonObject | None = None,
) -> tuple[RunWriter, dict[str, PointRecord], list[str]]:
    """The writer of a new or reopened run, the points it already holds and the notes of loading it; ``meta``:
    more run.json fields, as JSON (a tune run's options, its command)."""
    command = str((meta or {}).get("command", "sweep"))
    if resume is not None:
        writer, run = _open_run(cfg, resume=resume, environment=environment, options=options, command=command)
        return writer, done_records(run), run.warnings
    run_meta = RunMeta.model_validate({
        "schema_version": SCHEMA_VERSION,
        "ckptbench_version": environment.ckptbench_version,
        "git_sha": environment.git_sha,
        "created_at": _now(),
        "name": cfg.name,
        "status": "running",
        "environment": environment,
        "config": cfg.model_dump(mode="json"),
        "num_points": num_points,
        "options": options,
        "command": command,
        **(meta or {}),
    })
    return RunWriter(_prepare_dir(cfg, out, results_root), run_meta), {}, []


def _prepare_dir(cfg: SweepConfig, out: Path | None, results_root: Path) -> Path:
    try:
        if out is None:
            stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
            return create_run_dir(results_root, cfg.name, stamp)
        if (out / RUN_FILE).exists():
            raise ResultsError(f"{out}: already holds a run; choose another --out (nothing was overwritten)")
        if out.exists() and not out.is_dir():
            raise ResultsError(f"{out}: exists and is not a directory")
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # checked up front (check_paths); this is a race with another process or a full disk
        where = out if out is not None else results_root
        raise ResultsError(f"{where}: cannot create the run directory ({exc.strerror or exc})") from None
    return out


def _open_run(
    cfg: SweepConfig, *, resume: Path, environment: RunEnvironment, options: RunOptions, command: str
) -> tuple[RunWriter, Run]:
    """Lock an existing run, re-read it under the lock, check it still matches, and mark it running."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a truncated last line is reported through Run.warnings
        check_resumable(cfg, load_run(resume), environment, command=command)  # before the lock: change nothing
        try:
            writer = RunWriter.reopen(resume)
        except OSError as exc:  # the repair of a cut-off last line could not be written
            raise RunFailure(f"{resume}: cannot resume the run ({exc.strerror or exc}); nothing was run") from None
        try:
            run = load_run(resume)
            check_resumable(cfg, run, environment, command=command)
        except BaseException:
            writer.close()
            raise
    resumed = Resume(at=_now(), git_sha=environment.git_sha, **options.given())
    history = [*run.meta.resumes, resumed]
    writer.meta = run.meta.to_json()
    try:
        writer.hold_reserve()
        writer.set_status("running", resumes=[r.to_json() for r in history])
    except OSError as exc:  # a full disk: run.json is written whole or not at all, so it is as it was
        writer.close()
        raise RunFailure(f"{resume}: cannot resume the run ({exc.strerror or exc}); nothing was run") from None
    return writer, run
