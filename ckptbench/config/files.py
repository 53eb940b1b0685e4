"""Reading a file a user named, bounded: a regular file only (never a FIFO, a device such as /dev/zero or a
socket, which would block or never end), and at most a given size, so that no input is read unbounded."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ckptbench.errors import CkptbenchError, ConfigError

_KINDS = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a directory"),
)


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _size(n: int) -> str:
    return f"{n // 2**20} MiB" if n >= 2**20 else f"{n // 2**10} KiB"


def read_bounded(
    path: Path, *, limit_bytes: int, what: str, error: type[CkptbenchError] = ConfigError
) -> bytes:
    """The bytes of the regular file ``path`` (links followed); ``error`` (one line naming ``path`` and
    ``what`` it should be) for anything else or for more than ``limit_bytes``. OSError passes through."""
    # O_NONBLOCK: opening a FIFO for reading would wait for a writer; with it, the open returns at once
    # and fstat tells what it is. It changes nothing for a regular file.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise error(f"{path}: is {_kind(mode)}, not {what}; give a regular file")
        chunks, total = [], 0
        while total <= limit_bytes:  # read, not st_size: a file can grow while it is read
            chunk = os.read(fd, min(2**20, limit_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > limit_bytes:
            raise error(f"{path}: larger than {_size(limit_bytes)}, too large for {what}")
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_bounded_text(
    path: Path, *, limit_bytes: int, what: str, error: type[CkptbenchError] = ConfigError
) -> str:
    """:func:`read_bounded` decoded as UTF-8; text that is not UTF-8 is ``error`` too."""
    data = read_bounded(path, limit_bytes=limit_bytes, what=what, error=error)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text (byte {exc.start}); {what} is text") from None
