"""Which model to build: a preset or a checkpoint's config.json, plus config overrides, and the checks that
the result can be built.

The resolved model (preset or config.json, then overrides) is checked here, before anything runs, whichever command
reads it: a supported architecture (config/families.py) and attention, then the fields as transformers' config
class takes them (config/model_fields.py: sizes and heads, each declared field's type and bounds, the rotary
settings, finite numbers), each error naming the field where it was written (``model.overrides.FIELD`` or
``model.config: FIELD``). A config.json is read bounded, a regular file only (config/files.py). No torch.
"""

from __future__ import annotations

import difflib
import json
import sys
from pathlib import Path
from typing import Any

from pydantic import (
    Field,
    SerializerFunctionWrapHandler,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from ckptbench.config.axes import AttnImpl, _shown, _Strict
from ckptbench.config.families import DEFAULT_MODEL_TYPE, FAMILIES, Family, family_of
from ckptbench.config.files import read_bounded_text
from ckptbench.config.model_fields import check_model_fields
from ckptbench.config.presets import PRESETS, preset_names
from ckptbench.errors import ConfigError
from ckptbench.json_object import JsonObject

MAX_CONFIG_JSON_BYTES = 4 * 2**20  # a config.json is a few KiB
# The validation context key holding the folder a relative model.config path is read from (config/load.py
# sets it to the YAML file's folder; without it, the working directory).
CONFIG_DIR = "ckptbench_config_dir"
DEFAULT_PRESET = "llama-7b"


def read_config_json(path: str, *, base: Path | None) -> JsonObject:
    """The fields of a checkpoint's config.json (a local regular file, at most MAX_CONFIG_JSON_BYTES), or
    ValueError in one line: a FIFO, a device (/dev/zero) or a huge file is refused before it is read."""
    p = Path(path).expanduser()
    where = p if p.is_absolute() or base is None else base / p
    try:
        text = read_bounded_text(where, limit_bytes=MAX_CONFIG_JSON_BYTES, what="a config.json", error=ConfigError)
    except ConfigError as exc:
        raise ValueError(f"model.config: {exc}") from None
    except FileNotFoundError:
        hint = f" (relative paths are read from {base})" if base is not None and not p.is_absolute() else ""
        raise ValueError(f"model.config: no such file {path!r}{hint}") from None
    except OSError as exc:
        raise ValueError(f"model.config: cannot read {path} ({exc.__class__.__name__}: {exc.strerror})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"model.config: {path} is not JSON (line {exc.lineno}: {exc.msg})") from None
    except (ValueError, RecursionError):  # an integer past Python's digit limit; arrays nested thousands deep
        raise ValueError(f"model.config: {path} is not a config.json: it holds an integer of more than "
                         f"{sys.get_int_max_str_digits():,} digits or values nested too deep") from None
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
    config_fields: JsonObject | None = None
    # Any field of the family's transformers config, for example {num_hidden_layers: 16}; checked as transformers
    # takes it (config/model_fields.py) when the config is read.
    overrides: JsonObject = Field(default_factory=dict)
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
    def _dump(self, handler: SerializerFunctionWrapHandler) -> JsonObject:
        # A preset's spec dumps as it did before config.json models existed: run.json stays the same.
        out: JsonObject = handler(self)
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
    def _same_architecture(cls, value: JsonObject) -> JsonObject:
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
        check_model_fields(self.resolved(), family=family, overrides=self.overrides,
                           attn_implementation=self.attn_implementation, label=self.field_label)
        return self

    def field_label(self, path: str) -> str:
        """How an error names the model field ``path`` where it was written: 'model.overrides.rope_theta',
        'model.config: rope_theta' (a config.json), 'model.config_fields.rope_theta' (fields given inline)."""
        if path.split(".")[0] in self.overrides:
            return f"model.overrides.{path}"
        if self.preset is not None:
            return f"model.preset: {self.preset}'s {path}"
        return f"model.config: {path}" if self.config else f"model.config_fields.{path}"

    def resolved(self) -> JsonObject:
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


# -- what a point asks of the model: bounded work, LoRA adapters that exist and fit ----------------------------

# Hardware FLOPs of one step are stored in every record as an int64, and tensors made from batch x seq x vocab
# count their elements in int64: a step whose FLOPs (bounded above) fit an int64 keeps every product within it.
MAX_STEP_FLOPS = 2**63 - 1


def _dims(resolved: JsonObject) -> dict[str, int]:
    d, heads = int(resolved["hidden_size"]), int(resolved["num_attention_heads"])
    head_dim = int(resolved.get("head_dim") or d // heads)
    return {"d": d, "ff": int(resolved["intermediate_size"]), "vocab": int(resolved["vocab_size"]),
            "layers": int(resolved["num_hidden_layers"]), "q": heads * head_dim,
            "kv": int(resolved.get("num_key_value_heads") or heads) * head_dim}


def step_flops_bound(resolved: JsonObject, *, tokens: int, seq_len: int) -> int:
    """An upper bound of the hardware FLOPs of one step over ``tokens`` tokens (train/flops.py's count: 6N per
    token, attention scores, one more forward of everything recomputed, the LM head once more)."""
    n = _dims(resolved)
    layer = n["d"] * (2 * n["q"] + 2 * n["kv"]) + 3 * n["d"] * n["ff"] + 2 * n["d"]
    params = n["layers"] * layer + n["d"] * n["vocab"]
    return tokens * (10 * params + 16 * n["layers"] * max(n["d"], n["q"]) * seq_len)


# The modules of transformers' LlamaForCausalLM that LoRA can adapt (peft wraps Linear and Embedding layers),
# with (in, out) features; peft matches a target by the module's name or a dotted suffix of it.
_LORA_MODULES = {
    "q_proj": ("self_attn", "d", "q"), "k_proj": ("self_attn", "d", "kv"), "v_proj": ("self_attn", "d", "kv"),
    "o_proj": ("self_attn", "q", "d"), "gate_proj": ("mlp", "d", "ff"), "up_proj": ("mlp", "d", "ff"),
    "down_proj": ("mlp", "ff", "d"),
}


def _lora_width(target: str, n: dict[str, int]) -> int | None:
    """The smaller side of the module ``target`` names (a name or dotted suffix), or None when no module of
    the model has that name."""
    parts = target.split(".")
    if target in ("lm_head", "embed_tokens", "model.embed_tokens"):
        return min(n["d"], n["vocab"])
    if parts[-1] not in _LORA_MODULES:
        return None
    parent, a, b = _LORA_MODULES[parts[-1]]
    full = ["model", "layers", "<i>", parent, parts[-1]]
    prefix = parts[:-1]
    for i in range(len(full) - 1):  # the suffix must be a tail of model.layers.<i>.<parent>.<name>
        tail = full[i:-1]
        if len(tail) == len(prefix) and all(
            want == got or (want == "<i>" and got.isdigit() and int(got) < n["layers"]) for want, got in zip(
                tail, prefix, strict=True)
        ):
            return min(n[a], n[b])
    return min(n[a], n[b]) if not prefix else None


def check_lora(resolved: JsonObject, targets: list[str], ranks: list[int]) -> None:
    """ValueError('lora.target_modules...' or a rank too large) unless every target names a module of the
    model that LoRA can adapt and every rank is at most the smallest width among the targets."""
    n = _dims(resolved)
    widths: dict[str, int] = {}
    for i, target in enumerate(targets):
        width = _lora_width(target, n)
        if width is None:
            known = sorted([*_LORA_MODULES, "lm_head", "embed_tokens"])
            hint = difflib.get_close_matches(target.split(".")[-1], known, n=1)
            extra = f"; did you mean {hint[0]!r}?" if hint else ""
            raise ValueError(
                f"lora.target_modules.{i}: {_shown(target)} names no module of the model that LoRA can adapt"
                f"{extra} (allowed: {', '.join(known)}, or a dotted path ending in one)"
            )
        widths[target] = width
    for rank in ranks:
        target, width = min(widths.items(), key=lambda kv: kv[1])
        if rank > width:
            raise ValueError(
                f"r{rank}: a LoRA rank above the width of {target} ({width}) adds nothing but memory; "
                f"use at most r{width}"
            )
