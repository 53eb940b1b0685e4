"""A run's final status in run.json ('complete', 'failed', 'interrupted'), written with signals held."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from typing import Any

from ckptbench.results.record import PointRecord
from ckptbench.results.store import RunWriter


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold Ctrl-C/SIGTERM while a record is appended, so a line is never half-written by us."""
    mask = getattr(signal, "pthread_sigmask", None)
    if mask is None:
        yield
        return
    old = mask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        mask(signal.SIG_SETMASK, old)


def mark_status(writer: RunWriter, status: str, finished: int, timing: dict[str, Any] | None) -> None:
    extra = {} if timing is None else {"timing": timing, "sweep_wall_s": timing["points_s"]}
    with contextlib.suppress(OSError):  # best effort: the points themselves are already on disk
        writer.set_status(status, finished_points=finished, **extra)


def finish_status(
    writer: RunWriter, held: list[PointRecord], ended: list[str], failure: str | None, **extra: Any
) -> None:
    """Write the final status: 'failed' when the run holds no successful point, else 'complete'."""
    status = "failed" if failure else "complete"
    writer.meta.pop("failure", None)  # a resumed run's earlier failure no longer holds
    if failure:
        extra["failure"] = failure
    with signals_deferred():  # the status and `ended` change together: a signal finds both or neither
        writer.set_status(status, finished_points=len(held), **extra)
        ended.append(status)


def no_success(records: list[PointRecord]) -> str | None:
    """Why a run that holds no successful point is a failure ('12 error; the first: ...'), else None."""
    if not records or any(r.ok for r in records):
        return None
    counts: dict[str, int] = {}
    for r in records:
        counts[r.status] = counts.get(r.status, 0) + 1
    first = records[0]
    why = " ".join((first.reason or "no reason recorded").split())
    why = why if len(why) <= 160 else why[:157] + "..."
    tally = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    return f"no point succeeded ({tally}); the first {first.status}: {why}"
