"""tune's candidates (a point with its FLOPs and estimate), their measurements, and what a measured one needs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ckptbench.analysis.tune_space import savers
from ckptbench.config.grid import Point, setup_label
from ckptbench.estimate.record import Estimate
from ckptbench.results.record import PointRecord


@dataclass(frozen=True)
class Candidate:
    """A point of the space with what the search needs to order and prune it."""

    point: Point
    hardware_flops: int
    estimate: Estimate

    @property
    def order(self) -> tuple[Any, ...]:
        p = self.point
        return (-p.tokens, p.compile, self.hardware_flops, len(savers(p)), p.key_id)

    @property
    def label(self) -> str:
        p = self.point
        extras = setup_label(p.key)
        return f"{p.layout} b={p.batch_size}" + (f" {extras}" if extras else "")


@dataclass
class Measured:
    """A measured candidate: its record's numbers."""

    candidate: Candidate
    record: PointRecord
    fits: bool

    @property
    def tokens_per_s(self) -> float:
        return float(self.record.tokens_per_s or 0.0)

    @property
    def flop_rate(self) -> float:
        median = self.record.median_step_time_s
        return self.candidate.hardware_flops / median if median else 0.0


def peak(record: PointRecord) -> int:
    return int(record.peak_reserved_bytes or record.peak_allocated_bytes or 0)


def needed(record: PointRecord) -> int:
    """What must fit the limit: peak reserved plus the memory the process held outside the allocator (the
    CUDA context, measured with the point; none on CPU), as ``recommend`` and the searches count it."""
    return peak(record) + int(record.context_bytes or 0)
