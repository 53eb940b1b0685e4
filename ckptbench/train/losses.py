"""The loss head of a causal LM step: transformers' default, chunked cross-entropy, or a fused linear
cross-entropy (Liger, cut-cross-entropy).

``default`` lets ``LlamaForCausalLM`` compute the logits of every token (B x S x V in the model's
dtype) and transformers' loss upcast them to fp32 at once. The others replace the model's ``forward``
for the block (an instance attribute, as checkpointing does for layers, so module hooks and
``torch.compile`` still see the model being called): the decoder stack runs as usual, then the loss
is computed from its last hidden state and ``lm_head.weight`` without the whole batch's logits:

- ``chunked``: the tokens are split into ``LOSS_CHUNKS`` chunks; each chunk's logits, their fp32
  copy and the cross-entropy run under non-reentrant checkpointing, so only the chunk's hidden
  states are kept and its logits are recomputed, one chunk at a time, in backward. Pure PyTorch.
- ``fused_linear``: the projection and the cross-entropy in one Triton kernel that never stores the
  logits (Liger's ``LigerFusedLinearCrossEntropyLoss``, else Apple's ``cut_cross_entropy``); CUDA only.

All of them compute transformers' ``ForCausalLMLoss``: position t predicts token t+1, the mean over
the B x (S-1) predicted tokens.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers.modeling_outputs import CausalLMOutputWithPast

from ckptbench.train.model import causal_lm
from ckptbench.train.unavailable import TechniqueUnavailable

IGNORE_INDEX = -100  # transformers' label for "no prediction here"
# torchtune's chunked loss uses 8 chunks along the sequence: at LLaMA-7B's 32000-token vocabulary and
# 8 x 2048 tokens a chunk's fp32 logits take 256 MiB instead of 2 GiB for the batch.
LOSS_CHUNKS = 8

LossFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def shifted_labels(labels: torch.Tensor) -> torch.Tensor:
    """Token t's target is token t+1; the last position of every row predicts nothing (flattened)."""
    return F.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:].reshape(-1)


def _chunk_loss_sum(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = F.linear(hidden, weight).float()  # upcast as transformers' loss does
    return F.cross_entropy(logits, targets, ignore_index=IGNORE_INDEX, reduction="sum")


def chunked_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, *, chunks: int = LOSS_CHUNKS
) -> torch.Tensor:
    """Mean next-token cross-entropy, ``chunks`` chunks of tokens at a time, each recomputed in backward."""
    flat = hidden.reshape(-1, hidden.shape[-1])  # a view: the stack's output is contiguous
    targets = shifted_labels(labels)
    total = torch.zeros((), dtype=torch.float32, device=hidden.device)
    for h, t in zip(flat.chunk(chunks), targets.chunk(chunks), strict=True):
        total = total + checkpoint(_chunk_loss_sum, h, weight, t, use_reentrant=False)
    return total / (targets != IGNORE_INDEX).sum()


def fused_linear_cross_entropy() -> tuple[LossFn, str]:
    """Liger's fused linear cross-entropy, else cut-cross-entropy, with the package and version used."""
    try:
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss
    except ImportError:
        pass
    else:
        liger = LigerFusedLinearCrossEntropyLoss(ignore_index=IGNORE_INDEX, reduction="mean")

        def by_liger(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            out = liger(weight, hidden.reshape(-1, hidden.shape[-1]), shifted_labels(labels))
            return out[0] if isinstance(out, tuple) else out  # some versions also return a z-loss

        return by_liger, f"liger-kernel {importlib.metadata.version('liger-kernel')}"
    try:
        from cut_cross_entropy import linear_cross_entropy
    except ImportError:
        raise TechniqueUnavailable(
            "loss fused_linear needs liger-kernel or cut-cross-entropy, and neither is installed"
        ) from None

    def by_cce(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        flat = hidden.reshape(-1, hidden.shape[-1])
        loss: torch.Tensor = linear_cross_entropy(flat, weight, shifted_labels(labels), ignore_index=IGNORE_INDEX)
        return loss

    return by_cce, f"cut-cross-entropy {importlib.metadata.version('cut-cross-entropy')}"


@contextlib.contextmanager
def loss_head(model: nn.Module, kind: str) -> Iterator[str | None]:
    """Compute the model's loss the ``kind`` way for the block; yields the implementation used (None: default)."""
    if kind == "default":
        yield None
        return
    causal = causal_lm(model)
    if type(causal.lm_head) is not nn.Linear:
        raise TechniqueUnavailable(f"loss {kind} needs a plain lm_head (LoRA on lm_head is not supported)")
    if getattr(causal.config, "final_logit_softcapping", None):
        # These heads compute plain logits; Gemma-2 soft-caps them first (its loss would differ).
        raise TechniqueUnavailable(f"loss {kind} computes plain logits, and this model soft-caps them (Gemma-2)")
    if kind == "chunked":
        compute: LossFn = chunked_cross_entropy
        used = f"chunked cross-entropy, {LOSS_CHUNKS} chunks"
    elif kind == "fused_linear":
        if not causal.lm_head.weight.is_cuda:
            raise TechniqueUnavailable("loss fused_linear runs Triton kernels and needs a CUDA device")
        compute, used = fused_linear_cross_entropy()
    else:
        raise ValueError(f"unknown loss {kind!r}")

    def forward(input_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None, **kwargs: Any) -> Any:
        given = {k: v for k, v in kwargs.items() if v is not None}  # peft passes unset options as None
        hidden = causal.model(input_ids=input_ids, **given).last_hidden_state
        if labels is None:
            return CausalLMOutputWithPast(logits=causal.lm_head(hidden))
        return CausalLMOutputWithPast(loss=compute(hidden, causal.lm_head.weight, labels))

    causal.forward = forward
    try:
        yield used
    finally:
        del causal.forward
