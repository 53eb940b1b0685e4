"""What runners report as points start and finish."""

from __future__ import annotations

from dataclasses import dataclass

from ckptbench.config.grid import Point
from ckptbench.results.record import PointRecord

PROBES_GUESS = 6  # probes a search usually needs; the progress total grows if it needs more


@dataclass
class ProgressCounter:
    """Numbers points as they start; the total grows when searches probe more than guessed."""

    total: int
    done: int = 0

    def next(self) -> int:
        self.done += 1
        self.total = max(self.total, self.done)
        return self.done - 1


@dataclass(frozen=True)
class Progress:
    """A progress event: a point started (record is None) or finished."""

    index: int
    total: int
    point: Point
    record: PointRecord | None = None
