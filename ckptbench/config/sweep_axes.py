"""The sweep's axes as validated config: a list of values per axis (``SweepAxes``) and explicit cells (``PointSpec``).

Each field is an axis of config/grid.py's declaration: its values' type, its grammar, its default and its meaning come
from there; the fields are spelled out for mypy, and tests/test_axis_keys.py holds them to the declaration. No torch.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from ckptbench.config.axes import (
    AttnImpl,
    BatchSize,
    LossName,
    MicroBatches,
    Offload,
    OptimizerName,
    OptimizerOffload,
    Precision,
    SeqLen,
    _Strict,
    layout_value,
)
from ckptbench.config.grid import axis_named


def listed(name: str) -> Any:
    """The field of a sweep list: one value at least; unset, the axis's default (None where the axis falls back to
    another setting of the config)."""
    axis = axis_named(name)
    if axis.fallback is not None:
        return Field(default=None, min_length=1, description=axis.doc)
    default = axis.sweep_default
    return Field(default_factory=lambda: [default], min_length=1, description=axis.doc)


class SweepAxes(_Strict):
    """The grid: its cells are the cartesian product of these lists."""

    layout: list[str] = listed("layout")
    batch_size: list[BatchSize] | Literal["max"] = listed("batch_size")
    seq_len: list[SeqLen] = listed("seq_len")
    precision: list[Precision] = listed("precision")
    optimizer: list[OptimizerName] | None = listed("optimizer")
    micro_batches: list[MicroBatches] = listed("micro_batches")
    offload: list[Offload] = listed("offload")
    lora: list[str] = listed("lora")
    compile: list[bool] = listed("compile")
    attn_implementation: list[AttnImpl] | None = listed("attn_implementation")
    loss: list[LossName] = listed("loss")
    optimizer_in_backward: list[bool] = listed("optimizer_in_backward")
    optimizer_offload: list[OptimizerOffload] = listed("optimizer_offload")
    parallel: list[str] = listed("parallel")
    allocator: list[str] = listed("allocator")

    @field_validator("layout", mode="before")
    @classmethod
    def _each_layout_once(cls, values: Any) -> Any:
        # Before the grammar spells each one canonically: the error quotes both spellings as the user wrote them.
        if isinstance(values, list):
            canonical = [layout_value(v) for v in values]
            for i, (given, spelled) in enumerate(zip(values, canonical, strict=True)):
                if canonical.index(spelled) < i:  # the same points twice; a plan spelled otherwise: schema.py
                    first = canonical.index(spelled)
                    raise ValueError(
                        f"entry {i} ({given!r}) is entry {first} ({values[first]!r}) again, both spell {spelled!r}; "
                        "list each layout once"
                    )
        return values

    @field_validator("*")
    @classmethod
    def _grammar(cls, values: Any, info: ValidationInfo) -> Any:
        check = axis_named(str(info.field_name)).check
        return [check(v) for v in values] if check is not None and isinstance(values, list) else values


class PointSpec(_Strict):
    """One explicit cell; unset fields take the first value of the matching sweep axis."""

    layout: str | None = None
    batch_size: BatchSize | None = None
    seq_len: SeqLen | None = None
    precision: Precision | None = None
    optimizer: OptimizerName | None = None
    micro_batches: MicroBatches | None = None
    offload: Offload | None = None
    lora: str | None = None
    compile: bool | None = None
    attn_implementation: AttnImpl | None = None
    loss: LossName | None = None
    optimizer_in_backward: bool | None = None
    optimizer_offload: OptimizerOffload | None = None
    parallel: str | None = None
    allocator: str | None = None

    @field_validator("*")
    @classmethod
    def _grammar(cls, value: Any, info: ValidationInfo) -> Any:
        check = axis_named(str(info.field_name)).check
        return value if value is None or check is None else check(value)
