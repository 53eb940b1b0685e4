"""The sweep axes as validated config: closed choices, the grid's lists and explicit points. No torch."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ckptbench.config.alloc_conf import check_axis_value

Precision = Literal["bf16", "fp16", "fp32", "amp_bf16", "amp_fp16"]
# adamw_8bit: bitsandbytes; adamw_8bit_torchao: torchao's AdamW8bit (both change the optimizer's numerics).
OptimizerName = Literal["adamw_fused", "adamw_foreach", "sgd", "adafactor", "adamw_8bit", "adamw_8bit_torchao"]
DeviceName = Literal["auto", "cuda", "cpu"]
AttnImpl = Literal["sdpa", "eager"]
# Activation offloading: 'none'; 'all' keeps every tensor autograd saves (outside checkpointed
# regions) in pinned host memory; 'ckpt_inputs' offloads only the inputs of checkpointed modules.
Offload = Literal["none", "all", "ckpt_inputs"]
# The loss head: 'default' (transformers: full logits, then fp32 cross-entropy), 'chunked' (cross-entropy
# over chunks of tokens, each chunk's fp32 logits recomputed in backward, never the whole batch's),
# 'fused_linear' (Liger's fused linear cross-entropy, or Apple's cut-cross-entropy; CUDA only).
LossName = Literal["default", "chunked", "fused_linear"]
# Optimizer state in host memory, stepped by the CPU: 'none' or 'cpu' (torchao's CPUOffloadOptimizer; CUDA only).
OptimizerOffload = Literal["none", "cpu"]
LORA_PATTERN = r"^(none|r[1-9][0-9]*)$"

class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SweepAxes(_Strict):
    """The grid: its cells are the cartesian product of these lists."""

    # Layout strings (see `ckptbench layouts`); 'fit' searches the fewest layers that fit the budget.
    layout: list[str] = Field(default_factory=lambda: ["none"], min_length=1)
    # Batch sizes, or 'max': per layout, the largest batch that fits (doubling, then bisection).
    batch_size: list[int] | Literal["max"] = Field(default_factory=lambda: [1], min_length=1)
    seq_len: list[int] = Field(default_factory=lambda: [512], min_length=1)
    precision: list[Precision] = Field(default_factory=lambda: list[Precision](["bf16"]), min_length=1)
    # Optional axes; an unset one takes the single top-level value (optimizer, attn_implementation).
    optimizer: list[OptimizerName] | None = Field(default=None, min_length=1)
    # Gradient accumulation: micro-batches of batch_size per optimizer step.
    micro_batches: list[int] = Field(default_factory=lambda: [1], min_length=1)
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

    @field_validator("batch_size", "seq_len", "micro_batches")
    @classmethod
    def _positive(cls, values: list[int] | str) -> list[int] | str:
        if isinstance(values, str):
            return values
        for v in values:
            if v < 1:
                raise ValueError(f"must be positive integers, got {v}")
        return values


class PointSpec(_Strict):
    """One explicit cell; unset fields take the first value of the matching sweep axis."""

    layout: str | None = None
    batch_size: int | None = Field(default=None, ge=1)
    seq_len: int | None = Field(default=None, ge=1)
    precision: Precision | None = None
    optimizer: OptimizerName | None = None
    micro_batches: int | None = Field(default=None, ge=1)
    offload: Offload | None = None
    lora: str | None = Field(default=None, pattern=LORA_PATTERN)
    compile: bool | None = None
    attn_implementation: AttnImpl | None = None
    loss: LossName | None = None
    optimizer_in_backward: bool | None = None
    optimizer_offload: OptimizerOffload | None = None
    allocator: str | None = None

    @field_validator("allocator")
    @classmethod
    def _allocator_spec(cls, value: str | None) -> str | None:
        return None if value is None else check_axis_value(value)
