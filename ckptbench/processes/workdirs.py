"""The temporary folders of points, jobs and traces run in other processes: named after the process that
owns them, so that the folders a killed sweep left behind (SIGKILL runs no cleanup) are removed: by the processes
it started, which notice that it is gone and take its folders with them (``remove_workdirs_of``), and else by the
next sweep (``remove_stale_workdirs``)."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

KINDS = ("point", "job", "trace", "forkserver")
_NAME = re.compile(r"ckptbench-(point|job|trace|forkserver)-(\d+)-[A-Za-z0-9_]+")


def workdir(kind: str) -> tempfile.TemporaryDirectory[str]:
    """A temporary folder for one ``kind`` ('point', 'job', 'trace', 'forkserver': its socket) of this process,
    removed when done."""
    assert kind in KINDS, kind
    return tempfile.TemporaryDirectory(prefix=f"ckptbench-{kind}-{os.getpid()}-")


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (True for someone else's; False once it exited, even unreaped)."""
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's: not ours to remove
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[:1] != ["Z"]  # exited, waiting to be reaped: gone


def remove_stale_workdirs(root: Path | None = None) -> list[Path]:
    """Remove the folders (under the temporary directory) whose owning process is gone; the ones removed."""
    base = Path(root or tempfile.gettempdir())
    removed = []
    try:
        entries = list(base.iterdir())
    except OSError:
        return []
    for path in entries:
        found = _NAME.fullmatch(path.name)
        if found is None or int(found.group(2)) == os.getpid() or alive(int(found.group(2))):
            continue
        shutil.rmtree(path, ignore_errors=True)
        if not path.exists():
            removed.append(path)
    return removed


def remove_workdirs_of(pid: int, root: Path | None = None, *, check_alive: bool = True) -> list[Path]:
    """Remove the folders of process ``pid`` (once it is gone, unless ``check_alive`` is False: a process removing its
    own on its way out); the ones removed. Called by the processes a sweep started (a point's process, a job, the
    fork server) when they find that the sweep was killed: its folders go with it, not at the next sweep."""
    if check_alive and alive(pid):
        return []
    base = Path(root or tempfile.gettempdir())
    removed = []
    for path in base.glob(f"ckptbench-*-{pid}-*"):
        found = _NAME.fullmatch(path.name)
        if found is None or int(found.group(2)) != pid:
            continue
        shutil.rmtree(path, ignore_errors=True)
        if not path.exists():
            removed.append(path)
    return removed


def owner_of(folder: Path) -> int | None:
    """The pid a folder of ``workdir`` is named after (None for any other name)."""
    found = _NAME.fullmatch(folder.name)
    return int(found.group(2)) if found else None
