"""run.json's fields, typed and checked on load: a damaged field is dropped with a warning naming it,
so that every reader can trust the rest (``config: null`` or ``environment: [1]`` used to crash them).

Lenient as run.json has always been read: a field a newer ckptbench wrote is kept as it is (``model_extra``;
``RunMeta.unknown_fields`` names them), and a damaged field of the environment costs only itself.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import ConfigDict, Field, ValidationError, model_validator

from ckptbench.config.grid import PointKey
from ckptbench.json_object import JsonObject
from ckptbench.results.given import GivenFields

_Count = Annotated[int, Field(ge=0, le=2**63 - 1)]
# The environment's own part of a damaged run.json that is dropped alone (the rest of it stays).
_NESTED = ("environment",)


class _Open(GivenFields):
    # Fields a newer ckptbench adds are kept as they are; the known ones are checked. Written (``to_json``):
    # exactly the fields that were given, as run.json held them.
    model_config = ConfigDict(extra="allow", allow_inf_nan=False, frozen=True)

    def unknown_fields(self) -> list[str]:
        """The fields this ckptbench does not declare (a newer one wrote them), sorted."""
        return sorted(self.model_extra or ())


class RunEnvironment(_Open):
    """The machine and software a run was measured on (measure/environment.py ``collect``): run.json's
    ``environment``. Every fact may be missing (older runs, a fanned-out sweep's planning host)."""

    ckptbench_version: str | None = None
    git_sha: str | None = None
    hostname: str | None = None
    platform: str | None = None
    python: str | None = None
    torch: str | None = None
    transformers: str | None = None
    device_type: str | None = None  # 'cuda' or 'cpu'
    cpu_count: int | None = None
    cpus_available: int | None = None  # this process's affinity mask
    # The intra-op threads the points ran with: the config's cpu_threads on CPU, torch's default on CUDA.
    torch_num_threads: int | None = None
    load_average_1m: float | None = None  # at the start of the sweep
    gpu_name: str | None = None
    gpu_total_memory_bytes: int | None = None
    gpu_capability: str | None = None  # '9.0'
    cuda_version: str | None = None
    driver_version: str | None = None
    probe: str | None = None  # 'cuda' or 'cpu-tracker' (measure/probes.py)
    executor: str | None = None  # a fanned-out sweep's submitit executor ('local', 'slurm')
    test_hooks: dict[str, str] | None = None  # measured with test-only fault hooks (measure/faults.py)


class RunOptions(_Open):
    """How the sweep was run (the command line's options that change where points run)."""

    isolate: bool | None = None  # every point in a fresh process (--isolate, or fanned out)
    point_timeout_s: float | None = None
    cluster: JsonObject | None = None  # a fanned-out sweep's cluster section (config/cluster.py), as JSON


class Resume(RunOptions):
    """One ``--resume`` of the run: when, at which commit, with which options."""

    at: str | None = None
    git_sha: str | None = None


class SearchAnswer(_Open):
    """What a search found (search/searches.py): a batch size, or a number of checkpointed layers."""

    batch_size: _Count | None = None
    first_failing_batch_size: _Count | None = None
    num_checkpointed: _Count | None = None
    layout: str | None = None

    @model_validator(mode="after")
    def _layout_named(self) -> SearchAnswer:
        if self.num_checkpointed is not None and self.layout is None:
            raise ValueError("num_checkpointed without its layout")
        return self


class SearchOutcome(_Open):
    """One search of a run (batch_size: max or layout: fit) and the probes it measured."""

    kind: str | None = None
    group: str | None = None
    key: PointKey | None = None
    answer: SearchAnswer | None = None
    probes: list[Any] = Field(default_factory=list)


class TimeParts(_Open):
    """Where a sweep command's wall time went, in seconds (sweep/timing.py says what each part holds): one
    invocation's, or (``RunTiming``) their sums. Unknown where it is None."""

    command_wall_s: float | None = None
    startup_s: float | None = None
    environment_s: float | None = None
    predictions_s: float | None = None
    predictions_wait_s: float | None = None
    points_s: float | None = None
    steps_s: float | None = None
    point_overhead_s: float | None = None
    model_build_s: float | None = None
    between_points_s: float | None = None
    finish_s: float | None = None


SUMMED = tuple(TimeParts.model_fields)  # what run.json's timing sums over the invocations


class TimingEntry(TimeParts):
    """One invocation of the sweep command (the first, or a --resume): its parts and how it ended."""

    id: str | None = None  # tells this invocation's entry apart
    started_at: str | None = None
    resumed: bool | None = None
    status: str | None = None
    points: int | None = None  # the points it measured
    predictions_mode: str | None = None  # 'off', 'background' or 'in-process'
    predictions_background_s: float | None = None  # the background process's time, request to last prediction


class RunTiming(TimeParts):
    """run.json's ``timing``: every invocation's entry and, at the top, their sums."""

    invocations: list[TimingEntry] = Field(default_factory=list)
    # A run written before timing existed (or resumed from one) has points no entry accounts for.
    untimed_earlier_points: _Count | None = None


class RunMeta(_Open):
    """The fields of run.json every reader relies on (schema_version is checked before this).

    A default stands for a field run.json does not hold; None where a reader must tell that apart (a damaged
    run.json without its status or its number of points). ``null`` is allowed only where ckptbench writes it
    (git_sha outside a git checkout, failure of a good run).
    """

    schema_version: int
    status: str | None = None  # 'running', 'complete', 'failed', 'interrupted'
    command: str | None = None  # 'sweep' or 'tune' (runs before it was recorded: see results/store.py Run.command)
    name: str = ""
    created_at: str = ""
    ckptbench_version: str = ""
    git_sha: str | None = None
    config: JsonObject = Field(default_factory=dict)  # the resolved config as JSON (config/load.py parses it)
    environment: RunEnvironment = Field(default_factory=RunEnvironment)
    options: RunOptions = Field(default_factory=RunOptions)
    num_points: _Count | None = None
    finished_points: _Count = 0
    searches: list[SearchOutcome] = Field(default_factory=list)
    resumes: list[Resume] = Field(default_factory=list)
    sweep_wall_s: Annotated[float, Field(ge=0)] = 0.0
    timing: RunTiming | None = None  # the command's own time (sweep/timing.py)
    tune: JsonObject | None = None  # tune's options (search/tune_search.py), as JSON
    note: str | None = None
    failure: str | None = None


def checked_meta(meta: JsonObject, *, source: str) -> tuple[RunMeta, list[str]]:
    """``meta`` (run.json as JSON) typed, without the fields that are not what run.json promises, and a warning
    for each one dropped; a damaged fact of the environment is dropped alone."""
    kept, notes = dict(meta), list[str]()
    nested = {name: dict(kept[name]) for name in _NESTED if isinstance(kept.get(name), dict)}
    kept.update(nested)
    for _ in range(len(RunMeta.model_fields) + sum(len(part) for part in nested.values()) + 1):
        try:
            return RunMeta.model_validate(kept), notes
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = err.get("loc") or ("schema_version",)
            name, where = str(loc[0]), ".".join(str(x) for x in loc)
            part = nested.get(name)
            if part is not None and len(loc) > 1 and isinstance(loc[1], str) and loc[1] in part:
                name = f"{name}.{loc[1]}"
                part.pop(loc[1])
            else:
                kept.pop(str(loc[0]), None)
            notes.append(f"{source}: ignored field {name!r} ({where}: {err.get('msg', 'invalid')})")
    raise AssertionError("every damaged field was dropped, yet run.json does not validate")
