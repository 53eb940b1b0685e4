"""On-disk schema of a run (run.json + points.jsonl), append/load, and the DataFrame view.

The run directory's lock lives in results/lock.py, the repair of a cut-off points.jsonl in results/repair.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ckptbench.config.files import read_bounded
from ckptbench.errors import ResultsError, RunFailure
from ckptbench.json_object import JsonObject
from ckptbench.results.json_text import MAX_DEPTH, TooDeep, loads_bounded, loads_object_fields
from ckptbench.results.lock import LOCK_FILE, lock_run_dir, writer_alive
from ckptbench.results.meta import RunEnvironment, RunMeta, checked_meta
from ckptbench.results.record import PointRecord
from ckptbench.results.repair import MAX_POINTS_BYTES, repair_points_file

SCHEMA_VERSION = 1
RUN_FILE = "run.json"
POINTS_FILE = "points.jsonl"
# A bound on what a reader loads (a damaged run must not exhaust the host; points.jsonl's is MAX_POINTS_BYTES):
# run.json holds the config and the environment, a few KiB.
MAX_RUN_FILE_BYTES = 64 * 2**20
RESERVE_FILE = ".reserve"  # disk space held by a writer for run.json's final status (RunWriter)
RESERVE_BYTES = 64 * 2**10


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON through a temporary file and a rename, so readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(data, sort_keys=True, indent=2) + "\n")


def write_text_atomic(path: Path, text: str) -> None:
    """Write text through a temporary file and a rename."""
    with atomic_file(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write bytes through a temporary file and a rename."""
    with atomic_file(path) as tmp, open(tmp, "wb") as fh:
        fh.write(data)


@contextlib.contextmanager
def atomic_file(path: Path) -> Iterator[Path]:
    """A temporary file beside ``path`` for the block to write (a plot, a pickle, a report); on success it is synced
    and renamed onto ``path``, on any failure (a full disk, Ctrl-C) removed: ``path`` is either what it was or the
    whole new file, never a cut one. The rename replaces the name, not what it pointed to: a hard link or a symbolic
    link at ``path`` keeps its other file as it was. The temporary file keeps ``path``'s suffix (matplotlib reads
    the format from it)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:100]}.", suffix=path.suffix, dir=path.parent)
    try:
        try:
            os.fchmod(fd, 0o644)  # mkstemp makes it private; results are meant to be shared
        finally:
            os.close(fd)
        yield Path(tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def create_run_dir(base: Path, name: str, stamp: str) -> Path:
    """A new run directory under ``base``; never reuses one (exclusive mkdir, suffix on collision)."""
    base.mkdir(parents=True, exist_ok=True)
    for n in range(1000):
        candidate = base / (f"{name}-{stamp}" if n == 0 else f"{name}-{stamp}-{n}")
        try:
            candidate.mkdir()
        except FileExistsError:
            continue
        return candidate
    raise ResultsError(f"{base}: could not create a new run directory for {name!r}")


class RunWriter:
    """Appends one JSON line per finished point, flushed and synced as it finishes.

    The writer holds an exclusive lock on the run directory, so two sweeps never write to the
    same run, whether it is new (``--out``) or resumed. It also holds a little disk space in reserve
    (RESERVE_FILE), given up only to write run.json's status when the disk is full, so that a run on a
    full disk still ends saying how it ended instead of 'running'.
    """

    def __init__(self, run_dir: Path, meta: RunMeta) -> None:
        self.run_dir = run_dir
        self._lock = None
        wrote = False  # run.json is this writer's: a start that fails after writing it takes it back
        try:
            self._lock = lock_run_dir(run_dir)
            if (run_dir / RUN_FILE).exists():  # checked under the lock: no race with another --out
                raise ResultsError(f"{run_dir}: already holds a run; choose another --out (nothing changed)")
            # run.json as written: the JSON of its typed fields, updated as the run goes (set_status).
            self.meta: JsonObject = meta.to_json()
            write_json_atomic(run_dir / RUN_FILE, self.meta)
            wrote = True
            self.hold_reserve()
        except OSError as exc:  # a full disk, a quota: no run was started, and none is left half-made
            # (issue 35: with 4-64 KiB free, run.json fitted but the reserve did not, and the run.json left behind,
            # 'running', made a retry with the same --out refused)
            self.close()
            _unmake(run_dir, run_file=wrote)
            raise RunFailure(f"{run_dir}: cannot start the run ({exc.strerror or exc}); nothing was run") from None
        except BaseException:
            self.close()
            if wrote:  # a signal between run.json and the reserve: no run was started either
                _unmake(run_dir, run_file=True)
            raise

    @classmethod
    def reopen(cls, run_dir: Path) -> RunWriter:
        """Continue an existing run (``--resume``): lock it and cut a truncated last line.

        The caller re-reads the run under the lock and then calls :meth:`set_status`.
        """
        writer = cls.__new__(cls)
        writer.run_dir, writer.meta = run_dir, {}
        writer._lock = lock_run_dir(run_dir)
        try:
            repair_points_file(run_dir / POINTS_FILE)
        except BaseException:
            writer.close()
            raise
        return writer

    def hold_reserve(self) -> None:
        """Hold the space that writing run.json's status needs (OSError when even that is not free)."""
        size = max(RESERVE_BYTES, 2 * (self.run_dir / RUN_FILE).stat().st_size)
        with open(self.run_dir / RESERVE_FILE, "wb") as fh:  # written, not truncated: a sparse file holds nothing
            fh.write(bytes(size))
            fh.flush()
            os.fsync(fh.fileno())

    def append(self, record: PointRecord) -> None:
        line = json.dumps(record.to_json(), sort_keys=True)
        with open(self.run_dir / POINTS_FILE, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def set_status(self, status: str, **extra: Any) -> None:
        """Mark the run complete / interrupted / failed in run.json (atomically); on a full disk, with the
        space held in reserve."""
        self.meta.update(status=status, **extra)
        try:
            write_json_atomic(self.run_dir / RUN_FILE, self.meta)
        except OSError:
            reserve = self.run_dir / RESERVE_FILE
            if not reserve.exists():
                raise
            reserve.unlink()
            write_json_atomic(self.run_dir / RUN_FILE, self.meta)

    def close(self) -> None:
        """Release the run directory's lock (and the space held in reserve)."""
        if self._lock is not None:
            with contextlib.suppress(OSError):
                (self.run_dir / RESERVE_FILE).unlink(missing_ok=True)
            os.close(self._lock)
            self._lock = None


def _unmake(run_dir: Path, *, run_file: bool = False) -> None:
    """Remove what a run that could not start left (its lock, its reserve, a half-written temporary file, and
    ``run_file``: the run.json it wrote) and the folder when nothing else is in it: a failed start leaves no run
    directory holding only '.lock', nor a run.json saying 'running' of a run that never ran."""
    with contextlib.suppress(OSError):
        for path in run_dir.iterdir():
            ours = path.name in (LOCK_FILE, RESERVE_FILE) or (run_file and path.name == RUN_FILE)
            if ours or path.name.startswith(f".{RUN_FILE}."):
                path.unlink()
        run_dir.rmdir()  # fails, as it should, when anything else is there


@dataclass
class Run:
    """A loaded run: its metadata, point records (the latest per key) and any load warnings."""

    path: Path
    meta: RunMeta
    points: list[PointRecord]
    warnings: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        """The directory name: what identifies the run on the command line (compare, --resume); bytes that
        are not UTF-8 shown as U+FFFD (a name is printed, plotted and written into report.md)."""
        return shown_name(self.path.name)

    @property
    def title(self) -> str:
        """The run's own name (run.json ``name``, the config's name) for titles; else the directory name."""
        return shown_name(self.meta.name) if self.meta.name else self.name

    @property
    def command(self) -> str:
        """The command that wrote the run, 'sweep' or 'tune' (run.json ``command``; runs written before it was
        recorded: 'tune' when they hold tune's options, else 'sweep')."""
        written = self.meta.command
        if written in ("sweep", "tune"):
            return written
        return "tune" if "tune" in self.meta.model_fields_set else "sweep"

    @property
    def config(self) -> JsonObject:
        """The resolved config the run was measured with, as JSON (config/load.py ``parse_config`` types it)."""
        return self.meta.config

    def sizes(self) -> list[int]:
        """Every peak the run holds, measured or predicted: what picks the display unit of its sizes."""
        found = (
            (p.peak_allocated_bytes, p.peak_reserved_bytes, p.predicted_peak_allocated_bytes) for p in self.points
        )
        return [s for group in found for s in group if s is not None]

    @property
    def environment(self) -> RunEnvironment:
        return self.meta.environment

    @property
    def gpu_models(self) -> dict[str, int]:
        """How many measured points ran on each GPU model (a point's own record, else the run's GPU);
        more than one model means the run mixes cards (a fanned-out sweep on a mixed cluster)."""
        counts: dict[str, int] = {}
        run_gpu = self.environment.gpu_name  # looked up once, not per point
        for rec in self.points:
            if rec.status in ("ok", "oom"):
                name = rec.gpu_name or run_gpu
                if name:
                    counts[name] = counts.get(name, 0) + 1
        return counts

    @property
    def mixed_gpus(self) -> str | None:
        """'NVIDIA A100 (3), NVIDIA H100 (2)' when the points ran on different GPU models, else None."""
        models = self.gpu_models
        if len(models) < 2:
            return None
        return ", ".join(f"{name} ({n})" for name, n in sorted(models.items(), key=lambda kv: (-kv[1], kv[0])))


def shown_name(text: str) -> str:
    """``text`` as it can be printed and written: a file name's undecodable bytes (held by Python as lone
    surrogates) and any lone surrogate become U+FFFD, instead of a UnicodeEncodeError half-way through a report."""
    if not _has_surrogates(text):
        return text
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    except UnicodeEncodeError:  # a surrogate that stands for no byte (JSON's "\ud800")
        return text.encode("utf-8", "replace").decode("utf-8")


def _has_surrogates(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def resolve_run_path(ref: str | Path, *, results_root: Path = Path("results")) -> Path:
    """A run directory given as a path or as a run name under ``results/``."""
    p = Path(ref)
    for candidate in (p, results_root / p):
        if (candidate / RUN_FILE).is_file():
            return candidate
    if p.is_dir() or (results_root / p).is_dir():
        raise ResultsError(f"{ref}: not a ckptbench run (no {RUN_FILE} inside)")
    looked = p if p.is_absolute() else f"{p} and {results_root / p}"
    raise ResultsError(f"{ref}: no such run directory (looked at {looked})")


def load_run(ref: str | Path, *, results_root: Path = Path("results")) -> Run:
    """Read run.json and points.jsonl; tolerate a truncated last line with a warning."""
    path = resolve_run_path(ref, results_root=results_root)
    try:
        text = read_bounded(path / RUN_FILE, limit_bytes=MAX_RUN_FILE_BYTES, what="a run's run.json",
                            error=ResultsError).decode("utf-8")
        meta, too_deep = loads_object_fields(text)  # a field nested thousands deep costs only itself
    except (OSError, ValueError) as exc:
        raise ResultsError(f"{path / RUN_FILE}: unreadable ({exc.__class__.__name__}: {exc})") from None
    if not isinstance(meta, dict):
        raise ResultsError(f"{path / RUN_FILE}: not a JSON object")
    version = meta.get("schema_version")
    if version != SCHEMA_VERSION or isinstance(version, bool):
        newer = isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION
        which = "a newer" if newer else "an older"
        raise ResultsError(
            f"{path}: written by {which} ckptbench (schema {version!r}, this one reads {SCHEMA_VERSION}); "
            f"use ckptbench {meta.get('ckptbench_version', '?')} to read it"
        )
    run = Run(path=path, meta=RunMeta(schema_version=SCHEMA_VERSION), points=[])
    for name in too_deep:
        _skip(run, f"{path / RUN_FILE}: ignored field {name!r} (nested more than {MAX_DEPTH} levels deep)")
    run.meta, notes = checked_meta(meta, source=str(path / RUN_FILE))
    for note in notes:
        _skip(run, note)
    if run.meta.status == "running" and writer_alive(path) is False:
        run.meta = run.meta.model_copy(update={"status": "interrupted"})  # in memory only: a reader never writes
        _skip(run, f"{path}: run.json says 'running' but no ckptbench process holds the run: it was "
                   f"interrupted (killed?); finish it with: ckptbench {run.command} CONFIG --resume {path}")
    _read_points(run)
    run.points = latest_per_key(run.points)
    return run


def latest_per_key(records: list[PointRecord]) -> list[PointRecord]:
    """One record per key: a retried point (``--resume``) supersedes its earlier record."""
    last = {r.key_id: i for i, r in enumerate(records)}
    return [r for i, r in enumerate(records) if last[r.key_id] == i]


def _read_points(run: Run) -> None:
    """Append the record of every valid line: a damaged line costs only itself (a note each); fields the
    record does not declare (another version wrote them) are kept, and named in one note for the file."""
    pfile = run.path / POINTS_FILE
    if not pfile.exists():
        return
    try:
        data = read_bounded(pfile, limit_bytes=MAX_POINTS_BYTES, what="a run's points.jsonl", error=ResultsError)
        lines = data.split(b"\n")  # bytes: one damaged byte costs its line, not the run
    except OSError as exc:
        raise ResultsError(f"{pfile}: unreadable ({exc.__class__.__name__})") from None
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    unknown: set[str] = set()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        # The quick path, for text that cannot nest too deep (MAX_DEPTH brackets at least): parsed and checked
        # at once; anything it refuses takes the path below, which says why line by line as before.
        if line.count(b"[") + line.count(b"{") <= MAX_DEPTH:
            try:
                record = PointRecord.read_json(line)
            except ValidationError:
                pass
            else:
                run.points.append(record)
                unknown.update(record.unknown_fields())
                continue
        try:
            data = loads_bounded(line)
        except TooDeep as exc:
            _skip(run, f"{pfile}: ignored line {i + 1} (JSON {exc})")
            continue
        except ValueError:
            if i == last:
                _skip(run, f"{pfile}: ignored a truncated last line (line {i + 1}; the run was cut off mid-write)")
            else:
                _skip(run, f"{pfile}: ignored line {i + 1} (not JSON)")
            continue
        try:
            record = PointRecord.read(data)
        except ValidationError as exc:
            _skip(run, f"{pfile}: ignored line {i + 1} (not a valid point record: {_first_problem(exc)})")
            continue
        run.points.append(record)
        unknown.update(record.unknown_fields())
    if unknown:
        _skip(run, f"{pfile}: kept fields this ckptbench does not know as they are (another version wrote "
                   f"them): {', '.join(sorted(unknown))}")


def _skip(run: Run, message: str) -> None:
    run.warnings.append(message)
    warnings.warn(message, stacklevel=3)


def _first_problem(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(x) for x in err.get("loc", ())) or "record"
    return f"{where}: {str(err.get('msg', 'invalid')).removeprefix('Value error, ')}"
