"""Apply a checkpoint plan: wrap the chosen decoder layers' (or sub-modules') forward in checkpoint.

The decision of *which* modules (a ``LayoutPlan``, config/layouts.py) is kept apart from wrapping
them; ``applied`` restores the modules afterwards, so one model serves every layout.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from ckptbench.config.layouts import LayoutPlan
from ckptbench.train.model import causal_lm, decoder_layers, layer_parts
from ckptbench.train.offload import HostOffload
from ckptbench.train.switches import transformers_switches


@functools.cache
def switch_layers(model: nn.Module, plan: LayoutPlan) -> list[int]:
    """Apply a whole-layer plan to a transformers model through its own switches, for good (a training script's
    model): checkpointing enabled (non-reentrant), then each decoder layer's ``gradient_checkpointing`` flag set to
    whether the plan checkpoints it. Returns the layers checkpointed. A plan of parts of layers (attention, MLP,
    per-op) is not one transformers can say: ValueError (``applied`` wraps such modules instead)."""
    if plan.granularity != "block":
        raise ValueError(f"{plan.layout}: transformers checkpoints whole decoder layers only; wrap the modules "
                         "with torch.utils.checkpoint (ckptbench advise prints the code)")
    layers = decoder_layers(model)
    if len(layers) != plan.num_layers:
        raise ValueError(f"plan is for {plan.num_layers} layers, the model has {len(layers)}")
    lm = causal_lm(model)
    kwargs = {"use_reentrant": False}
    if not plan.layers:
        disable = getattr(lm, "activation_checkpointing_disable", None) or lm.gradient_checkpointing_disable
        disable()
        return []
    if transformers_switches()[0]:
        lm.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    chosen = set(plan.layers)
    for i, layer in enumerate(layers):
        setattr(layer, "gradient_checkpointing", i in chosen)  # noqa: B010 - a plain flag (nn.Module's typing)
    return sorted(chosen)


def _saved_ops() -> frozenset[Any]:
    """Ops whose outputs selective checkpointing keeps: matmuls and fused attention kernels."""
    aten = torch.ops.aten
    names = (
        "mm", "addmm", "bmm", "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
    )
    return frozenset(getattr(aten, n).default for n in names if hasattr(aten, n))


def _selective_policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in _saved_ops() else CheckpointPolicy.PREFER_RECOMPUTE


def _selective_context() -> Any:
    return create_selective_checkpoint_contexts(_selective_policy)


def _checkpointed(forward: Any, *, selective: bool, offload: HostOffload | None) -> Any:
    if offload is not None:
        return _checkpointed_offloaded(forward, offload)

    @functools.wraps(forward)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        # Non-reentrant checkpointing: keyword arguments and non-tensor outputs are allowed.
        if selective:
            return checkpoint(forward, *args, use_reentrant=False, context_fn=_selective_context, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return wrapped


def _checkpointed_offloaded(forward: Any, offload: HostOffload) -> Any:
    """Reentrant checkpoint: its one saved tensor, the module input, goes to host memory."""

    @functools.wraps(forward)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if args:
            hidden, rest = args[0], args[1:]

            def run(h: torch.Tensor) -> Any:
                return forward(h, *rest, **kwargs)
        else:
            hidden = kwargs.pop("hidden_states")

            def run(h: torch.Tensor) -> Any:
                return forward(hidden_states=h, **kwargs)

        with offload.active():
            return checkpoint(run, hidden, use_reentrant=True)

    return wrapped


# A plan's sub-module names (config/layouts.py) -> the part of a decoder layer found by structure (layer_parts).
_PARTS = {"self_attn": "attn", "mlp": "mlp"}


def plan_modules(model: nn.Module, plan: LayoutPlan) -> list[nn.Module]:
    """The modules a plan wraps, resolved against the model's own decoder layers: a whole layer, or its
    attention or MLP found by structure (the same in every family, whatever the submodules are named)."""
    layers = decoder_layers(model)
    if len(layers) != plan.num_layers:
        raise ValueError(f"plan is for {plan.num_layers} layers, the model has {len(layers)}")
    modules = []
    for target in plan.targets:
        index, _, part = target.partition(".")
        layer = layers[int(index)]
        modules.append(layer_parts(layer)[_PARTS[part]] if part else layer)
    return modules


@contextlib.contextmanager
def applied(
    model: nn.Module, plan: LayoutPlan, *, offload_inputs: HostOffload | None = None
) -> Iterator[list[nn.Module]]:
    """Checkpoint the plan's modules for the duration of the block, then restore them."""
    modules = plan_modules(model, plan)
    selective = plan.granularity == "selective"
    for module in modules:
        # An instance attribute shadows the class forward; nn.Module.__call__ still runs hooks outside it.
        module.forward = _checkpointed(module.forward, selective=selective, offload=offload_inputs)
    try:
        yield modules
    finally:
        for module in modules:
            del module.forward
