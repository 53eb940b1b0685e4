"""Which model to build: a preset or a checkpoint's config.json, plus config overrides, and the checks that
the result can be built.

The resolved model (preset or config.json, then overrides) is checked here, before anything runs: a supported
architecture (config/families.py), positive sizes, attention heads that divide the hidden size, key/value heads
that divide the attention heads, finite numbers. Other fields are checked by transformers when the runner
builds the config. No torch.
"""

from __future__ import annotations

import difflib
import json
import math
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from ckptbench.config.axes import AttnImpl, _shown, _Strict
from ckptbench.config.families import DEFAULT_MODEL_TYPE, FAMILIES, Family, family_of
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


MAX_CONFIG_JSON_BYTES = 4 * 2**20  # a config.json is a few KiB
# The validation context key holding the folder a relative model.config path is read from (config/load.py
# sets it to the YAML file's folder; without it, the working directory).
CONFIG_DIR = "ckptbench_config_dir"
DEFAULT_PRESET = "llama-7b"


def read_config_json(path: str, *, base: Path | None) -> dict[str, Any]:
    """The fields of a checkpoint's config.json (a local file), or ValueError in one line."""
    p = Path(path).expanduser()
    where = p if p.is_absolute() or base is None else base / p
    try:
        if where.is_file() and where.stat().st_size > MAX_CONFIG_JSON_BYTES:
            raise ValueError(f"model.config: {path} is larger than {MAX_CONFIG_JSON_BYTES // 2**20} MiB; "
                             "a config.json is a few KiB")
        data = json.loads(where.read_text(encoding="utf-8"))
    except FileNotFoundError:
        hint = f" (relative paths are read from {base})" if base is not None and not p.is_absolute() else ""
        raise ValueError(f"model.config: no such file {path!r}{hint}") from None
    except IsADirectoryError:
        raise ValueError(f"model.config: {path} is a directory; name its config.json") from None
    except UnicodeDecodeError:
        raise ValueError(f"model.config: {path} is not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"model.config: {path} is not JSON (line {exc.lineno}: {exc.msg})") from None
    except OSError as exc:
        raise ValueError(f"model.config: cannot read {path} ({exc.__class__.__name__}: {exc.strerror})") from None
    if not isinstance(data, dict):
        raise ValueError(f"model.config: {path} must hold a JSON object of config fields, got {type(data).__name__}")
    return data


class ModelSpec(_Strict):
    """Which model to build: a preset or a checkpoint's config.json, plus optional config field overrides."""

    # A built-in preset (config/presets.py); the default when no config is given.
    preset: str | None = DEFAULT_PRESET
    # A checkpoint's config.json (a local file; relative to the YAML file's folder). Its fields are read when the
    # config is loaded and stored in config_fields, so a run never needs the file again.
    config: str | None = None
    # The config.json's fields (read from `config`, or written inline). Fields that do not matter to memory or
    # time (torch_dtype, transformers_version, _name_or_path, architectures, token ids) are kept as a record
    # and ignored when the model is built (train/model.py).
    config_fields: dict[str, Any] | None = None
    # Any field of the family's transformers config, for example {num_hidden_layers: 16}; sizes and head counts
    # are checked here (check_model_shape), everything else by transformers when the sweep starts.
    overrides: dict[str, Any] = Field(default_factory=dict)
    # 'sdpa' (PyTorch scaled_dot_product_attention) or 'eager' (materialises the S x S attention matrix).
    attn_implementation: AttnImpl = "sdpa"

    @model_validator(mode="before")
    @classmethod
    def _read_config(cls, data: Any, info: ValidationInfo) -> Any:
        if not isinstance(data, dict) or ("config" not in data and "config_fields" not in data):
            return data
        data = dict(data)
        if data.get("preset") is not None:
            raise ValueError("model: give either a preset or a config (a config.json), not both")
        data["preset"] = None
        path = data.get("config")
        if data.get("config_fields") is None:
            if not isinstance(path, str) or not path:
                raise ValueError(f"model.config: must be the path of a config.json (got {_shown(path)})")
            base = (info.context or {}).get(CONFIG_DIR)
            data["config_fields"] = read_config_json(path, base=Path(base) if base is not None else None)
        return data

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # A preset's spec dumps as it did before config.json models existed: run.json stays the same.
        out: dict[str, Any] = handler(self)
        return {k: v for k, v in out.items() if not (k in ("config", "config_fields") and v is None)}

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, value: str | None) -> str | None:
        if value is not None and value not in PRESETS:
            hint = difflib.get_close_matches(value, preset_names(), n=1)
            extra = f" (did you mean {hint[0]!r}?)" if hint else ""
            raise ValueError(f"unknown preset{extra}; allowed: {', '.join(preset_names())}")
        return value

    @field_validator("overrides")
    @classmethod
    def _same_architecture(cls, value: dict[str, Any]) -> dict[str, Any]:
        if "model_type" in value:
            raise ValueError("model_type cannot be overridden: the architecture is the preset's or the config.json's")
        return value

    @model_validator(mode="after")
    def _supported(self) -> ModelSpec:
        try:
            family = family_of(self.resolved())
        except ValueError as exc:
            raise ValueError(f"model.{'preset' if self.preset is not None else 'config'}: {exc}") from None
        if self.attn_implementation not in family.attention:
            raise ValueError(attention_refusal(family, self.attn_implementation, "model.attn_implementation"))
        return self

    def resolved(self) -> dict[str, Any]:
        """The preset's (or config.json's) fields with the overrides applied."""
        base = PRESETS[self.preset] if self.preset is not None else self.config_fields or {}
        return {**base, **self.overrides}

    @property
    def family(self) -> Family:
        """The model's family (config/families.py)."""
        return FAMILIES[self.architecture]

    @property
    def architecture(self) -> str:
        """The transformers model_type: 'llama', 'qwen3', ... (part of every point's key)."""
        return str(self.resolved().get("model_type", DEFAULT_MODEL_TYPE))

    @property
    def num_layers(self) -> int:
        return int(self.resolved()["num_hidden_layers"])

    @property
    def name(self) -> str:
        """The model's name in point keys: the preset (or the config.json's folder), marked when overridden."""
        base = self.preset if self.preset is not None else self._config_label()
        if not self.overrides:
            return base
        return base + "+" + ",".join(f"{k}={v}" for k, v in sorted(self.overrides.items()))

    def _config_label(self) -> str:
        """'Qwen3-8B' for .../Qwen3-8B/config.json, 'my-model' for my-model.json; inline: its _name_or_path."""
        if self.config:
            path = Path(self.config)
            return (path.parent.name if path.name == "config.json" and path.parent.name else path.stem) or "config"
        named = (self.config_fields or {}).get("_name_or_path")
        if isinstance(named, str) and named.strip("/"):
            return named.rstrip("/").split("/")[-1]
        return self.architecture


def attention_refusal(family: Family, impl: str, where: str) -> str:
    """The one-line refusal of an attention implementation the family's code does not support."""
    why = family.special.split(",")[0]
    return f"{where}: {impl} is not supported by {family.name} ({family.model_type}: {why}); " \
        f"use {' or '.join(family.attention)}"


class LoraSpec(_Strict):
    """LoRA settings shared by every 'r<rank>' point."""

    target_modules: list[str] = Field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"], min_length=1)
    alpha: float = Field(default=16.0, gt=0)
