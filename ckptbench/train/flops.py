"""Model FLOPs (MFU) and hardware FLOPs (HFU, counting recomputation) per training step, and each op's FLOPs and bytes
(``OpCosts``: what the step-time model of analysis/op_time.py times). No torch."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ckptbench.config.cards import BY_KEY, card_named
from ckptbench.config.layouts import LayoutPlan

# Cards sold under another name with the same chip and clocks (NVIDIA's export variants): their names are not in
# the card table, their peaks are their twin's.
_TWINS = {"A800": "a100-80gb", "H800": "h100-80gb"}


def peak_tflops_for(gpu_name: str | None) -> float | None:
    """The dense bf16 tensor-core peak (TFLOP/s) of the card torch names ``gpu_name`` (config/cards.py), or None
    when unknown or without bf16 tensor cores (then MFU is not reported)."""
    card = card_named(gpu_name)
    if card is None and gpu_name:
        twin = next((key for part, key in _TWINS.items() if part in gpu_name.upper()), None)
        card = BY_KEY[twin] if twin else None
    return card.bf16_tflops if card is not None else None


@dataclass(frozen=True)
class ModelShape:
    """What FLOP counting needs of a model's config (every supported family: train/model.py model_shape)."""

    num_layers: int
    hidden_size: int
    attn_params: int  # one layer's attention, biases and q/k norms included
    mlp_params: int
    layer_params: int  # one whole decoder layer (attention, MLP, norms)
    lm_head_params: int
    # The query width, heads x head_dim, where it differs from hidden_size (Gemma-7B: 16 x 256 on 3072); None: equal.
    attn_width: int | None = None
    # Per layer, the sliding window a token attends within (None: the whole sequence); (): no layer slides.
    sliding_windows: tuple[int | None, ...] = ()

    @property
    def matmul_params(self) -> int:
        """N in 6N: decoder layers and the LM head (the embedding lookup does no matmul)."""
        return self.num_layers * self.layer_params + self.lm_head_params

    def attention_fwd_flops(self, layer: int, seq_len: int) -> int:
        """Attention-score FLOPs per token of one layer's forward: QK^T and AV, 2 x 2 x width x context, the
        context being the sequence (not halved for causal masking) or the layer's sliding window if shorter."""
        window = self.sliding_windows[layer] if self.sliding_windows else None
        context = seq_len if window is None else min(seq_len, window)
        return 4 * (self.attn_width or self.hidden_size) * context

    @classmethod
    def of_fields(cls, fields: Mapping[str, Any]) -> ModelShape:
        """The shape of a LLaMA-shaped config given as its fields (no biases, no q/k norms, no sliding window;
        no transformers needed): what the step-time model counts recomputation with."""
        d, ff, heads = int(fields["hidden_size"]), int(fields["intermediate_size"]), int(fields["num_attention_heads"])
        head_dim = int(fields.get("head_dim") or d // heads)
        q_dim, kv_dim = heads * head_dim, int(fields.get("num_key_value_heads") or heads) * head_dim
        attn, mlp = d * q_dim + 2 * d * kv_dim + q_dim * d, 3 * d * ff
        return cls(num_layers=int(fields["num_hidden_layers"]), hidden_size=d, attn_params=attn, mlp_params=mlp,
                   layer_params=attn + mlp + 2 * d, lm_head_params=d * int(fields["vocab_size"]),
                   attn_width=q_dim if q_dim != d else None)


def recompute_flops_per_token(shape: ModelShape, *, seq_len: int, layer: int = 0) -> dict[str, int]:
    """FLOPs of one more forward of one layer's parts, per token: 'attn' (projections and attention scores),
    'mlp', and 'block' (the whole layer: both, plus its norms' parameters). What step_flops adds per
    recomputed part of ``layer``."""
    attn_fwd = shape.attention_fwd_flops(layer, seq_len)
    return {
        "attn": 2 * shape.attn_params + attn_fwd,
        "mlp": 2 * shape.mlp_params,
        "block": 2 * shape.layer_params + attn_fwd,
    }


def step_flops(
    shape: ModelShape,
    plan: LayoutPlan,
    *,
    tokens: int,
    seq_len: int,
    frozen_base: bool = False,
    recompute_lm_head: bool = False,
) -> tuple[int, int]:
    """(model FLOPs, hardware FLOPs) of one optimizer step over ``tokens`` tokens of length ``seq_len``.

    Model FLOPs per token: 6N plus attention scores, 12 * layers * width * seq (the PaLM
    convention, not halved for causal masking; width = heads x head_dim, which is the hidden size in
    LLaMA; a sliding-window layer attends within its window when that is shorter); with a frozen base
    (LoRA) the weight gradients are not computed: 4N (adapter FLOPs are neglected). Hardware FLOPs add
    one more forward of every checkpointed part: 2 * its parameters plus, for attention, 4 * width *
    context; per-op (selective) checkpointing saves the matmul and attention outputs, so it adds none of
    these. ``recompute_lm_head`` (the chunked loss) adds one more forward of the LM head: 2 * its parameters.
    """
    attn_fwd = [shape.attention_fwd_flops(i, seq_len) for i in range(shape.num_layers)]
    per_param = 4 if frozen_base else 6
    model = tokens * (per_param * shape.matmul_params + 3 * sum(attn_fwd))
    params = {
        "block": 2 * shape.layer_params,
        "attn": 2 * shape.attn_params,
        "mlp": 2 * shape.mlp_params,
        "attn+mlp": 2 * (shape.attn_params + shape.mlp_params),
        "selective": 0,
    }[plan.granularity]
    with_attention = plan.granularity in ("block", "attn", "attn+mlp")
    recompute = tokens * sum(params + (attn_fwd[i] if with_attention else 0) for i in plan.layers)
    if recompute_lm_head:
        recompute += tokens * 2 * shape.lm_head_params
    return model, model + recompute


# -- each op's cost: what the step-time model of analysis/op_time.py times -----------------------------------------

# The classes a traced op is counted in (estimator/op_costs.py decides; the dtype follows a compute class's name):
# 'matmul:bf16' (mm, addmm: the projections, the MLP, the LM head), 'attention:sdpa:bf16' (a fused attention kernel,
# forward or backward), 'attention:eager:bf16' (bmm, baddbmm: eager attention's score and value products), 'memory'
# (elementwise ops, norms, softmax, the loss, the embedding: memory-bound), 'copy' (casts and copies), 'optimizer'
# (the optimizer step's ops), 'communication' (collectives: not timed).
COMPUTE_KINDS = ("matmul", "attention")
MEMORY, COPY, OPTIMIZER, COMMUNICATION = "memory", "copy", "optimizer", "communication"
# The optimizer's ops by kernel: one fused kernel per step (_fused_adamw_), multi-tensor ops (_foreach_*: one kernel
# per chunk of tensors on a GPU, one op per tensor on a CPU), and per-tensor ops (SGD's loop, Adafactor's).
OPTIMIZER_FUSED, OPTIMIZER_FOREACH, OPTIMIZER_SINGLE = "optimizer:fused", "optimizer:foreach", "optimizer:single"
# Not an op: a forward-backward pass with checkpointed layers (whole layers, attention or MLP), counted once per pass
# by Estimator.op_costs. Checkpointing costs each such pass more than its recomputed ops (analysis/op_time.py).
CHECKPOINTED_PASS = "checkpointed pass"

OpKey = tuple[str, int, int]  # (class, FLOPs, bytes read and written) of one op


def is_compute(op_class: str) -> bool:
    """Whether a class is timed by its FLOPs (and bytes) rather than by its bytes alone."""
    return op_class.split(":", 1)[0] in COMPUTE_KINDS


@dataclass(frozen=True)
class OpCosts:
    """The ops of (a stretch of) a training step, grouped: how many ops of each (class, FLOPs, bytes). Plain data:
    counted by estimator/op_costs.py on the traced step, added up per layout by estimator/assembly.py, timed by
    analysis/op_time.py. A count may be negative in a correction (a boundary layer less a middle one)."""

    counts: Mapping[OpKey, int]

    @classmethod
    def of(cls, parts: Iterable[tuple[OpCosts, int]]) -> OpCosts:
        """The sum of ``parts``, each (costs, how many times)."""
        total: dict[OpKey, int] = {}
        for costs, times in parts:
            if times:
                for key, n in costs.counts.items():
                    total[key] = total.get(key, 0) + n * times
        return cls({k: n for k, n in sorted(total.items()) if n})

    def plus(self, other: OpCosts, times: int = 1) -> OpCosts:
        return OpCosts.of([(self, 1), (other, times)])

    @property
    def ops(self) -> int:
        """How many ops (kernels) these are."""
        return sum(n for (c, _, _), n in self.counts.items() if c != CHECKPOINTED_PASS)

    def count(self, op_class: str) -> int:
        """How many ops of one class."""
        return sum(n for (c, _, _), n in self.counts.items() if c == op_class)

    def flops(self, op_class: str | None = None) -> int:
        """FLOPs of every op (of one class)."""
        return sum(f * n for (c, f, _), n in self.counts.items() if op_class is None or c == op_class)

    def bytes(self, op_class: str | None = None) -> int:
        """Bytes read and written by every op (of one class)."""
        return sum(b * n for (c, _, b), n in self.counts.items() if op_class is None or c == op_class)

    @property
    def classes(self) -> tuple[str, ...]:
        return tuple(sorted({c for c, _, _ in self.counts}))

    def to_json(self) -> list[list[Any]]:
        """[[class, FLOPs, bytes, count], ...], sorted."""
        return [[c, f, b, n] for (c, f, b), n in sorted(self.counts.items())]

    @classmethod
    def from_json(cls, data: Iterable[Sequence[Any]]) -> OpCosts:
        return cls({(str(c), int(f), int(b)): int(n) for c, f, b, n in data})


NO_OPS = OpCosts({})
