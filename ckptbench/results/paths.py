"""Where a command may write: ``--out``, ``--results``, ``--resume`` and an output file (``--snapshot``)
checked before anything runs.

Each problem (a file where a folder is needed, a folder nobody may write, /proc, a name or a path longer
than the file system allows) is one ConfigError naming the option, raised before a model is built or a
run directory created, instead of an OSError traceback after the sweep has started.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from pathlib import Path

from ckptbench.errors import ConfigError, RunFailure
from ckptbench.results.lock import LOCK_FILE
from ckptbench.results.store import POINTS_FILE, RUN_FILE

_NAME_MAX, _PATH_MAX = 255, 4096  # Linux's limits, used where pathconf cannot tell
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)  # no space (or quota) left: not the user's mistake


def _limit(path: Path, name: str, default: int) -> int:
    with contextlib.suppress(OSError, ValueError):
        return int(os.pathconf(path, name))
    return default


def _shown(path: Path) -> str:
    text = str(path)
    return text if len(text) <= 80 else text[:40] + "..." + text[-37:]


def _nearest_existing(path: Path, option: str) -> Path:
    """The deepest existing folder above (or at) ``path``; a file on the way is a ConfigError."""
    current = path.absolute()
    chain = [current, *current.parents]
    for candidate in chain:
        try:
            exists = candidate.exists()
        except OSError as exc:  # a component too long, or not searchable
            why = exc.strerror or exc
            raise ConfigError(f"{option} {_shown(path)}: cannot look at {_shown(candidate)} ({why})") from None
        if not exists:
            continue
        if not candidate.is_dir():
            what = "it" if candidate == current else _shown(candidate)
            raise ConfigError(f"{option} {_shown(path)}: {what} exists and is not a directory")
        return candidate
    return Path(path.anchor or "/")


def check_writable_dir(path: Path, *, option: str) -> None:
    """ConfigError (one line, naming ``option``) unless ``path`` is or can become a folder this process
    can write into. Nothing is left behind: the check creates and removes one empty folder."""
    text = str(path)
    if not text or text.isspace():
        raise ConfigError(f"{option}: an empty path; give a folder, e.g. {option} results/my-run")
    probe = Path(path.anchor or os.sep)  # limits per file system; the root's are the usual ones
    path_max, name_max = _limit(probe, "PC_PATH_MAX", _PATH_MAX), _limit(probe, "PC_NAME_MAX", _NAME_MAX)
    if len(os.fsencode(str(path.absolute()))) >= path_max:
        raise ConfigError(f"{option} {_shown(path)}: the path is longer than the file system allows ({path_max} bytes)")
    long = next((part for part in path.parts if len(os.fsencode(part)) > name_max), None)
    if long is not None:
        raise ConfigError(
            f"{option} {_shown(path)}: the name {_shown(Path(long))} is {len(os.fsencode(long))} bytes long, "
            f"more than the file system allows ({name_max})"
        )
    check_not_run_file(path, option=option)
    existing = _nearest_existing(path, option)
    try:  # the only test that holds for root, read-only mounts and /proc alike: try it
        os.rmdir(tempfile.mkdtemp(prefix=".ckptbench-write-test-", dir=existing))
    except OSError as exc:
        if exc.errno in _DISK_FULL:  # the disk's failure (exit 1), not a mistake on the command line
            raise RunFailure(f"{option} {_shown(path)}: cannot create a folder in {_shown(existing)} "
                             f"({exc.strerror or exc}); nothing was written") from None
        raise ConfigError(
            f"{option} {_shown(path)}: cannot create a folder in {_shown(existing)} ({exc.strerror or exc})"
        ) from None


# What a run directory is made of (results/store.py, results/lock.py, render/summary.py): no command's
# output may land on one of these inside a run directory, or a report would replace the records it reads.
RUN_OWN_FILES = frozenset({RUN_FILE, POINTS_FILE, "summary.csv", "summary.md", LOCK_FILE})


def check_not_run_file(path: Path, *, option: str) -> None:
    """ConfigError (one line, naming ``option``) when writing ``path`` would replace a file of a run directory
    (run.json, points.jsonl, its summaries or lock), through a symbolic link too: results are never overwritten
    by a command's output."""
    for candidate in {path.absolute(), _resolved(path)}:
        if candidate.name in RUN_OWN_FILES and (candidate.parent / RUN_FILE).is_file():
            raise ConfigError(
                f"{option} {_shown(path)}: that is {candidate.name} of the run in {_shown(candidate.parent)}; "
                "a command never writes over a run's own files (choose another file)"
            )


def _resolved(path: Path) -> Path:
    try:
        return path.resolve()
    except (OSError, RuntimeError):  # a symlink loop: the file will not be written either
        return path.absolute()


_NOT_FILES = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
              (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))


def check_output_file(path: Path, *, option: str) -> None:
    """ConfigError (one line, naming ``option``) unless ``path`` can become a regular file this process writes: not
    a run's own file (through a link either), not a FIFO, device, socket or folder (a FIFO blocked the write
    forever), in a folder that is or can be made and written. Checked before the work whose result it holds."""
    check_not_run_file(path, option=option)
    try:
        mode = path.stat().st_mode  # links followed: what a write would reach
    except FileNotFoundError:
        mode = None
    except OSError as exc:
        raise ConfigError(f"{option} {_shown(path)}: cannot look at it ({exc.strerror or exc})") from None
    if mode is not None and not stat.S_ISREG(mode):
        kind = next((name for test, name in _NOT_FILES if test(mode)), "not a regular file")
        raise ConfigError(f"{option} {_shown(path)}: is {kind}, not a file to write; give a file name")
    check_writable_dir(path.parent, option=option)
