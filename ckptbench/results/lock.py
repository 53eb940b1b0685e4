"""The run directory's lock: held by the one process writing a run, tested by readers of a 'running' run."""

from __future__ import annotations

import os
from pathlib import Path

from ckptbench.errors import ResultsError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

LOCK_FILE = ".lock"


def lock_run_dir(run_dir: Path) -> int | None:
    """Hold an exclusive lock on the run directory for this process's lifetime (released on any exit)."""
    if fcntl is None:  # not POSIX: no locking; create_run_dir's exclusive mkdir still separates new runs
        return None
    fd = os.open(run_dir / LOCK_FILE, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise ResultsError(f"{run_dir}: in use by another ckptbench process (nothing was changed)") from None
    return fd


def writer_alive(run_dir: Path) -> bool | None:
    """Whether a process holds the run's lock (a sweep writing it); None where that cannot be told."""
    if fcntl is None:
        return None
    try:
        fd = os.open(run_dir / LOCK_FILE, os.O_RDONLY)
    except FileNotFoundError:  # every writer creates the lock file before run.json: none is alive
        return False
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # closing releases the shared lock, if it was taken
    return False
