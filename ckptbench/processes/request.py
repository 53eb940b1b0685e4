"""What a point's own process is asked: the request a launcher writes (request.json) and the child reads
(processes/point_process.py), which also travels inside a fanned-out job (processes/job.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ckptbench.results.record import PointRecord, Scalar
from ckptbench.results.store import write_text_atomic


class PointRequest(BaseModel):
    """The config, the point, and the records it learns from; where to write its record."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # The sweep's resolved config as JSON: the child parses it again (config/load.py), as run.json's is.
    config: dict[str, Any]
    key: dict[str, Scalar]  # the point: a grid point or a search probe
    gpu_name: str | None = None  # the sweep's GPU; the child's own names the peak for MFU where it has one
    # The ok and out-of-memory records of the points before it (loss references, OOM skips).
    done: list[PointRecord] = Field(default_factory=list)
    parent_pid: int  # the process whose end ends this one: the sweep, or the fanned-out job
    result: str | None = None  # where the record goes (processes/launch.py result_path: one file per rank)
    ready: str | None = None  # touched as the point starts: --point-timeout applies from then on
    forkserver: str | None = None  # a local job's points are forked by its sweep's server (processes/fresh.py)
    allocator_trace: str | None = None  # record the CUDA allocator's trace to this file (processes/alloc_trace.py)

    @field_validator("done", mode="before")
    @classmethod
    def _read_done(cls, done: Any) -> Any:
        """The records are read as a run's are (an earlier run's, on --resume, may hold fields another version
        wrote: they are kept)."""
        if not isinstance(done, list):
            return done
        return [d if isinstance(d, PointRecord) else PointRecord.read(d) for d in done]

    def write(self, path: Path) -> None:
        """The request as its JSON file, written whole (the child may start reading at once)."""
        write_text_atomic(path, self.model_dump_json(exclude_unset=True))

    @classmethod
    def load(cls, path: str | Path) -> PointRequest:
        return cls.model_validate_json(Path(path).read_text(encoding="utf-8"))
