"""Where a sweep's points run: in the sweep's process (default), or fanned out as submitit jobs over
the GPUs of this node (``local``) or a Slurm cluster (``slurm``). Pure data, no torch.

The section changes where points run, never what they measure, so ``--resume`` ignores it and the
command line can override every field (``ckptbench sweep --executor slurm --partition gpu ...``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ckptbench.errors import ConfigError
from ckptbench.json_object import JsonObject

Executor = Literal["none", "local", "slurm"]
SbatchValue = str | int | float | bool


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LocalSpec(_Strict):
    """``executor: local``: one job per point on this node, each pinned to its own GPU(s)."""

    # GPU indices to spread the points over; null: every GPU this node shows.
    gpus: list[int] | None = Field(default=None, min_length=1)
    # Points at once when there is no GPU (CPU runs, tests); a sharded point takes one per rank.
    jobs: int = Field(default=1, ge=1)
    # A job that runs longer is killed (submitit's timeout); --point-timeout bounds the point itself.
    timeout_min: int = Field(default=24 * 60, ge=1)


class SlurmSpec(_Strict):
    """``executor: slurm``: points are submitted as job arrays through submitit's SlurmExecutor."""

    partition: str | None = None
    # Time limit of one job (one point) in minutes: Slurm's --time.
    time_min: int = Field(default=60, ge=1)
    # Jobs of an array running at once (Slurm's %N), and the most points in flight at a time.
    array_parallelism: int = Field(default=8, ge=1)
    account: str | None = None
    cpus_per_task: int | None = Field(default=None, ge=1)
    mem_gb: float | None = Field(default=None, gt=0)
    # Extra sbatch options, written as '#SBATCH --<key>=<value>' (true: a bare flag), e.g.
    # {qos: high, constraint: h100, exclusive: true}.
    sbatch: dict[str, SbatchValue] = Field(default_factory=dict)
    # Shell lines run in the job before the point starts, e.g. 'module load cuda/12.4'.
    setup: list[str] = Field(default_factory=list)


class ClusterSpec(_Strict):
    """The ``cluster:`` section of a config."""

    executor: Executor = "none"
    local: LocalSpec = Field(default_factory=LocalSpec)
    slurm: SlurmSpec = Field(default_factory=SlurmSpec)


def with_overrides(
    spec: ClusterSpec,
    *,
    executor: str | None = None,
    gpus: str | None = None,
    jobs: int | None = None,
    partition: str | None = None,
    time_min: int | None = None,
    array_parallelism: int | None = None,
    account: str | None = None,
    sbatch: list[str] | None = None,
) -> ClusterSpec:
    """The config's cluster section with the command line's options on top; ConfigError names the option."""
    local: JsonObject = {"jobs": jobs}
    if gpus is not None:
        local["gpus"] = _gpu_list(gpus)
    slurm: JsonObject = {"partition": partition, "time_min": time_min, "array_parallelism": array_parallelism,
                             "account": account}
    if sbatch:
        slurm["sbatch"] = {**spec.slurm.sbatch, **parse_sbatch_options(sbatch)}
    data = spec.model_dump()
    data["local"].update({k: v for k, v in local.items() if v is not None})
    data["slurm"].update({k: v for k, v in slurm.items() if v is not None})
    if executor is not None:
        data["executor"] = executor
    try:
        return ClusterSpec.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err.get("loc", ()))
        raise ConfigError(f"cluster.{where}: {err.get('msg', 'invalid')} (from the command line)") from None


def parse_sbatch_options(items: list[str]) -> dict[str, SbatchValue]:
    """``--sbatch qos=high --sbatch exclusive`` -> {'qos': 'high', 'exclusive': True}."""
    out: dict[str, SbatchValue] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip().lstrip("-")
        if not key or (sep and not value.strip()):
            raise ConfigError(f"--sbatch {item!r}: expected KEY=VALUE (e.g. qos=high) or a bare flag (exclusive)")
        out[key] = value.strip() if sep else True
    return out


def _gpu_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--gpus {text!r}: expected GPU indices such as 0,1,2,3") from None
