"""run.json's fields, typed and checked on load: a damaged field is dropped with a warning naming it,
so that every reader can trust the rest (``config: null`` or ``environment: [1]`` used to crash them)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

_Count = Annotated[int, Field(ge=0, le=2**63 - 1)]


class _Open(BaseModel):
    # Fields a newer ckptbench adds are kept as they are; the known ones are checked.
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)


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
    key: dict[str, Any] | None = None
    answer: SearchAnswer | None = None
    probes: list[Any] = Field(default_factory=list)


class RunMeta(_Open):
    """The fields of run.json every reader relies on (schema_version is checked before this).

    Defaults only stand for a missing field here (the dict itself is kept as it was read); ``null`` is
    allowed only where ckptbench writes it (git_sha outside a git checkout, failure of a good run).
    """

    schema_version: int
    status: str = "?"
    name: str = ""
    created_at: str = ""
    ckptbench_version: str = ""
    git_sha: str | None = None
    config: dict[str, Any] = Field(default_factory=dict)
    environment: dict[str, Any] = Field(default_factory=dict)
    options: dict[str, Any] = Field(default_factory=dict)
    num_points: _Count = 0
    finished_points: _Count = 0
    searches: list[SearchOutcome] = Field(default_factory=list)
    resumes: list[dict[str, Any]] = Field(default_factory=list)
    sweep_wall_s: Annotated[float, Field(ge=0)] = 0.0
    note: str | None = None
    failure: str | None = None


def checked_meta(meta: dict[str, Any], *, source: str) -> tuple[dict[str, Any], list[str]]:
    """``meta`` without the fields that are not what run.json promises, and a warning for each one."""
    kept, notes = dict(meta), []
    for _ in range(len(RunMeta.model_fields)):  # each round drops one damaged field
        try:
            RunMeta.model_validate(kept)
            break
        except ValidationError as exc:
            err = exc.errors()[0]
            name = str(err["loc"][0]) if err.get("loc") else "schema_version"
            where = ".".join(str(x) for x in err.get("loc", ())) or name
            notes.append(f"{source}: ignored field {name!r} ({where}: {err.get('msg', 'invalid')})")
            kept.pop(name, None)
    return kept, notes
