"""The sweep axes as validated config: closed choices, the grid's lists and explicit points. No torch."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ckptbench.config.alloc_conf import check_axis_value
from ckptbench.config.layouts import canonical_layout
from ckptbench.config.parallel import PARALLEL_PATTERN, parse_parallel

Precision = Literal["bf16", "fp16", "fp32", "amp_bf16", "amp_fp16"]
# adamw_8bit: bitsandbytes; adamw_8bit_torchao: torchao's AdamW8bit (both change the optimizer's numerics).
OptimizerName = Literal["adamw_fused", "adamw_foreach", "sgd", "adafactor", "adamw_8bit", "adamw_8bit_torchao"]
DeviceName = Literal["auto", "cuda", "cpu"]
AttnImpl = Literal["sdpa", "eager"]
# Activation offloading: 'none'; 'all' keeps every tensor autograd saves (outside checkpointed
# regions) in pinned host memory; 'ckpt_inputs' offloads only the inputs of checkpointed modules.
Offload = Literal["none", "all", "ckpt_inputs"]
LORA_PATTERN = r"^(none|r[1-9][0-9]{0,5})$"  # ranks up to 999999

# Upper bounds far above any real run, so that an absurd value (a batch of 10**25) is refused here,
# naming the field, instead of failing inside torch in every point.
MAX_BATCH = 2**20
MAX_SEQ_LEN = 2**24
MAX_MICRO_BATCHES = 1024  # gradient accumulation steps per optimizer step: far above real use; the estimate
# traced every one of them (minutes and gigabytes for thousands)
BatchSize = Annotated[int, Field(ge=1, le=MAX_BATCH)]
SeqLen = Annotated[int, Field(ge=1, le=MAX_SEQ_LEN)]
MicroBatches = Annotated[int, Field(ge=1, le=MAX_MICRO_BATCHES)]

# The loss head: 'default' (transformers: full logits, then fp32 cross-entropy), 'chunked' (cross-entropy
# over chunks of tokens, each chunk's fp32 logits recomputed in backward, never the whole batch's),
# 'fused_linear' (Liger's fused linear cross-entropy, or Apple's cut-cross-entropy; CUDA only).
LossName = Literal["default", "chunked", "fused_linear"]
# Optimizer state in host memory, stepped by the CPU: 'none' or 'cpu' (torchao's CPUOffloadOptimizer; CUDA only).
OptimizerOffload = Literal["none", "cpu"]



class _Strict(BaseModel):
    # allow_inf_nan=False: .inf or .nan in any float field is refused with its field path (a budget of
    # .inf used to run every point and then fail converting it to bytes).
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def _shown(value: Any, limit: int = 60) -> str:
    """A short one-line repr of a user's value."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _canonical(value: Any) -> Any:
    # One spelling per layout ('ALL', ' all', 'all@block' -> 'all'); anything unparsable is kept as
    # written so that the error, reported later with the model's layer count, quotes the user's text.
    return canonical_layout(value) if isinstance(value, str) else value


class SweepAxes(_Strict):
    """The grid: its cells are the cartesian product of these lists."""

    # Layout strings (see `ckptbench layouts`); 'fit' searches the fewest layers that fit the budget.
    layout: list[str] = Field(default_factory=lambda: ["none"], min_length=1)
    # Batch sizes, or 'max': per layout, the largest batch that fits (doubling, then bisection).
    batch_size: list[BatchSize] | Literal["max"] = Field(default_factory=lambda: [1], min_length=1)
    seq_len: list[SeqLen] = Field(default_factory=lambda: [512], min_length=1)
    precision: list[Precision] = Field(default_factory=lambda: list[Precision](["bf16"]), min_length=1)
    # Optional axes; an unset one takes the single top-level value (optimizer, attn_implementation).
    optimizer: list[OptimizerName] | None = Field(default=None, min_length=1)
    # Gradient accumulation: micro-batches of batch_size per optimizer step.
    micro_batches: list[MicroBatches] = Field(default_factory=lambda: [1], min_length=1)
    offload: list[Offload] = Field(default_factory=lambda: list[Offload](["none"]), min_length=1)
    # 'none' (full fine-tuning) or 'r<rank>' (LoRA through peft on lora.target_modules).
    lora: list[str] = Field(default_factory=lambda: ["none"], min_length=1)
    # torch.compile the model; compile time is recorded apart and never counted in step time.
    compile: list[bool] = Field(default_factory=lambda: [False], min_length=1)
    attn_implementation: list[AttnImpl] | None = Field(default=None, min_length=1)
    loss: list[LossName] = Field(default_factory=lambda: list[LossName](["default"]), min_length=1)
    # Per-parameter optimizer steps from post-accumulate-grad hooks: each gradient is applied and freed
    # during the backward pass (with micro_batches > 1: during the last micro-batch's backward).
    optimizer_in_backward: list[bool] = Field(default_factory=lambda: [False], min_length=1)
    optimizer_offload: list[OptimizerOffload] = Field(
        default_factory=lambda: list[OptimizerOffload](["none"]), min_length=1
    )
    # 'none', 'ddp:N', 'fsdp2:N' or 'fsdp2:N:noreshard' (config/parallel.py); batch_size is per rank.
    parallel: list[str] = Field(default_factory=lambda: ["none"], min_length=1)

    @field_validator("parallel")
    @classmethod
    def _parallel_spec(cls, values: list[str]) -> list[str]:
        for v in values:
            parse_parallel(v)
        return values
    # The CUDA caching allocator's options (PYTORCH_CUDA_ALLOC_CONF, set in the point's own process before
    # CUDA starts): 'default', 'expandable_segments', 'max_split_size_mb:N', 'garbage_collection_threshold:X'
    # (several joined by commas). CUDA only.
    allocator: list[str] = Field(default_factory=lambda: ["default"], min_length=1)

    @field_validator("allocator")
    @classmethod
    def _allocator_spec(cls, values: list[str]) -> list[str]:
        return [check_axis_value(str(v)) for v in values]

    @field_validator("lora")
    @classmethod
    def _lora_spec(cls, values: list[str]) -> list[str]:
        for v in values:
            if not re.fullmatch(LORA_PATTERN, str(v)):
                raise ValueError(f"LoRA entries are 'none' or 'r<rank>' such as 'r16', got {v!r}")
        return values

    @field_validator("layout")
    @classmethod
    def _canonical_layouts(cls, values: list[str]) -> list[str]:
        canonical = [_canonical(v) for v in values]
        for i, (given, spelled) in enumerate(zip(values, canonical, strict=True)):
            if canonical.index(spelled) < i:  # the same points twice; a plan spelled otherwise: schema.py
                first = canonical.index(spelled)
                raise ValueError(
                    f"entry {i} ({given!r}) is entry {first} ({values[first]!r}) again, both spell {spelled!r}; "
                    "list each layout once"
                )
        return canonical


class PointSpec(_Strict):
    """One explicit cell; unset fields take the first value of the matching sweep axis."""

    layout: str | None = None
    batch_size: BatchSize | None = None
    seq_len: SeqLen | None = None
    precision: Precision | None = None
    optimizer: OptimizerName | None = None
    micro_batches: MicroBatches | None = None
    offload: Offload | None = None
    lora: str | None = Field(default=None, pattern=LORA_PATTERN)
    compile: bool | None = None
    attn_implementation: AttnImpl | None = None
    loss: LossName | None = None
    optimizer_in_backward: bool | None = None
    optimizer_offload: OptimizerOffload | None = None
    parallel: str | None = Field(default=None, pattern=PARALLEL_PATTERN)
    allocator: str | None = None

    @field_validator("allocator")
    @classmethod
    def _allocator_spec(cls, value: str | None) -> str | None:
        return None if value is None else check_axis_value(value)

    @field_validator("layout")
    @classmethod
    def _canonical_layout(cls, value: str | None) -> str | None:
        return _canonical(value)
