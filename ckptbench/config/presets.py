"""Model presets as plain LlamaConfig keyword dicts (pure data: no torch import)."""

from __future__ import annotations

from typing import Any

_LLAMA1 = {"vocab_size": 32000, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False}

PRESETS: dict[str, dict[str, Any]] = {
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


def preset_names() -> list[str]:
    """All preset names, sorted."""
    return sorted(PRESETS)
