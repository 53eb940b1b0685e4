"""What a point's own process (or the job that ran it) leaves behind: its record, or why it has none."""

from __future__ import annotations

from dataclasses import dataclass

from ckptbench.results.record import PointRecord


@dataclass(frozen=True)
class ProcessFailure:
    """Why a point's process (or its job) ended without a record: what happened, the end of its stderr and its
    exit status (negative: the signal that ended it), each where it is known."""

    reason: str
    stderr_tail: str | None = None
    exit_code: int | None = None

    def fields(self) -> dict[str, str | int]:
        """The fields the point's error record takes from it: those that are known."""
        known = {"reason": self.reason, "stderr_tail": self.stderr_tail, "exit_code": self.exit_code}
        return {name: value for name, value in known.items() if value is not None}


# A point's process wrote its record, or failed to.
Outcome = PointRecord | ProcessFailure


@dataclass(frozen=True)
class JobResult:
    """What a fanned-out point's submitit job returns (processes/job.py): the outcome of the point's processes,
    and the job's id as the job saw it (None outside a submitit job)."""

    outcome: Outcome
    job_id: str | None = None
