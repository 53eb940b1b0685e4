"""tune's search as run.json keeps it (the ``searches`` entry of kind 'tune'), typed: written by the planner
(analysis/tune_planner.py ``TunePlanner.outcome``), read back by `ckptbench tune` and `report` (render/tune.py).

Written with exactly the fields the planner gives (``to_json``: a field is absent where it was not given, and
``null`` where it was given as None), read leniently: a field a newer ckptbench wrote is kept as it is, and a
field older runs lack takes the default every reader assumed for it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ckptbench.json_object import JsonObject
from ckptbench.results.record import Scalar

# What happened to a candidate: proposed for measurement, measured (its record read), or dropped unmeasured.
Action = Literal["measure", "measured", "dropped"]


class _Stored(BaseModel):
    model_config = ConfigDict(frozen=True, extra="allow", allow_inf_nan=False)

    def to_json(self) -> JsonObject:
        """The fields as run.json holds them: those that were given (None as null), and kept unknown ones."""
        return self.model_dump(mode="json", exclude_unset=True)


class MeasuredPoint(_Stored):
    """A measured point that fits: the answer, or the fastest point of a layout family."""

    key: dict[str, Scalar]
    label: str
    tokens_per_s: float
    peak_reserved_bytes: int
    peak_allocated_bytes: int | None = None
    layers_checkpointed: str | None = None  # as the record says it ('0-7'); None for layout 'none'


class DecisionRecord(_Stored):
    """One candidate's decision with its reason (``why``); a measured one adds what its record says."""

    key: dict[str, Scalar]
    label: str
    action: Action
    why: str
    judged_peak_bytes: int | None = None  # the predicted bytes judged against the limit, where there were some
    # From the measured record (action 'measured'); tokens/s and peak reserved only when it ran ('ok').
    status: str | None = None
    fits: bool | None = None
    tokens_per_s: float | None = None
    peak_reserved_bytes: int | None = None
    note: str | None = None  # why a measured point is no answer (over the limit, another loss, not ok)


class MarginRecord(_Stored):
    """The reserved/allocated margin the predictions were judged with, and where it came from."""

    ratio: float | None = None
    source: str = "none"


class SpaceRecord(_Stored):
    """What was searched (sweep/tune_run.py adds it to the outcome it returns; run.json has not held it)."""

    candidates: int = 0
    notes: list[str] = Field(default_factory=list)
    layouts: list[str] = Field(default_factory=list)
    batch_sizes: list[int] = Field(default_factory=list)
    techniques: dict[str, list[Scalar]] = Field(default_factory=dict)


class TuneRecord(_Stored):
    """The search: the answer, each layout family's best, how the search went, and every decision."""

    kind: Literal["tune"] = "tune"
    limit_bytes: int
    answer: MeasuredPoint | None = None
    semantic_changes: list[str] = Field(default_factory=list)  # what the answer trains differently (none: [])
    family_best: dict[str, MeasuredPoint] = Field(default_factory=dict)
    margin: MarginRecord | None = None
    measured_points: int = 0
    stopped_by: str | None = None
    counts: dict[str, int] = Field(default_factory=dict)  # decisions per kind (analysis/tune_planner.py DecisionKind)
    decisions: list[DecisionRecord] = Field(default_factory=list)
    space: SpaceRecord | None = None
