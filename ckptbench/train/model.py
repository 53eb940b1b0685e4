"""Build transformers' LlamaForCausalLM on the target device (plus LoRA, attention switching, sizes)."""

from __future__ import annotations

import contextlib
import difflib
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from ckptbench.config.model import LoraSpec, ModelSpec
from ckptbench.errors import ConfigError
from ckptbench.train.flops import ModelShape

_LLAMA_FIELDS = frozenset(LlamaConfig().to_dict())


def llama_config(spec: ModelSpec) -> LlamaConfig:
    """The LlamaConfig for a model spec; unknown override names are a ConfigError."""
    unknown = sorted(set(spec.overrides) - _LLAMA_FIELDS)
    if unknown:
        hint = difflib.get_close_matches(unknown[0], sorted(_LLAMA_FIELDS), n=1)
        extra = f"; did you mean {hint[0]!r}?" if hint else ""
        raise ConfigError(f"model.overrides.{unknown[0]}: not a LlamaConfig field{extra}")
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


def warm_device_libraries(device: torch.device, dtype: torch.dtype) -> None:
    """Create the math libraries' persistent buffers now, before any memory baseline is taken.

    cuBLAS/cuBLASLt allocate a workspace (64 MiB on an H200) through PyTorch's caching allocator on
    their first matmul and keep it for the life of the process: measured after that first matmul, it
    looks like a leak of the first point. A small forward and backward with and without bias, in the
    model's dtype and in fp32, creates them up front. Nothing to do on CPU.
    """
    if device.type != "cuda":
        return
    for dt in {dtype, torch.float32}:
        x = torch.randn(16, 64, device=device, dtype=dt, requires_grad=True)
        w = torch.randn(64, 64, device=device, dtype=dt, requires_grad=True)
        b = torch.randn(64, device=device, dtype=dt, requires_grad=True)
        (torch.nn.functional.linear(x, w) + torch.nn.functional.linear(x, w, b)).float().sum().backward()
    torch.cuda.synchronize(device)


@torch.no_grad()
def reset_weights(model: nn.Module, *, seed: int, std: float = 0.02) -> None:
    """Re-initialise every parameter deterministically, so each point starts from the same weights."""
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    for name, param in model.named_parameters():
        if name.endswith("norm.weight") or "lora_B" in name:
            param.fill_(1.0 if name.endswith("norm.weight") else 0.0)
        else:
            param.normal_(0.0, std, generator=gen)


def apply_lora(model: LlamaForCausalLM, *, rank: int, spec: LoraSpec) -> nn.Module:
    """Wrap the model with peft LoRA adapters: base weights frozen, adapters trainable."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise ModuleNotFoundError(
            "peft is not installed (pip install 'ckptbench[lora]') and LoRA points need it"
        ) from None
    lora = LoraConfig(
        r=rank, lora_alpha=spec.alpha,  # type: ignore[arg-type]  # peft annotates int; floats work
        target_modules=list(spec.target_modules), lora_dropout=0.0, bias="none"
    )
    with warnings.catch_warnings():
        # peft reads transformers' deprecated `is_gradient_checkpointing` property, whose FutureWarning would
        # reach the user's stderr on every LoRA point (peft 0.21, transformers 5.x).
        warnings.filterwarnings("ignore", message=".*`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        wrapped = get_peft_model(model, lora)
    # Reentrant checkpointing (used by ckpt_inputs offloading) needs an input that requires grad.
    model.enable_input_require_grads()
    return wrapped


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """``model.model.layers`` of the LlamaForCausalLM, also under a peft wrapper."""
    base: Any = getattr(model, "get_base_model", lambda: model)()
    layers: nn.ModuleList = base.model.layers
    return layers


@contextlib.contextmanager
def attention(model: nn.Module, impl: str) -> Iterator[None]:
    """Switch the attention implementation (shared config object) for the block."""
    layer: Any = decoder_layers(model)[0]
    config = layer.self_attn.config
    old = config._attn_implementation
    config._attn_implementation = impl
    try:
        yield
    finally:
        config._attn_implementation = old


def layer_param_counts(cfg: LlamaConfig) -> dict[str, int]:
    """Parameter counts of one decoder layer's parts and of the whole model's matmul weights."""
    c: Any = cfg  # transformers types these fields as optional; a built LlamaConfig has them all
    d, ff, heads = int(c.hidden_size), int(c.intermediate_size), int(c.num_attention_heads)
    head_dim = int(getattr(c, "head_dim", None) or d // heads)
    q_dim = heads * head_dim
    kv_dim = int(c.num_key_value_heads) * head_dim
    attn = d * q_dim + 2 * d * kv_dim + q_dim * d
    mlp = 3 * d * ff
    return {"attn": attn, "mlp": mlp, "layer": attn + mlp + 2 * d, "lm_head": d * int(c.vocab_size)}


def model_shape(cfg: LlamaConfig) -> ModelShape:
    """What FLOP counting needs of a built LlamaConfig."""
    counts = layer_param_counts(cfg)
    c: Any = cfg
    return ModelShape(
        num_layers=int(c.num_hidden_layers), hidden_size=int(c.hidden_size), attn_params=counts["attn"],
        mlp_params=counts["mlp"], layer_params=counts["layer"], lm_head_params=counts["lm_head"],
    )
