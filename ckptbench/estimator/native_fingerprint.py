"""The fingerprint of the estimator's C source (``_replay_native.c``): setup.py compiles it into the built module
(``SOURCE_HASH``), and allocator.py compares the two, so that a build older than the source beside it is not used.

It imports nothing of ckptbench: setup.py runs this file before the package is installed."""

from __future__ import annotations

import hashlib
from pathlib import Path

SOURCE = Path(__file__).with_name("_replay_native.c")


def source_hash(path: Path = SOURCE) -> str | None:
    """The first 16 hex digits of the source's sha256; None where the source is not there (an install that left it
    out: its build was made from the source it shipped with, and is used as it is)."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    except FileNotFoundError:
        return None
