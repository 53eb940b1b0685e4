"""The point record: what one point of a sweep measured, typed and validated, with statistics derived on read.

A record is raw data (per-step times and losses, peaks, the memory breakdown, status and why);
statistics (median, spread, tokens/s, MFU) are properties computed from it, never stored.

Strict when ckptbench builds a record: a field it does not declare (a misspelling) is an error, as
with ``extra="forbid"``. Lenient when it reads one back from disk (:meth:`PointRecord.read`): fields
written by another version are kept as they are (:meth:`PointRecord.unknown_fields` names them), so a
record survives a round trip through a reader that does not know them.
"""

from __future__ import annotations

import functools
import math
import statistics
import typing
from collections.abc import Mapping
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_core import InitErrorDetails

from ckptbench.config.grid import KEY_AXES, Point, filled_key, key_id, point_of
from ckptbench.json_object import JsonObject
from ckptbench.results.given import GivenFields

Status = Literal["ok", "oom", "error", "skipped"]
# Counts stay within int64: a damaged 10**400 would overflow every float statistic made from it.
_MAX = 2**63 - 1
Count = Annotated[int, Field(ge=0, le=_MAX)]
Bytes = Count
# Durations stay within what a run can take (a damaged 1e308 s overflows every rate made from it) ...
Seconds = Annotated[float, Field(ge=0, le=1e9, allow_inf_nan=False)]
# ... and a measured step lasts at least a nanosecond (below any clock's resolution; a subnormal 5e-324 s
# made tokens/s infinite) and at most a million seconds.
StepSeconds = Annotated[float, Field(ge=1e-9, le=1e6, allow_inf_nan=False)]
Scalar = str | bool | int | float
_AXIS_KINDS = {axis.name: axis.kind for axis in KEY_AXES}


# The validation context of a read (PointRecord.read): unknown fields are kept instead of refused.
_READING = {"ckptbench_read": True}


@functools.cache
def _nested_fields(cls: type[BaseModel]) -> tuple[str, ...]:
    """The fields of a record class whose values can hold records (``memory``, ``ranks``): the only ones
    ``unknown_fields`` needs to look into (all of them, per read, cost as much as the read itself)."""
    return tuple(name for name, info in cls.model_fields.items() if _may_hold_record(info.annotation))


def _may_hold_record(annotation: Any) -> bool:
    """Whether a field's type names a record class (or anything, ``Any``), inside unions and lists too."""
    if annotation is Any:
        return True
    if isinstance(annotation, type) and issubclass(annotation, _Record):
        return True
    return any(_may_hold_record(arg) for arg in typing.get_args(annotation))


class _Record(GivenFields):
    # "allow" stores the unknown fields of a read (and dumps them back); the validator below refuses
    # them everywhere else (a record built, or ``updated``), with pydantic's own extra_forbidden error at each
    # one's location. Written (``to_json``): exactly the fields that were given.
    model_config = ConfigDict(extra="allow", frozen=True)

    @model_validator(mode="after")
    def _declared_fields_only(self, info: ValidationInfo) -> _Record:
        if self.model_extra and info.context != _READING:
            raise ValidationError.from_exception_data(
                type(self).__name__,
                [InitErrorDetails(type="extra_forbidden", loc=(name,), input=value)
                 for name, value in self.model_extra.items()],
            )
        return self

    def unknown_fields(self) -> list[str]:
        """The fields kept from a read that this ckptbench does not declare, dotted inside nested
        records ('memory.x', 'ranks.x'), sorted."""
        names = set(self.model_extra or ())
        for name in _nested_fields(type(self)):
            value = getattr(self, name)
            for part in value if isinstance(value, list) else (value,):
                if isinstance(part, _Record):
                    inner = part.unknown_fields()
                    if inner:  # (most records have none: no set update, no text per read)
                        names.update(f"{name}.{field}" for field in inner)
        return sorted(names) if names else []



class PointMemory(_Record):
    """The static part of the peak (parameters, gradients, optimizer state) and the leak check."""

    params_bytes: Bytes | None = None
    grads_bytes: Bytes | None = None
    optimizer_state_bytes: Bytes | None = None
    window_start_allocated_bytes: Bytes | None = None
    baseline_allocated_bytes: Bytes | None = None
    after_point_allocated_bytes: Bytes | None = None
    # Negative when the point freed memory that was live before it.
    leaked_bytes: Annotated[int, Field(ge=-_MAX, le=_MAX)] | None = None
    leaked: bool | None = None

    @property
    def static_bytes(self) -> int | None:
        """Parameters + gradients + optimizer state, when they were measured."""
        parts = (self.params_bytes, self.grads_bytes, self.optimizer_state_bytes)
        return None if all(p is None for p in parts) else sum(p or 0 for p in parts)


class LossCheck(_Record):
    """Whether the point's losses matched a reference (checkpointing must not change the loss)."""

    reference: str | None = None  # 'none' (the cell's unchecked layout) or 'recomputed' (measure/loss_check.py)
    reference_point: str | None = None  # the reference's key id, or how it was recomputed
    reference_losses: list[float] = Field(default_factory=list)
    steps: Count | None = None  # how many steps were compared
    rtol: float | None = None  # the tolerance used (records before it was stored: the config's loss_rtol)
    max_rel_diff: float | None = None
    match: bool | None = None


class RankRecord(_Record):
    """What one rank of a sharded point measured, and where it ran (processes/ranks.py merges them)."""

    rank: Annotated[int, Field(ge=0)]
    status: Status
    reason: str | None = None
    host: str | None = None
    gpu_name: str | None = None
    gpu_index: int | None = None
    peak_allocated_bytes: Bytes | None = None
    peak_reserved_bytes: Bytes | None = None
    step_times_s: list[StepSeconds] = Field(default_factory=list)
    warmup_times_s: list[StepSeconds] = Field(default_factory=list)
    wall_s: Seconds | None = None


class PredictedOom(_Record):
    """Where the replayed caching allocator ran out of memory (estimator/replay.py), as a record keeps it."""

    phase: str | None = None  # 'setup', 'warm-up step 1', 'measured step 2'
    segment: str | None = None  # the step segment ('logits@0', 'bwd:3@0', 'opt'), or '' outside a step
    where: str | None = None  # the segment in words
    request_bytes: Bytes | None = None  # what it tried to reserve ("Tried to allocate" in torch's message)
    allocated_bytes: Bytes | None = None
    reserved_bytes: Bytes | None = None


class Prediction(_Record):
    """What a point's record keeps of the estimate made before it ran (estimator/estimator.py ``prediction_of``).

    Declared once, here: a ``PointRecord`` holds these fields flat, as points.jsonl always has, and the sweep's
    process carries them over to a record made in another process (processes/launch.py).
    """

    predicted_peak_allocated_bytes: Bytes | None = None
    # The caching allocator's replay (estimator/replay.py) on this GPU; the predicted out-of-memory error
    # (phase, segment, request_bytes) instead when it runs out.
    predicted_peak_reserved_bytes: Bytes | None = None
    predicted_oom: PredictedOom | None = None


PREDICTION_FIELDS = tuple(Prediction.model_fields)


class PointRecord(Prediction):
    """One finished point: its key, status, raw measurements and where they came from; the prediction made
    before it ran (``Prediction``'s fields, flat)."""

    key: dict[str, Scalar] = Field(min_length=1)
    status: Status
    reason: str | None = None
    warmup_times_s: list[StepSeconds] = Field(default_factory=list)
    warmup_losses: list[float] = Field(default_factory=list)
    step_times_s: list[StepSeconds] = Field(default_factory=list)
    losses: list[float] = Field(default_factory=list)
    peak_allocated_bytes: Bytes | None = None
    peak_reserved_bytes: Bytes | None = None
    num_alloc_retries: Count | None = None
    num_ooms: Count | None = None
    memory: PointMemory = Field(default_factory=PointMemory)
    loss_check: LossCheck | None = None
    tokens_per_step: Count | None = None
    model_flops_per_step: Count | None = None
    hardware_flops_per_step: Count | None = None
    peak_tflops: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    layers_checkpointed: str | None = None
    num_checkpointed: Count | None = None
    plan: JsonObject | None = None
    host_offload_peak_bytes: Bytes | None = None
    compile_s: Seconds | None = None
    loss_implementation: str | None = None  # the loss head used when it is not transformers' default
    model_build_s: Seconds | None = None
    wall_s: Seconds | None = None
    # Where the point's wall time went besides its steps (measure/runner.py): weights reset, loss
    # recomputation, cleanup (garbage collection, cached memory returned), in seconds.
    overhead_parts_s: dict[str, Seconds] = Field(default_factory=dict)
    load_average_1m: Annotated[float, Field(ge=0)] | None = None  # the host's load when the point ended
    # Why the point's step times may mislead, as "kind: details" (kinds: busy, spread; measure/environment.py).
    warnings: list[str] = Field(default_factory=list)
    probe: str | None = None
    search: bool = False  # measured as a probe of a search (batch_size: max, layout: fit)
    isolated: bool = False  # measured in a fresh process (--isolate)
    # 'fresh': the point's own process (--isolate, search boundaries, allocator settings); 'in-process':
    # after earlier points in the sweep's process (their cached segments released by empty_cache first).
    process: Literal["fresh", "in-process"] | None = None
    points_before: Count | None = None  # points measured earlier in the same process
    allocator_conf: str | None = None  # PYTORCH_CUDA_ALLOC_CONF in the measuring process ('' when unset)
    # GPU memory the process held outside the caching allocator at the end of the window (CUDA context,
    # library kernels; other processes on the card count too): total - free - reserved.
    context_bytes: Annotated[int, Field(ge=-_MAX, le=_MAX)] | None = None
    model_rebuilt: bool = False
    fatal: bool = False  # the device was unusable after this point
    # Where the point ran: the host, the GPU model and its index on that host (None on CPU).
    host: str | None = None
    gpu_name: str | None = None
    gpu_index: int | None = None
    # A sharded point (parallel: ddp or fsdp2): its number of ranks and what each measured; the point's
    # peaks are the largest rank's and each step time the slowest rank's.
    world_size: Annotated[int, Field(ge=1)] | None = None
    ranks: list[RankRecord] | None = None
    # A fanned-out point (sweep --executor): the submitit executor and the job that ran it.
    executor: str | None = None
    job_id: str | None = None
    # A point whose process (or job) ended without a record (processes/launch.py, fanout.py): the end of
    # its stderr and its exit status (negative: the signal that ended it).
    stderr_tail: str | None = None
    exit_code: int | None = None

    @classmethod
    def read(cls, data: Any) -> PointRecord:
        """A record read back from disk: the declared fields checked as when writing, unknown ones
        (written by another version of ckptbench) kept as they are."""
        return cls.model_validate(data, context=_READING)

    @classmethod
    def read_json(cls, text: bytes) -> PointRecord:
        """``read(json.loads(text))`` parsed and checked in one pass (pydantic's JSON parser: a 20,000-point
        run reads in about half the time); ValidationError where that would fail and for JSON it parses
        otherwise (lone surrogates, a byte-order mark): the caller then takes ``read``'s path."""
        return cls.model_validate_json(text, context=_READING)

    @field_validator("key")
    @classmethod
    def _complete_key(cls, key: dict[str, Scalar]) -> dict[str, Scalar]:
        """Keys name every axis: an axis added after the record was written takes its default
        (plain training; a cell axis its ``absent`` value), so older runs still match newer ones by key
        (compare, --resume)."""
        if not all(isinstance(k, str) and k for k in key):
            raise ValueError("key fields must be non-empty names")
        for name, value in key.items():  # a value every reader can sort, group and match on
            kind = _AXIS_KINDS.get(name)
            if kind is not None and type(value) is not kind:
                raise ValueError(f"{name} must be {kind.__name__}, got {value!r}")
            if isinstance(value, int) and kind is int and not 1 <= value <= _MAX:
                raise ValueError(f"{name} must be a positive count, got {value!r}")
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        return filled_key(key)

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy; with ``update``, without the values this record computed once from its fields (its
        ``functools.cached_property``s, such as ``key_id``): the copy computes its own from its fields."""
        copied = super().model_copy(update=update, deep=deep)
        if update:
            for name, attr in vars(PointRecord).items():
                if isinstance(attr, functools.cached_property):
                    copied.__dict__.pop(name, None)
        return copied

    # -- identity -------------------------------------------------------------------------
    @functools.cached_property
    def key_id(self) -> str:
        """The key as stable text (the same as ``Point.key_id``); computed once (a frozen record's key does not
        change: reading and comparing two 20,000-point runs asks for it 200,000 times)."""
        return key_id(self.key)

    @functools.cached_property
    def point(self) -> Point | None:
        """The point the key names, made once; None when the key is not a point of this version (a field
        missing or extra, a wrong type: config/grid.py ``point_of``)."""
        return point_of(self.key)

    @property
    def prediction(self) -> Prediction | None:
        """The estimate made before the point ran, or None when the sweep recorded none."""
        given = {name: getattr(self, name) for name in PREDICTION_FIELDS if name in self.model_fields_set}
        return Prediction(**given) if given else None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def leaked(self) -> bool:
        return bool(self.memory.leaked)

    @property
    def loss_mismatch(self) -> bool:
        """The loss check ran and failed."""
        return self.loss_check is not None and self.loss_check.match is False

    # -- derived statistics ---------------------------------------------------------------
    @property
    def median_step_time_s(self) -> float | None:
        return statistics.median(self.step_times_s) if self.step_times_s else None

    @property
    def min_step_time_s(self) -> float | None:
        return min(self.step_times_s, default=None)

    @property
    def max_step_time_s(self) -> float | None:
        return max(self.step_times_s, default=None)

    @property
    def step_time_iqr_s(self) -> float | None:
        """Inter-quartile range of the measured step times (0 for a single step)."""
        times = self.step_times_s
        if len(times) < 2:
            return 0.0 if times else None
        q = statistics.quantiles(times, n=4, method="inclusive")
        return q[2] - q[0]

    @property
    def overhead_s(self) -> float | None:
        """The point's wall time minus its warm-up and measured steps: what the tool itself spent."""
        if self.wall_s is None:
            return None
        return self.wall_s - sum(self.warmup_times_s) - sum(self.step_times_s)

    @property
    def warning_kinds(self) -> list[str]:
        """The kind of each warning (the text before its colon), for a short status."""
        return [w.split(":", 1)[0] for w in self.warnings]

    @property
    def tokens_per_s(self) -> float | None:
        med = self.median_step_time_s
        # No tokens recorded is no rate (a made-up 0 tok/s divided the speed plot by zero).
        return self.tokens_per_step / med if med and self.tokens_per_step else None

    def _utilisation(self, flops: int | None) -> float | None:
        med = self.median_step_time_s
        if not med or not self.peak_tflops:
            return None
        return (flops or 0) / med / (self.peak_tflops * 1e12)

    @property
    def mfu(self) -> float | None:
        """Model FLOPs utilisation against the GPU's dense bf16 peak."""
        return self._utilisation(self.model_flops_per_step)

    @property
    def hfu(self) -> float | None:
        """Hardware FLOPs utilisation: recomputed forwards count too."""
        return self._utilisation(self.hardware_flops_per_step)

    @property
    def activation_bytes(self) -> int | None:
        """Peak allocated above the static part: a lower bound of the saved activations."""
        static = self.memory.static_bytes
        if self.peak_allocated_bytes is None or static is None:
            return None
        return max(0, self.peak_allocated_bytes - static)

    def stats(self) -> dict[str, float | None]:
        """Every derived statistic by name (the columns ``to_frame`` adds)."""
        return {name: getattr(self, name) for name in STAT_NAMES}


STAT_NAMES = (
    "median_step_time_s",
    "min_step_time_s",
    "max_step_time_s",
    "step_time_iqr_s",
    "tokens_per_s",
    "mfu",
    "hfu",
    "activation_bytes",
    "overhead_s",
)
