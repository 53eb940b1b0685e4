"""Build the model on the target device with transformers' auto classes (plus LoRA, attention switching,
the decoder layers' parts, sizes).

Every supported family (config/families.py) is a dense decoder-only causal LM whose decoder layers are
``model.model.layers``, each with an attention and an MLP submodule: LlamaForCausalLM, Qwen3ForCausalLM, ...
built from its config with random weights, nothing downloaded.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import inspect
import json
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

from ckptbench.config.families import FAMILIES, family_of
from ckptbench.config.model import LoraSpec, ModelSpec
from ckptbench.config.model_fields import IGNORED_FIELDS
from ckptbench.errors import ConfigError
from ckptbench.json_object import JsonObject
from ckptbench.train.flops import ModelShape
from ckptbench.train.optimizers import bitsandbytes_quietly


@functools.cache
def _family_fields(model_type: str) -> frozenset[str]:
    """The fields a family's transformers config declares (what model.overrides may name)."""
    return frozenset(AutoConfig.for_model(model_type).to_dict())


def _repeat_layer_types(fields: JsonObject) -> None:
    """Fit a config's per-layer attention types to its number of layers (its pattern repeated), so that
    ``num_hidden_layers`` can be overridden (and the estimator's short models built) on a config.json that
    lists them (Gemma-2, Qwen3)."""
    types, n = fields.get("layer_types"), fields.get("num_hidden_layers")
    if isinstance(types, list) and types and isinstance(n, int) and len(types) != n:
        fields["layer_types"] = [types[i % len(types)] for i in range(n)]


def hf_config(spec: ModelSpec) -> PretrainedConfig:
    """The transformers config of a model spec (LlamaConfig, Qwen3Config, ...: the family's own);
    unknown override names are a ConfigError."""
    resolved = spec.resolved()
    family = family_of(resolved)
    known = _family_fields(family.model_type)
    unknown = sorted(set(spec.overrides) - known)
    if unknown:
        hint = difflib.get_close_matches(unknown[0], sorted(known), n=1)
        extra = f"; did you mean {hint[0]!r}?" if hint else ""
        cls_name = type(AutoConfig.for_model(family.model_type)).__name__
        raise ConfigError(f"model.overrides.{unknown[0]}: not a {cls_name} field{extra}")
    fields = {k: v for k, v in resolved.items() if k not in IGNORED_FIELDS}
    # No special tokens: a family's defaults (Phi-3's pad id 32000) would not fit a shrunk vocabulary.
    fields.update(pad_token_id=None, bos_token_id=None, eos_token_id=None)
    _repeat_layer_types(fields)
    with warnings.catch_warnings():
        # A config.json's token ids or rope settings may not fit a shrunk vocabulary or context: not an error here.
        warnings.simplefilter("ignore")
        cfg = AutoConfig.for_model(family.model_type, **fields)
    cfg._attn_implementation = spec.attn_implementation
    cfg.use_cache = False
    return cfg


def uniform_layers(spec: ModelSpec) -> bool:
    """Whether every decoder layer is built alike (not so in Gemma-2: sliding-window and full-attention layers
    alternate; Qwen2/3 with use_sliding_window: the layers past max_window_layers slide)."""
    types = getattr(hf_config(spec), "layer_types", None)
    return not types or len(set(types)) == 1


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def _construct(cfg: PretrainedConfig) -> PreTrainedModel:
    """The family's causal LM for ``cfg`` (AutoModelForCausalLM), in the default dtype on the default device."""
    model: PreTrainedModel = AutoModelForCausalLM.from_config(cfg, attn_implementation=cfg._attn_implementation)
    return model


def build_model(spec: ModelSpec, *, device: torch.device, dtype: torch.dtype, seed: int,
                reset: bool = True) -> PreTrainedModel:
    """Construct the model directly on ``device`` in ``dtype`` (no CPU round trip), in train mode, its weights
    re-initialised from ``seed`` (``reset=False``: as constructed, for fake tensors, which hold no values)."""
    cfg = hf_config(spec)
    # Parameters are allocated on the device in the final dtype: a 7B model builds in seconds on a GPU.
    with torch.device(device), _default_dtype(dtype):
        model = _construct(cfg)
    model.train()
    if reset:
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
    family = FAMILIES.get(getattr(getattr(model, "config", None), "model_type", ""))
    norm = 0.0 if family is not None and family.norm_offset else 1.0  # Gemma's norms scale by (1 + weight)
    for name, param in model.named_parameters():
        if name.endswith("norm.weight") or "lora_B" in name:
            param.fill_(norm if name.endswith("norm.weight") else 0.0)
        else:
            param.normal_(0.0, std, generator=gen)


# Fused projections (Phi-3) that stand for separate ones in LoRA's target list.
_FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def lora_targets(model: nn.Module, targets: list[str]) -> list[str]:
    """LoRA's target module names for this model: separate projections the model fuses (Phi-3's qkv_proj,
    gate_up_proj) are replaced by the fused one, so the same config adapts the same weights in every family."""
    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    out: list[str] = []
    for target in targets:
        fused = next((f for f, parts in _FUSED.items() if target in parts and target not in names and f in names), None)
        name = fused or target
        if name not in out:
            out.append(name)
    return out


def apply_lora(model: PreTrainedModel, *, rank: int, spec: LoraSpec) -> nn.Module:
    """Wrap the model with peft LoRA adapters: base weights frozen, adapters trainable."""
    try:
        with bitsandbytes_quietly():  # peft imports bitsandbytes where it is installed
            from peft import LoraConfig, get_peft_model
    except ImportError:
        raise ModuleNotFoundError(
            "peft is not installed (pip install 'ckptbench[lora]') and LoRA points need it"
        ) from None
    lora = LoraConfig(
        r=rank, lora_alpha=spec.alpha,  # type: ignore[arg-type]  # peft annotates int; floats work
        target_modules=lora_targets(model, spec.target_modules), lora_dropout=0.0, bias="none"
    )
    with warnings.catch_warnings():
        # peft reads transformers' deprecated `is_gradient_checkpointing` property, whose FutureWarning would
        # reach the user's stderr on every LoRA point (peft 0.21, transformers 5.x).
        warnings.filterwarnings("ignore", message=".*`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        wrapped = get_peft_model(model, lora)
    # Reentrant checkpointing (used by ckpt_inputs offloading) needs an input that requires grad.
    model.enable_input_require_grads()
    return wrapped


def causal_lm(model: nn.Module) -> Any:
    """The causal LM (LlamaForCausalLM, Qwen3ForCausalLM, ...), also under a peft wrapper."""
    return getattr(model, "get_base_model", lambda: model)()


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """``model.model.layers`` of the causal LM, also under a peft wrapper."""
    layers: nn.ModuleList = causal_lm(model).model.layers
    return layers


def _takes_attention_mask(module: nn.Module) -> bool:
    try:
        return "attention_mask" in inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        return False


def layer_parts(layer: nn.Module) -> dict[str, nn.Module]:
    """A decoder layer's attention and MLP, found by structure, not by name: of the layer's children that hold
    linear projections, the attention is the one whose forward takes the attention mask, the MLP the other
    (self_attn/mlp in every supported family; Phi-3's fused qkv_proj and gate_up_proj alike)."""
    holders = [m for m in layer.children() if any(isinstance(x, nn.Linear) for x in m.modules())]
    attn = [m for m in holders if _takes_attention_mask(m)]
    mlp = [m for m in holders if not _takes_attention_mask(m)]
    if len(attn) != 1 or len(mlp) != 1:
        raise ValueError(f"{type(layer).__name__} does not have LLaMA's shape (one attention and one MLP holding "
                         f"projections; found {len(attn)} and {len(mlp)})")
    return {"attn": attn[0], "mlp": mlp[0]}


@contextlib.contextmanager
def attention(model: nn.Module, impl: str) -> Iterator[None]:
    """Switch the attention implementation (the model's config, which every attention module reads) for the block."""
    config = causal_lm(model).config
    old = config._attn_implementation
    config._attn_implementation = impl
    try:
        yield
    finally:
        config._attn_implementation = old


def _sliding_windows(cfg: Any) -> tuple[int | None, ...]:
    """Per layer, the window a token attends within (None: the whole sequence); () when no layer slides."""
    n, window = int(cfg.num_hidden_layers), getattr(cfg, "sliding_window", None)
    types = getattr(cfg, "layer_types", None)
    if not window:
        return ()
    # Gemma-2, Qwen2/3: per-layer types; Mistral, Phi-3: every layer slides.
    per_type = (int(window) if t == "sliding_attention" else None for t in types or ())
    windows = tuple(per_type) if types else (int(window),) * n
    return windows if any(w is not None for w in windows) else ()


@functools.cache
def _layer_counts(config_json: str) -> tuple[int, int, int, int]:
    """(attention, MLP, whole layer, LM head) parameter counts of a one-layer model built on the meta device."""
    cfg = AutoConfig.for_model(**json.loads(config_json))
    cfg.num_hidden_layers = 1
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = cfg.layer_types[:1]
    with torch.device("meta"):
        model = _construct(cfg)
    layer = decoder_layers(model)[0]
    parts = layer_parts(layer)

    def count(m: nn.Module) -> int:
        return sum(p.numel() for p in m.parameters())

    return count(parts["attn"]), count(parts["mlp"]), count(layer), int(model.get_output_embeddings().weight.numel())


def layer_param_counts(cfg: PretrainedConfig) -> dict[str, int]:
    """Parameter counts of one decoder layer's parts and of the LM head's matmul weight, counted on the family's
    own modules (biases, q/k norms, fused projections and extra norms included; every layer has the same)."""
    attn, mlp, layer, head = _layer_counts(cfg.to_json_string(use_diff=False))
    return {"attn": attn, "mlp": mlp, "layer": layer, "lm_head": head}


def model_shape(cfg: PretrainedConfig) -> ModelShape:
    """What FLOP counting needs of a built config."""
    counts = layer_param_counts(cfg)
    c: Any = cfg  # transformers types these fields as optional; a built config has them all
    d, heads = int(c.hidden_size), int(c.num_attention_heads)
    width = heads * int(getattr(c, "head_dim", None) or d // heads)
    return ModelShape(
        num_layers=int(c.num_hidden_layers), hidden_size=d, attn_params=counts["attn"],
        mlp_params=counts["mlp"], layer_params=counts["layer"], lm_head_params=counts["lm_head"],
        attn_width=None if width == d else width, sliding_windows=_sliding_windows(c),
    )
