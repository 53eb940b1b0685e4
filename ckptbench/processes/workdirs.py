"""The temporary folders of points, jobs and traces run in other processes: named after the process that
owns them, so that the folders a killed sweep left behind (SIGKILL runs no cleanup) are removed by the next."""

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
