"""The tool's own time: where a sweep command's wall time went, from process start to exit (run.json 'timing').

Each invocation (a sweep, then every ``--resume``) adds one entry to ``timing.invocations``; the top-level
numbers are their sums, so a resumed run's totals cover everything a user waited for. The parts:

- ``startup_s``: process start (the kernel's start time of the process) to the sweep: interpreter,
  imports (torch, transformers), config loading;
- ``environment_s``: the machine probe, the runner, the run directory;
- ``predictions_s``: predictions made in this process before the points (CPU runs); on CUDA they are
  made in the background and only ``predictions_wait_s`` (points waiting for theirs) costs wall time;
- ``points_s``: the points and searches (the old ``sweep_wall_s``), made of ``steps_s`` (warm-up and
  measured steps), ``point_overhead_s`` (each point's wall time minus its steps: model builds, weight
  resets, loss recomputations, cleanup) and ``between_points_s`` (progress, records written and synced,
  the predictions wait);
- ``finish_s``: summaries and the table after the points; ``command_wall_s``: process start to the end
  of the command (written by the CLI as it finishes; absent when a sweep is run from Python).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ckptbench.errors import CkptbenchError
from ckptbench.results.meta import SUMMED, RunTiming, TimingEntry
from ckptbench.results.record import PointRecord
from ckptbench.results.store import RUN_FILE, RunWriter
from ckptbench.sweep.predictions import BackgroundPredictions


def process_start_monotonic() -> float:
    """``time.monotonic()`` at this process's start (Linux: /proc/self/stat), else now."""
    try:
        # Fields after the command name, which may hold spaces: starttime is field 22, index 19 here.
        after_name = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started_since_boot = int(after_name[19]) / os.sysconf("SC_CLK_TCK")
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - started_since_boot
    except (OSError, ValueError, IndexError, AttributeError):
        return time.monotonic()
    return time.monotonic() - max(age, 0.0)


@dataclass
class SweepClock:
    """Clock readings (time.monotonic) of one sweep invocation, and what they add up to."""

    process_start: float
    resumed: bool = False
    marks: dict[str, float] = field(default_factory=dict)
    # What the entry says of the predictions, as it becomes known: their mode, wait and background time.
    predictions: TimingEntry = field(default_factory=TimingEntry)
    started_at: str = field(default_factory=lambda: dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])  # tells this invocation's entry apart

    def mark(self, name: str) -> float:
        self.marks[name] = now = time.monotonic()
        return now

    def _between(self, a: str, b: str) -> float | None:
        return self.marks[b] - self.marks[a] if a in self.marks and b in self.marks else None

    def note_predictions(self, **fields: str | float | None) -> None:
        """What the entry says of the predictions: ``predictions_mode``, ``_wait_s``, ``_background_s``."""
        self.predictions = self.predictions.updated(**fields)

    def entry(self, records: Sequence[PointRecord], status: str) -> TimingEntry:
        """This invocation's timing entry (points_s up to the last mark: the end, or an interruption)."""
        ran = [r for r in records if r.wall_s is not None]
        steps = sum(sum(r.warmup_times_s) + sum(r.step_times_s) for r in records)
        overhead = sum(r.overhead_s or 0.0 for r in ran)
        points_end = self.marks.get("points_end", time.monotonic())
        points_s = points_end - self.marks["points_start"] if "points_start" in self.marks else None
        entry = TimingEntry(
            id=self.id,
            started_at=self.started_at,
            resumed=self.resumed,
            status=status,
            startup_s=self.marks["entry"] - self.process_start if "entry" in self.marks else None,
            environment_s=self._between("entry", "environment"),
            predictions_s=self._between("environment", "predictions"),
            points_s=points_s,
            steps_s=steps,
            point_overhead_s=overhead,
            model_build_s=sum(r.model_build_s or 0.0 for r in records),
            between_points_s=None if points_s is None else points_s - sum(r.wall_s or 0.0 for r in ran),
            points=len(records),
        )
        return entry.updated(**self.predictions.given()) if self.predictions.model_fields_set else entry


def accumulate(timing: RunTiming | None, entry: TimingEntry, *, earlier_points: int) -> RunTiming:
    """run.json's timing with this invocation's entry added (or updated) and the totals re-summed."""
    invocations = list(timing.invocations) if timing is not None else []
    if invocations and invocations[-1].id == entry.id:
        invocations[-1] = invocations[-1].updated(**entry.given())  # the same invocation, now finished
    else:
        invocations.append(entry)
    totals = {name: sum(getattr(e, name) or 0.0 for e in invocations) for name in SUMMED}
    summed = RunTiming.model_validate({**totals, "invocations": invocations})
    # A run written before timing existed (or resumed from one) has points no entry accounts for.
    untimed = timing.untimed_earlier_points if timing is not None else None
    if (timing is None and earlier_points) or untimed:
        return summed.updated(untimed_earlier_points=untimed or earlier_points)
    return summed


def command_end(entry: TimingEntry, clock: SweepClock) -> TimingEntry:
    """The entry completed with the whole command's wall time and what followed the points."""
    now = time.monotonic()
    last = clock.marks.get("points_end")
    return entry.updated(command_wall_s=now - clock.process_start, finish_s=None if last is None else now - last)


def timing_recorder(
    clock: SweepClock, writer: RunWriter, bg: BackgroundPredictions | None, *, earlier_points: int
) -> Callable[[list[PointRecord], str], RunTiming]:
    """run.json's timing as it stands when this invocation ends with ``status`` after ``records``."""

    def timing(records: list[PointRecord], status: str) -> RunTiming:
        if bg is not None:
            clock.note_predictions(predictions_wait_s=bg.wait_s, predictions_background_s=bg.background_s)
        entry = clock.entry(records, status)
        written = writer.meta.get("timing")  # run.json's, as this invocation found it (JSON)
        return accumulate(None if written is None else RunTiming.model_validate(written), entry,
                          earlier_points=earlier_points)

    return timing


def record_command_end(run_dir: Path, clock: SweepClock | None) -> TimingEntry | None:
    """Add the whole command's wall time (process start to now) to this invocation's timing entry.

    Called by the CLI as its last act, after the summaries are written; best effort (returns the entry).
    """
    if clock is None:
        return None
    with contextlib.suppress(CkptbenchError, OSError, ValueError, KeyError):
        writer = RunWriter.reopen(run_dir)
        try:
            writer.meta = json.loads((run_dir / RUN_FILE).read_text(encoding="utf-8"))
            timing = RunTiming.model_validate(writer.meta.get("timing") or {})
            last = timing.invocations[-1] if timing.invocations else TimingEntry()
            if last.id != clock.id:
                return None
            entry = command_end(last, clock)
            writer.set_status(writer.meta["status"], timing=accumulate(timing, entry, earlier_points=0).to_json())
            return entry
        finally:
            writer.close()
    return None
