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

# transformers' ACT2FN names (5.x; tests/test_robust_inputs.py holds this list to the installed one).
ACTIVATIONS = frozenset({
    "gelu", "gelu_10", "gelu_accurate", "gelu_fast", "gelu_new", "gelu_python", "gelu_python_tanh",
    "gelu_pytorch_tanh", "hardswish", "laplace", "leaky_relu", "linear", "mish", "prelu", "quick_gelu", "relu",
    "relu2", "relu6", "sigmoid", "silu", "sqrtsoftplus", "swish", "tanh", "xielu",
})
MAX_LAYERS = 4096  # far above any real LLaMA; keeps layout expansion cheap for absurd inputs
# Far above any real model (LLaMA-3 405B: hidden 16384, vocab 128256) and far below where a tensor's
# element count overflows int64 (a size of 10**25 would only fail inside torch, in every point).
MAX_SIZE = 2**24

# strict: YAML's `true` or "128" is not a size; LlamaConfig would take them and fail later.
_Size = Annotated[int, Field(strict=True, ge=1, le=MAX_SIZE)]


class ShapeFields(BaseModel):
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
    # The activation of the MLP, by its name in transformers' ACT2FN (an unknown one failed in every point).
    hidden_act: str = "silu"
    attention_dropout: float = Field(default=0.0, ge=0, le=1)  # a probability (2.0 failed at the first step)
    # The embedding's padding row: a token of the vocabulary, or None (out of it, building the model failed).
    pad_token_id: Annotated[int, Field(strict=True, ge=0)] | None = None
    # The training step reads the loss from the model's output object: a tuple (False) has no .loss.
    return_dict: bool = True

    @field_validator("return_dict")
    @classmethod
    def _output_object(cls, value: bool) -> bool:
        if not value:
            raise ValueError("must be true: the training step reads the loss from the model's output object")
        return value

    @field_validator("hidden_act")
    @classmethod
    def _known_activation(cls, value: str) -> str:
        if value not in ACTIVATIONS:
            hint = difflib.get_close_matches(value, sorted(ACTIVATIONS), n=1)
            extra = f"; did you mean {hint[0]!r}?" if hint else ""
            raise ValueError(f"not an activation transformers knows{extra} (allowed: {', '.join(sorted(ACTIVATIONS))})")
        return value

    @model_validator(mode="after")
    def _heads_fit(self) -> ShapeFields:
        heads, kv = self.num_attention_heads, self.num_key_value_heads or self.num_attention_heads
        if self.head_dim is None and self.hidden_size % heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be a multiple of num_attention_heads ({heads})"
            )
        if heads % kv:
            raise ValueError(f"num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({kv})")
        if (self.head_dim or self.hidden_size // heads) % 2:  # rotary embeddings rotate pairs of channels
            raise ValueError(f"the head size ({self.head_dim or self.hidden_size // heads}) must be even")
        if self.pad_token_id is not None and self.pad_token_id >= self.vocab_size:
            raise ValueError(
                f"pad_token_id ({self.pad_token_id}) must be a token of the vocabulary (below vocab_size "
                f"{self.vocab_size}) or null"
            )
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
        ShapeFields.model_validate(resolved)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = [str(x) for x in err.get("loc", ())]
        msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
        if not loc and msg.startswith("pad_token_id"):
            loc = ["pad_token_id"]
        if not loc:  # the heads check: name the field the user changed
            heads_fields = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim")
            loc = [next((f for f in heads_fields if f in overrides), "num_attention_heads")]
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


# -- what a point asks of the model: bounded work, LoRA adapters that exist and fit ----------------------------

# Hardware FLOPs of one step are stored in every record as an int64, and tensors made from batch x seq x vocab
# count their elements in int64: a step whose FLOPs (bounded above) fit an int64 keeps every product within it.
MAX_STEP_FLOPS = 2**63 - 1


def _dims(resolved: dict[str, Any]) -> dict[str, int]:
    d, heads = int(resolved["hidden_size"]), int(resolved["num_attention_heads"])
    head_dim = int(resolved.get("head_dim") or d // heads)
    return {"d": d, "ff": int(resolved["intermediate_size"]), "vocab": int(resolved["vocab_size"]),
            "layers": int(resolved["num_hidden_layers"]), "q": heads * head_dim,
            "kv": int(resolved.get("num_key_value_heads") or heads) * head_dim}


def step_flops_bound(resolved: dict[str, Any], *, tokens: int, seq_len: int) -> int:
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


def check_lora(resolved: dict[str, Any], targets: list[str], ranks: list[int]) -> None:
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
