"""Which model architectures ckptbench builds: dense decoder-only causal LMs with LLaMA's layer shape.

A family is a transformers ``model_type`` whose ``AutoModelForCausalLM`` is ``model.model.layers[i]``, each
layer an attention and an MLP submodule. Mixture-of-experts, encoder-decoder and state-space models are
refused before anything runs, in one line that names what is supported. Pure data: no torch, no transformers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Family:
    """One supported ``model_type``: its name, what it does differently from LLaMA, and its attention kernels."""

    model_type: str
    name: str
    special: str  # what the family adds to LLaMA's layer (the estimator follows it by tracing the real code)
    # Attention implementations the family's code supports: Gemma-2 soft-caps attention logits, which
    # scaled_dot_product_attention cannot (transformers' Gemma2 refuses sdpa for that reason).
    attention: tuple[str, ...] = ("sdpa", "eager")
    # RMSNorm scales by (1 + weight) in Gemma: its norms start at 0, LLaMA's at 1 (train/model.py reset_weights).
    norm_offset: bool = False


FAMILIES: dict[str, Family] = {
    f.model_type: f
    for f in (
        Family("llama", "LLaMA 1/2/3.x",
               "grouped-query attention (Llama-2 70B, 3.x), tied embeddings (Llama-3.2 1B/3B)"),
        Family("mistral", "Mistral", "sliding-window attention (v0.1: 4096 tokens), grouped-query attention"),
        Family("qwen2", "Qwen2 / Qwen2.5", "biases on the q/k/v projections, grouped-query attention"),
        Family("qwen3", "Qwen3", "per-head RMSNorm of queries and keys, head_dim apart from hidden/heads"),
        Family("gemma", "Gemma", "embeddings scaled by sqrt(hidden), tied embeddings, GeGLU, head_dim 256",
               norm_offset=True),
        Family("gemma2", "Gemma-2", "attention and final-logit soft-capping, alternating sliding/full layers, "
               "norms before and after each sublayer, tied embeddings", attention=("eager",), norm_offset=True),
        Family("phi3", "Phi-3", "fused qkv and gate_up projections"),
        Family("olmo2", "OLMo-2", "norms after each sublayer, RMSNorm of the full query and key"),
    )
}
SUPPORTED = ", ".join(FAMILIES)
DEFAULT_MODEL_TYPE = "llama"  # presets written before families existed name no model_type: all are LLaMA

# Fields that make a model a mixture of experts (transformers' MoE configs: Mixtral, Qwen2/3-MoE, DeepSeek, DBRX...).
_MOE_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts", "num_experts_per_tok",
               "moe_intermediate_size", "ffn_config")
_STATE_SPACE = ("mamba", "mamba2", "falcon_mamba", "falcon_h1", "jamba", "zamba", "zamba2", "rwkv",
                "recurrent_gemma", "bamba", "nemotron_h", "lfm2", "xlstm", "granitemoehybrid")
_ENCODER_DECODER = ("t5", "mt5", "umt5", "bart", "mbart", "pegasus", "marian", "led", "prophetnet", "longt5",
                    "switch_transformers", "encoder-decoder", "whisper", "m2m_100", "nllb_moe", "fsmt")


def family_of(fields: Mapping[str, Any]) -> Family:
    """The supported family of a model's config fields, or ValueError naming what it is and what is supported."""
    model_type = fields.get("model_type", DEFAULT_MODEL_TYPE)
    if not isinstance(model_type, str) or not model_type:
        raise ValueError(f"model_type must be a name such as 'llama' (got {model_type!r}); supported: {SUPPORTED}")
    why = _unsupported(model_type, fields)
    if why is not None:
        raise ValueError(f"model_type {model_type!r} is {why}; ckptbench builds dense decoder-only causal LMs "
                         f"with LLaMA's layer shape: {SUPPORTED}")
    return FAMILIES[model_type]


def _unsupported(model_type: str, fields: Mapping[str, Any]) -> str | None:
    moe = [f for f in _MOE_FIELDS if fields.get(f) not in (None, 0, 1)]
    if "moe" in model_type.lower() or model_type in ("mixtral", "dbrx", "deepseek_v2", "deepseek_v3", "olmoe",
                                                     "jetmoe", "granitemoe", "phimoe", "llama4", "gpt_oss"):
        return "a mixture-of-experts model"
    if moe:
        return f"a mixture-of-experts model ({moe[0]}: {fields[moe[0]]})"
    if fields.get("is_encoder_decoder") is True or model_type in _ENCODER_DECODER:
        return "an encoder-decoder model"
    if model_type in _STATE_SPACE or "mamba" in model_type:
        return "a state-space (or hybrid) model"
    if model_type not in FAMILIES:
        return "not a supported architecture"
    return None
