"""The values each sweep axis allows: closed choices, bounds and grammars (config/grid.py's declaration names one per
axis), and what a precision stores its weights in. No torch."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ckptbench.config.alloc_conf import check_axis_value
from ckptbench.config.layouts import canonical_layout
from ckptbench.config.parallel import parse_parallel

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

# The dtype each precision stores the weights in (and so the gradients and the optimizer state): the amp precisions
# keep fp32 weights. train/step.py builds the model in it (tests/test_axis_keys.py holds the two to the same dtype).
WEIGHT_DTYPE: dict[str, str] = {
    "bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "amp_bf16": "float32", "amp_fp16": "float32",
}


class _Strict(BaseModel):
    # allow_inf_nan=False: .inf or .nan in any float field is refused with its field path (a budget of
    # .inf used to run every point and then fail converting it to bytes).
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def _shown(value: Any, limit: int = 60) -> str:
    """A short one-line repr of a user's value."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# -- the grammars: each takes one value as a config spells it and returns it as a point holds it, or raises a
# ValueError that says what is allowed ------------------------------------------------------------------------------


def layout_value(value: Any) -> Any:
    # One spelling per layout ('ALL', ' all', 'all@block' -> 'all'); anything unparsable is kept as
    # written so that the error, reported later with the model's layer count, quotes the user's text.
    return canonical_layout(value) if isinstance(value, str) else value


def lora_value(value: Any) -> Any:
    """'none' (full fine-tuning) or 'r<rank>'."""
    if not re.fullmatch(LORA_PATTERN, str(value)):
        raise ValueError(f"LoRA entries are 'none' or 'r<rank>' such as 'r16', got {value!r}")
    return value


def parallel_value(value: Any) -> Any:
    """'none', 'ddp:N', 'fsdp2:N' or 'fsdp2:N:noreshard' (config/parallel.py)."""
    parse_parallel(value)
    return value


def allocator_value(value: Any) -> str:
    """The CUDA caching allocator's options, as the point's process sets them (config/alloc_conf.py)."""
    return check_axis_value(str(value))
