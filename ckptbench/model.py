"""Build transformers' LlamaForCausalLM on the target device and apply a checkpoint plan."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import LlamaConfig, LlamaForCausalLM

from ckptbench.config import ModelSpec
from ckptbench.errors import ConfigError
from ckptbench.layouts import LayoutPlan

_LLAMA_FIELDS = frozenset(LlamaConfig().to_dict())


def llama_config(spec: ModelSpec) -> LlamaConfig:
    """The LlamaConfig for a model spec; unknown override names are a ConfigError."""
    unknown = sorted(set(spec.overrides) - _LLAMA_FIELDS)
    if unknown:
        raise ConfigError(f"model.overrides.{unknown[0]}: not a LlamaConfig field")
    cfg = LlamaConfig(**spec.resolved())
    cfg._attn_implementation = spec.attn_implementation
    cfg.use_cache = False
    return cfg


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def build_model(spec: ModelSpec, *, device: torch.device, dtype: torch.dtype, seed: int) -> LlamaForCausalLM:
    """Construct the model directly on ``device`` in ``dtype`` (no CPU round trip), in train mode."""
    cfg = llama_config(spec)
    # Parameters are allocated on the device in the final dtype: a 7B model builds in seconds on a GPU.
    with torch.device(device), _default_dtype(dtype):
        model = LlamaForCausalLM(cfg)
    model.train()
    reset_weights(model, seed=seed, std=cfg.initializer_range)
    return model


@torch.no_grad()
def reset_weights(model: nn.Module, *, seed: int, std: float = 0.02) -> None:
    """Re-initialise every parameter deterministically, so each point starts from the same weights."""
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            param.fill_(1.0)
        else:
            param.normal_(0.0, std, generator=gen)


def _checkpointed(forward: Any) -> Any:
    @functools.wraps(forward)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        # Non-reentrant checkpointing: keyword arguments and non-tensor outputs are allowed.
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return wrapped


def plan_modules(model: LlamaForCausalLM, plan: LayoutPlan) -> list[nn.Module]:
    """The modules a plan wraps, resolved against the model's own decoder layers."""
    layers = model.model.layers
    if len(layers) != plan.num_layers:
        raise ValueError(f"plan is for {plan.num_layers} layers, the model has {len(layers)}")
    return [layers.get_submodule(target) for target in plan.targets]


@contextlib.contextmanager
def applied(model: LlamaForCausalLM, plan: LayoutPlan) -> Iterator[list[nn.Module]]:
    """Checkpoint the plan's modules for the duration of the block, then restore them."""
    modules = plan_modules(model, plan)
    for module in modules:
        # An instance attribute shadows the class forward; nn.Module.__call__ still runs hooks outside it.
        module.forward = _checkpointed(module.forward)
    try:
        yield modules
    finally:
        for module in modules:
            del module.forward


def layer_param_counts(cfg: LlamaConfig) -> dict[str, int]:
    """Parameter counts of one decoder layer's parts and of the whole model's matmul weights."""
    d, ff = cfg.hidden_size, cfg.intermediate_size
    head_dim = getattr(cfg, "head_dim", None) or d // cfg.num_attention_heads
    q_dim = cfg.num_attention_heads * head_dim
    kv_dim = cfg.num_key_value_heads * head_dim
    attn = d * q_dim + 2 * d * kv_dim + q_dim * d
    mlp = 3 * d * ff
    return {"attn": attn, "mlp": mlp, "layer": attn + mlp + 2 * d, "lm_head": d * cfg.vocab_size}
