"""Which LLaMA to build: a preset plus LlamaConfig overrides, and the checks that the result can be built.

The resolved model (preset + overrides) is checked here, before anything runs: positive sizes, attention
heads that divide the hidden size, key/value heads that divide the attention heads, finite numbers. Other
LlamaConfig fields are checked by transformers when the runner builds the config. No torch.
"""

from __future__ import annotations

import difflib
import math
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ckptbench.config.axes import AttnImpl, _shown, _Strict
from ckptbench.config.presets import PRESETS, preset_names

MAX_LAYERS = 4096  # far above any real LLaMA; keeps layout expansion cheap for absurd inputs
# Far above any real model (LLaMA-3 405B: hidden 16384, vocab 128256) and far below where a tensor's
# element count overflows int64 (a size of 10**25 would only fail inside torch, in every point).
MAX_SIZE = 2**24

# strict: YAML's `true` or "128" is not a size; LlamaConfig would take them and fail later.
_Size = Annotated[int, Field(strict=True, ge=1, le=MAX_SIZE)]


class LlamaShape(BaseModel):
    """The fields of the resolved LlamaConfig that decide whether the model can be built at all."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    vocab_size: _Size
    hidden_size: _Size
    intermediate_size: _Size
    num_hidden_layers: Annotated[int, Field(strict=True, ge=1, le=MAX_LAYERS)]
    num_attention_heads: _Size
    num_key_value_heads: _Size | None = None  # None: as many as num_attention_heads (LlamaConfig's rule)
    head_dim: _Size | None = None  # None: hidden_size / num_attention_heads
    max_position_embeddings: _Size
    initializer_range: float = Field(default=0.02, ge=0)  # the std of the initial weights

    @model_validator(mode="after")
    def _heads_fit(self) -> LlamaShape:
        heads, kv = self.num_attention_heads, self.num_key_value_heads or self.num_attention_heads
        if self.head_dim is None and self.hidden_size % heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be a multiple of num_attention_heads ({heads})"
            )
        if heads % kv:
            raise ValueError(f"num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({kv})")
        if (self.head_dim or self.hidden_size // heads) % 2:  # rotary embeddings rotate pairs of channels
            raise ValueError(f"the head size ({self.head_dim or self.hidden_size // heads}) must be even")
        return self


def _non_finite(value: Any, path: str) -> str | None:
    """The dotted path of the first NaN or infinity inside ``value``, or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return path
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for name, inner in items:
        found = _non_finite(inner, f"{path}.{name}")
        if found is not None:
            return found
    return None


def check_model_shape(resolved: dict[str, Any], overrides: dict[str, Any]) -> None:
    """Raise ValueError('model.overrides.FIELD: ...') unless the resolved model can be built."""
    bad = _non_finite(overrides, "model.overrides")
    if bad is not None:
        raise ValueError(f"{bad}: must be a finite number")
    try:
        LlamaShape.model_validate(resolved)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = [str(x) for x in err.get("loc", ())]
        if not loc:  # the heads check: name the field the user changed
            heads_fields = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim")
            loc = [next((f for f in heads_fields if f in overrides), "num_attention_heads")]
        msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
        given = f" (got {_shown(err.get('input'))})" if err.get("loc") else ""
        raise ValueError(f"model.overrides.{'.'.join(loc)}: {msg}{given}") from None


class ModelSpec(_Strict):
    """Which LLaMA to build: a preset plus optional LlamaConfig field overrides."""

    preset: str = "llama-7b"
    # Any LlamaConfig field, for example {num_hidden_layers: 16}; sizes and head counts are checked
    # here (check_model_shape), everything else by LlamaConfig when the sweep starts.
    overrides: dict[str, Any] = Field(default_factory=dict)
    # 'sdpa' (PyTorch scaled_dot_product_attention) or 'eager' (materialises the S x S attention matrix).
    attn_implementation: AttnImpl = "sdpa"

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, value: str) -> str:
        if value not in PRESETS:
            hint = difflib.get_close_matches(value, preset_names(), n=1)
            extra = f" (did you mean {hint[0]!r}?)" if hint else ""
            raise ValueError(f"unknown preset{extra}; allowed: {', '.join(preset_names())}")
        return value

    def resolved(self) -> dict[str, Any]:
        """The preset's fields with the overrides applied."""
        return {**PRESETS[self.preset], **self.overrides}

    @property
    def num_layers(self) -> int:
        return int(self.resolved()["num_hidden_layers"])

    @property
    def name(self) -> str:
        """The model's name in point keys: the preset, marked when overridden."""
        if not self.overrides:
            return self.preset
        return self.preset + "+" + ",".join(f"{k}={v}" for k, v in sorted(self.overrides.items()))


class LoraSpec(_Strict):
    """LoRA settings shared by every 'r<rank>' point."""

    target_modules: list[str] = Field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"], min_length=1)
    alpha: float = Field(default=16.0, gt=0)
