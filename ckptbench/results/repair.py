"""Repair of a points.jsonl whose last record was cut off mid-write, so that it is safe to append to."""

from __future__ import annotations

import json
from pathlib import Path

from ckptbench.config.files import read_bounded
from ckptbench.errors import ResultsError

MAX_POINTS_BYTES = 1 * 2**30  # what a reader loads of points.jsonl: a record is a few KiB, so 100,000 points fit


def repair_points_file(path: Path) -> bool:
    """Make points.jsonl safe to append to; True if it was changed.

    A last record cut off mid-write (not JSON) is cut away, whatever follows it (a newline, blank
    lines): appended records must never follow it, or the damage would sit in the middle of the file
    for good. A complete last record that lacks only its newline keeps its data and gets the newline.
    """
    if not path.exists():
        return False
    data = read_bounded(path, limit_bytes=MAX_POINTS_BYTES, what="a run's points.jsonl", error=ResultsError)
    body = data.rstrip()
    if not body:
        return False
    start = body.rfind(b"\n") + 1
    try:
        json.loads(body[start:])
    except RecursionError:  # nested thousands deep but whole: load_run skips it with a note; keep it
        pass
    except ValueError:  # a half-written line (UnicodeDecodeError is a ValueError too)
        with open(path, "r+b") as fh:
            fh.truncate(start)
        return True
    if data.endswith(b"\n"):
        return False
    with open(path, "ab") as fh:
        fh.write(b"\n")
    return True
