"""Model presets as plain transformers config keyword dicts (pure data: no torch import).

A preset without ``model_type`` is a LLaMA (``LlamaConfig``); the others name their family
(config/families.py). Published sizes are copied from each model's config.json on the Hugging Face hub (the
repo is named above each): only the fields that decide memory and time (widths, layers, heads, vocabulary,
tying, sliding window, soft-capping, context length); token ids, dtypes and versions are left out.
"""

from __future__ import annotations

from ckptbench.json_object import JsonObject

_LLAMA1 = {"vocab_size": 32000, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False}

PRESETS: dict[str, JsonObject] = {
    "llama-7b": {
        **_LLAMA1,
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "max_position_embeddings": 4096,
    },
    "llama-13b": {
        **_LLAMA1,
        "hidden_size": 5120,
        "intermediate_size": 13824,
        "num_hidden_layers": 40,
        "num_attention_heads": 40,
        "num_key_value_heads": 40,
        "max_position_embeddings": 4096,
    },
    "llama3-8b": {
        "vocab_size": 128256,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
    },
    # Tiny presets: the same LlamaForCausalLM code path, small enough for a 2-core CPU.
    # Activations per layer outweigh the logits here, so layer choice visibly moves the peak.
    "tiny": {
        **_LLAMA1,
        "vocab_size": 256,
        "hidden_size": 128,
        "intermediate_size": 352,
        "num_hidden_layers": 8,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "max_position_embeddings": 1024,
    },
    "tiny-gqa": {
        **_LLAMA1,
        "vocab_size": 512,
        "hidden_size": 64,
        "intermediate_size": 176,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 1024,
    },
    "small": {
        **_LLAMA1,
        "vocab_size": 2048,
        "hidden_size": 256,
        "intermediate_size": 688,
        "num_hidden_layers": 8,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "max_position_embeddings": 2048,
    },
}


_LLAMA2 = {"model_type": "llama", "vocab_size": 32000, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
           "max_position_embeddings": 4096, "tie_word_embeddings": False}
# Llama-3.1's and 3.2's long-context rotary scaling (rope_scaling in their config.json).
_LLAMA31_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                 "original_max_position_embeddings": 8192}
_LLAMA3 = {"model_type": "llama", "vocab_size": 128256, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
           "max_position_embeddings": 131072}
_QWEN25 = {"model_type": "qwen2", "vocab_size": 152064, "max_position_embeddings": 131072, "rope_theta": 1000000.0,
           "tie_word_embeddings": False, "use_sliding_window": False}
_QWEN3 = {"model_type": "qwen3", "vocab_size": 151936, "max_position_embeddings": 40960, "rope_theta": 1000000.0,
          "rms_norm_eps": 1e-6, "head_dim": 128, "num_key_value_heads": 8, "tie_word_embeddings": False}

# The published sizes, by preset name: (source, fields).
PUBLISHED: dict[str, tuple[str, JsonObject]] = {
    "llama-2-7b": ("meta-llama/Llama-2-7b-hf config.json", {
        **_LLAMA2, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 32}),
    "llama-2-13b": ("meta-llama/Llama-2-13b-hf config.json", {
        **_LLAMA2, "hidden_size": 5120, "intermediate_size": 13824, "num_hidden_layers": 40,
        "num_attention_heads": 40, "num_key_value_heads": 40}),
    "llama-2-70b": ("meta-llama/Llama-2-70b-hf config.json", {
        **_LLAMA2, "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
        "num_attention_heads": 64, "num_key_value_heads": 8}),
    "llama-3.1-8b": ("meta-llama/Llama-3.1-8B config.json", {
        **_LLAMA3, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "rope_scaling": _LLAMA31_ROPE,
        "tie_word_embeddings": False}),
    "llama-3.1-70b": ("meta-llama/Llama-3.1-70B config.json", {
        **_LLAMA3, "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
        "num_attention_heads": 64, "num_key_value_heads": 8, "rope_scaling": _LLAMA31_ROPE,
        "tie_word_embeddings": False}),
    "llama-3.2-1b": ("meta-llama/Llama-3.2-1B config.json", {
        **_LLAMA3, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
        "rope_scaling": {**_LLAMA31_ROPE, "factor": 32.0}, "tie_word_embeddings": True}),
    "llama-3.2-3b": ("meta-llama/Llama-3.2-3B config.json", {
        **_LLAMA3, "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 28,
        "num_attention_heads": 24, "num_key_value_heads": 8, "head_dim": 128,
        "rope_scaling": {**_LLAMA31_ROPE, "factor": 32.0}, "tie_word_embeddings": True}),
    "mistral-7b": ("mistralai/Mistral-7B-v0.1 config.json", {
        "model_type": "mistral", "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
        "max_position_embeddings": 32768, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "sliding_window": 4096,
        "tie_word_embeddings": False}),
    "mistral-7b-v0.3": ("mistralai/Mistral-7B-v0.3 config.json", {
        "model_type": "mistral", "vocab_size": 32768, "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
        "max_position_embeddings": 32768, "rms_norm_eps": 1e-5, "rope_theta": 1000000.0, "sliding_window": None,
        "tie_word_embeddings": False}),
    "qwen2.5-7b": ("Qwen/Qwen2.5-7B config.json", {
        **_QWEN25, "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
        "num_attention_heads": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-6}),
    "qwen2.5-14b": ("Qwen/Qwen2.5-14B config.json", {
        **_QWEN25, "hidden_size": 5120, "intermediate_size": 13824, "num_hidden_layers": 48,
        "num_attention_heads": 40, "num_key_value_heads": 8, "rms_norm_eps": 1e-5}),
    "qwen2.5-32b": ("Qwen/Qwen2.5-32B config.json", {
        **_QWEN25, "hidden_size": 5120, "intermediate_size": 27648, "num_hidden_layers": 64,
        "num_attention_heads": 40, "num_key_value_heads": 8, "rms_norm_eps": 1e-5}),
    "qwen3-8b": ("Qwen/Qwen3-8B config.json", {
        **_QWEN3, "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
        "num_attention_heads": 32}),
    "qwen3-14b": ("Qwen/Qwen3-14B config.json", {
        **_QWEN3, "hidden_size": 5120, "intermediate_size": 17408, "num_hidden_layers": 40,
        "num_attention_heads": 40}),
    "qwen3-32b": ("Qwen/Qwen3-32B config.json", {
        **_QWEN3, "hidden_size": 5120, "intermediate_size": 25600, "num_hidden_layers": 64,
        "num_attention_heads": 64}),
    "gemma-7b": ("google/gemma-7b config.json", {
        "model_type": "gemma", "vocab_size": 256000, "hidden_size": 3072, "intermediate_size": 24576,
        "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 256,
        "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 8192, "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0, "tie_word_embeddings": True}),
    "gemma-2-9b": ("google/gemma-2-9b config.json", {
        "model_type": "gemma2", "vocab_size": 256000, "hidden_size": 3584, "intermediate_size": 14336,
        "num_hidden_layers": 42, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256,
        "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 8192, "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0, "query_pre_attn_scalar": 256, "sliding_window": 4096,
        "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0, "tie_word_embeddings": True}),
    "phi-3-mini": ("microsoft/Phi-3-mini-4k-instruct config.json", {
        "model_type": "phi3", "vocab_size": 32064, "hidden_size": 3072, "intermediate_size": 8192,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
        "max_position_embeddings": 4096, "original_max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "sliding_window": 2047, "tie_word_embeddings": False}),
    "olmo-2-7b": ("allenai/OLMo-2-1124-7B config.json", {
        "model_type": "olmo2", "vocab_size": 100352, "hidden_size": 4096, "intermediate_size": 11008,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 500000.0,
        "tie_word_embeddings": False}),
}

# Tiny versions of each family for a 2-core CPU, with the family's special case switched on at this size:
# a sliding window shorter than the tests' sequences, tied embeddings, soft-capping, q/k norms, biases.
_TINY = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 4,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 1024,
         "tie_word_embeddings": False}
TINY_FAMILIES: dict[str, JsonObject] = {
    "tiny-llama3": {**_TINY, "model_type": "llama", "tie_word_embeddings": True, "head_dim": 32},
    "tiny-mistral": {**_TINY, "model_type": "mistral", "sliding_window": 16},
    "tiny-qwen2": {**_TINY, "model_type": "qwen2"},
    "tiny-qwen3": {**_TINY, "model_type": "qwen3", "head_dim": 32, "tie_word_embeddings": True},
    "tiny-gemma": {**_TINY, "model_type": "gemma", "head_dim": 32, "tie_word_embeddings": True},
    "tiny-gemma2": {**_TINY, "model_type": "gemma2", "head_dim": 32, "query_pre_attn_scalar": 32,
                    "sliding_window": 16, "tie_word_embeddings": True},
    "tiny-phi3": {**_TINY, "model_type": "phi3"},
    "tiny-olmo2": {**_TINY, "model_type": "olmo2"},
}

PRESETS.update({name: fields for name, (_, fields) in PUBLISHED.items()})
PRESETS.update(TINY_FAMILIES)


def preset_source(name: str) -> str | None:
    """Where a published preset's sizes come from ('Qwen/Qwen3-8B config.json'), None for ckptbench's own."""
    entry = PUBLISHED.get(name)
    return entry[0] if entry else None


def preset_names() -> list[str]:
    """All preset names, sorted."""
    return sorted(PRESETS)
