"""Whether a model's resolved config fields can be built, checked without transformers (so without torch).

transformers 5 builds each family's config as a strict dataclass: a field of the wrong type (``tie_word_embeddings:
"yes"``, ``rms_norm_eps: 0``, an int where it declares a float) is refused when the model is built, and rotary
settings it cannot use fail later still, or pass with a warning (a scaling factor of -1). Every command reads a
config through here first, so they all refuse such a model the same way, in one line naming the field where the
user wrote it, before any work: the sizes (``ShapeFields``), the names and types each family's config class declares
(``FAMILY_FIELDS``, held to the installed transformers by tests/test_bad_models.py), their bounds, the rotary
embedding's settings (RoPE), and numbers that are finite and fit an int64.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, TypeGuard

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ckptbench.config.axes import _shown
from ckptbench.config.families import Family

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
MAX_INT = 2**63 - 1  # an integer field beyond int64 is no setting of a model (torch cannot hold it)

# Fields of a config.json that change neither memory nor time: kept in the run's record (model.config_fields),
# never passed to transformers (train/model.py). ckptbench's precision axis decides the dtype; the batch is random
# token ids (no padding, no special tokens); nothing is loaded, quantized or generated.
IGNORED_FIELDS = frozenset({
    "torch_dtype", "dtype", "transformers_version", "_name_or_path", "architectures", "auto_map", "use_cache",
    "bos_token_id", "eos_token_id", "pad_token_id", "quantization_config", "_attn_implementation",
    "attn_implementation", "model_type",
})

# strict: YAML's `true` or "128" is not a size; LlamaConfig would take them and fail later.
_Size = Annotated[int, Field(strict=True, ge=1, le=MAX_SIZE)]


class ShapeFields(BaseModel):
    """The fields of the resolved config that decide whether the model can be built at all."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    vocab_size: _Size
    hidden_size: _Size
    intermediate_size: _Size
    num_hidden_layers: Annotated[int, Field(strict=True, ge=1, le=MAX_LAYERS)]
    num_attention_heads: _Size
    num_key_value_heads: _Size | None = None  # None: as many as num_attention_heads (LlamaConfig's rule)
    head_dim: _Size | None = None  # None: hidden_size / num_attention_heads
    max_position_embeddings: _Size
    # The activation of the MLP, by its name in transformers' ACT2FN (an unknown one failed in every point).
    hidden_act: str = "silu"
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
        return known_activation(value)

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


def known_activation(value: str) -> str:
    """``value`` if transformers' ACT2FN knows it, else ValueError naming the closest and the allowed."""
    if value not in ACTIVATIONS:
        hint = difflib.get_close_matches(value, sorted(ACTIVATIONS), n=1)
        extra = f"; did you mean {hint[0]!r}?" if hint else ""
        raise ValueError(f"not an activation transformers knows{extra} (allowed: {', '.join(sorted(ACTIVATIONS))})")
    return value


# -- the fields each family's config class declares, typed as transformers 5 types them -------------------------
# A type is the members of its union: int (never a bool, as transformers' strict check has it), float (never an
# int: `rms_norm_eps: 0` is refused by transformers), bool, str, None, dict, list[int], list[str].

_BASE = {  # PreTrainedConfig's own fields, in every family
    "transformers_version": "str|None", "architectures": "list[str]|None", "output_hidden_states": "bool|None",
    "return_dict": "bool|None", "dtype": "str|torch.dtype|None", "chunk_size_feed_forward": "int",
    "is_encoder_decoder": "bool", "id2label": "dict|None", "label2id": "dict|None", "problem_type": "str|None",
}
_DECODER = {  # what every supported family's class declares alike
    "vocab_size": "int", "hidden_size": "int", "intermediate_size": "int", "num_hidden_layers": "int",
    "num_attention_heads": "int", "num_key_value_heads": "int|None", "hidden_act": "str",
    "max_position_embeddings": "int", "initializer_range": "float", "rms_norm_eps": "float", "use_cache": "bool",
    "pad_token_id": "int|None", "bos_token_id": "int|None", "eos_token_id": "int|list[int]|None",
    "tie_word_embeddings": "bool", "rope_parameters": "dict|None", "attention_dropout": "int|float",
}
_SLIDING = {"use_sliding_window": "bool", "sliding_window": "int|None", "max_window_layers": "int",
            "layer_types": "list[str]|None"}


@dataclass(frozen=True)
class FamilyFields:
    """The config class transformers builds a family with, and the fields (with their types) it declares."""

    class_name: str
    types: Mapping[str, str]

    @property
    def names(self) -> frozenset[str]:
        """What ``model.overrides`` may name: the declared fields, plus the ones every config's to_dict() has."""
        return frozenset(self.types) | {"_name_or_path", "model_type", "output_attentions"}


def _fields(class_name: str, **changes: str | None) -> FamilyFields:
    types = {**_BASE, **_DECODER, **changes}
    return FamilyFields(class_name, {k: v for k, v in types.items() if v is not None})


FAMILY_FIELDS: dict[str, FamilyFields] = {
    "llama": _fields("LlamaConfig", pretraining_tp="int|None", attention_bias="bool", mlp_bias="bool",
                     head_dim="int|None", attention_dropout="int|float|None"),
    "mistral": _fields("MistralConfig", num_key_value_heads="int", head_dim="int|None", sliding_window="int|None"),
    "qwen2": _fields("Qwen2Config", **_SLIDING),
    "qwen3": _fields("Qwen3Config", head_dim="int", attention_bias="bool", **_SLIDING),
    "gemma": _fields("GemmaConfig", num_key_value_heads="int", head_dim="int", attention_bias="bool",
                     use_bidirectional_attention="bool|None"),
    "gemma2": _fields("Gemma2Config", num_key_value_heads="int", head_dim="int", hidden_act=None,
                      hidden_activation="str", attention_bias="bool", attention_dropout="int|float|None",
                      query_pre_attn_scalar="int", sliding_window="int|None", layer_types="list[str]|None",
                      final_logit_softcapping="float|None", attn_logit_softcapping="float|None",
                      use_bidirectional_attention="bool|None"),
    "phi3": _fields("Phi3Config", resid_pdrop="int|float", embd_pdrop="int|float",
                    original_max_position_embeddings="int", sliding_window="int|None"),
    "olmo2": _fields("Olmo2Config", attention_bias="bool"),
}
PROBLEM_TYPES = ("regression", "single_label_classification", "multi_label_classification")
# The attention kinds a supported family's layers are built with (transformers knows more, for other models).
LAYER_TYPES = ("full_attention", "sliding_attention")

_WORDS = {"int": "an integer", "float": "a float", "bool": "true or false", "str": "a string", "None": "null",
          "dict": "a mapping", "list[int]": "a list of integers", "list[str]": "a list of strings"}


def _is(kind: str, value: Any) -> bool:
    """Whether ``value`` is of ``kind`` as transformers' strict dataclasses check it."""
    if kind.startswith("list["):
        return isinstance(value, list) and all(_is(kind[5:-1], v) for v in value)
    return {
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "float": lambda v: isinstance(v, float),
        "bool": lambda v: isinstance(v, bool),
        "str": lambda v: isinstance(v, str),
        "None": lambda v: v is None,
        "dict": lambda v: isinstance(v, dict),
    }.get(kind, lambda v: True)(value)  # torch.dtype: dtype is never passed to transformers


def _type_problem(declared: str, value: Any, class_name: str) -> str | None:
    kinds = list(dict.fromkeys(declared.split("|")))
    if any(_is(k, value) for k in kinds):
        return None
    words = " or ".join(_WORDS.get(k, k) for k in kinds)
    hint = ""
    if "float" in kinds and _is("int", value):
        hint = f" (write {_yaml_float(value)})"
    elif "float" in kinds and isinstance(value, str) and _float_text(value):
        hint = f" (YAML reads {value} as text; write {_yaml_float(float(value))})"
    return f"must be {words}, as transformers' {class_name} declares it{hint}"


def _label_id(key: Any) -> bool:
    return _is("int", key) or (isinstance(key, str) and key.isdigit() and key.isascii())


def _float_text(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def _yaml_float(value: float) -> str:
    """``value`` as YAML reads a float: a decimal point, and a signed exponent (YAML 1.1 reads 1e308 as text)."""
    mantissa, _, exponent = repr(float(value)).partition("e")
    mantissa += "" if "." in mantissa else ".0"
    return f"{mantissa}e{exponent}" if exponent else mantissa


# -- bounds: what transformers would take and the model could not train with ------------------------------------


def _between(low: float, high: float) -> Callable[[Any], str | None]:
    return lambda v: None if low <= v <= high else f"must be from {low:g} to {high:g}"


def _at_least(low: int) -> Callable[[Any], str | None]:
    return lambda v: None if v >= low else f"must be at least {low}"


def _positive(v: Any) -> str | None:
    return None if v > 0 else "must be positive"


_BOUNDS: dict[str, Callable[[Any], str | None]] = {
    "initializer_range": _between(0, 1),  # the std of the initial weights (LlamaConfig's own interval)
    "rms_norm_eps": _positive,  # added under the square root of the mean square: a small positive float
    "attention_dropout": _between(0, 1),  # probabilities
    "resid_pdrop": _between(0, 1),
    "embd_pdrop": _between(0, 1),
    "sliding_window": _at_least(1),  # tokens
    "max_window_layers": _at_least(0),
    "query_pre_attn_scalar": _at_least(1),  # Gemma-2 scales queries by its inverse square root
    "final_logit_softcapping": _positive,  # Gemma-2 divides by them
    "attn_logit_softcapping": _positive,
    "original_max_position_embeddings": _at_least(1),
    "pretraining_tp": _at_least(1),
    "chunk_size_feed_forward": _at_least(0),
}


def _value_problem(name: str, value: Any) -> str | None:
    """What is wrong with a typed field's value beyond its type, or None."""
    if value is None or isinstance(value, bool):
        return None
    bound = _BOUNDS.get(name)
    if bound is not None and isinstance(value, int | float):
        return bound(value)
    if name == "hidden_activation" and isinstance(value, str):
        try:
            known_activation(value)
        except ValueError as exc:
            return str(exc)
    if name == "layer_types" and isinstance(value, list):
        bad = next((t for t in value if t not in LAYER_TYPES), None)
        if bad is not None or not value:  # a pattern ckptbench repeats over the layers (train/model.py)
            return f"entries must be {' or '.join(LAYER_TYPES)}, at least one (got {_shown(bad if value else value)})"
    if name == "id2label" and isinstance(value, dict) and not all(_label_id(k) for k in value):
        return "keys must be label ids (integers)"
    if name == "problem_type" and value not in PROBLEM_TYPES:
        return f"must be one of {', '.join(PROBLEM_TYPES)} or null"
    return None


# -- the rotary embedding (RoPE) ---------------------------------------------------------------------------------

# The rope types a supported family's rotary embedding computes (transformers' ROPE_INIT_FUNCTIONS, less the ones
# of other models), and the keys each needs; rope_theta and original_max_position_embeddings get defaults.
ROPE_NEEDS: dict[str, tuple[str, ...]] = {
    "default": (), "linear": ("factor",), "dynamic": ("factor",), "yarn": ("factor",),
    "longrope": ("short_factor", "long_factor"), "llama3": ("factor", "low_freq_factor", "high_freq_factor"),
}
_PHI3_ROPE = ("default", "longrope")  # Phi-3's own check; it reads 'su' and 'yarn' as longrope
_ROPE_NUMBERS: dict[str, tuple[str, Callable[[float], bool]]] = {
    "rope_theta": ("must be a positive number (the base of the rotary frequencies)", lambda v: v > 0),
    "factor": ("must be at least 1 (how many times the rotary embedding stretches the context)", lambda v: v >= 1),
    "attention_factor": ("must be a positive number", lambda v: v > 0),
    "partial_rotary_factor": ("must be above 0 and at most 1 (the share of each head that rotates)",
                              lambda v: 0 < v <= 1),
    "low_freq_factor": ("must be a positive number", lambda v: v > 0),
    "high_freq_factor": ("must be a positive number", lambda v: v > 0),
    "beta_fast": ("must be a number", lambda v: True),
    "beta_slow": ("must be a number", lambda v: True),
    "mscale": ("must be a number", lambda v: True),
    "mscale_all_dim": ("must be a number", lambda v: True),
}


def _number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _rope_problems(params: Mapping[str, Any], family: Family, rotary_pairs: int) -> Iterator[tuple[str, str]]:
    """(key, what is wrong) for each problem of one rope mapping (rope_parameters or rope_scaling)."""
    nested = next((k for k, v in params.items() if isinstance(v, dict)), None)
    if nested is not None:
        yield nested, f"rope settings per layer type are not supported by {family.name}: give one mapping"
        return
    kind = params.get("rope_type", params.get("type", "default"))
    allowed = tuple(ROPE_NEEDS) if family.model_type != "phi3" else _PHI3_ROPE
    if family.model_type == "phi3" and kind in ("su", "yarn"):
        kind = "longrope"
    if kind not in allowed:
        key = "rope_type" if "rope_type" in params else "type"
        yield key, f"must be one of {', '.join(allowed)} for {family.name} (got {_shown(kind)})"
        return
    missing = [k for k in ROPE_NEEDS[kind] if params.get(k) is None]
    if missing:
        yield missing[0], f"is required by rope_type {kind}"
    for key, (words, ok) in _ROPE_NUMBERS.items():
        value = params.get(key)
        if value is not None and not (_number(value) and ok(value)):
            yield key, f"{words} (got {_shown(value)})"
    original = params.get("original_max_position_embeddings")
    if original is not None and not (_is("int", original) and original >= 1):
        yield "original_max_position_embeddings", f"must be a positive integer (got {_shown(original)})"
    if params.get("truncate") is not None and not isinstance(params["truncate"], bool):
        yield "truncate", f"must be true or false (got {_shown(params['truncate'])})"
    low, high = params.get("low_freq_factor"), params.get("high_freq_factor")
    if kind == "llama3" and _number(low) and _number(high) and high <= low:
        yield "high_freq_factor", f"must be above low_freq_factor ({low}) (got {high})"
    fast, slow = params.get("beta_fast"), params.get("beta_slow")
    if _number(fast) and _number(slow) and fast < slow:
        yield "beta_fast", f"must be at least beta_slow ({slow}) (got {fast})"
    if kind == "longrope":
        for key in ("short_factor", "long_factor"):
            value = params.get(key)
            if value is None:
                continue
            if not (isinstance(value, list) and all(_number(v) for v in value)):
                yield key, f"must be a list of numbers (got {_shown(value)})"
            elif len(value) != rotary_pairs:
                yield key, f"must hold {rotary_pairs} numbers, one per pair of rotated channels (got {len(value)})"


def _rope_checks(resolved: Mapping[str, Any], family: Family) -> Iterator[tuple[str, str]]:
    """(field path, what is wrong) for the rotary settings: config.json's rope_theta, partial_rotary_factor and
    rope_scaling (transformers 4's names), and rope_parameters (5's)."""
    for key in ("rope_theta", "partial_rotary_factor"):
        value = resolved.get(key)
        if value is not None and not (_number(value) and _ROPE_NUMBERS[key][1](value)):
            yield key, f"{_ROPE_NUMBERS[key][0]} (got {_shown(value)})"
    heads = resolved.get("num_attention_heads") or 1
    head_dim = resolved.get("head_dim") or resolved.get("hidden_size", 0) // heads
    for name in ("rope_scaling", "rope_parameters"):
        params = resolved.get(name)
        if name == "rope_scaling" and not params:
            continue  # transformers reads `rope_scaling or rope_parameters`: null, {} are nothing
        if params is None:
            continue
        if not isinstance(params, dict):
            yield name, f"must be a mapping of rotary settings or null (got {_shown(params)})"
            continue
        share = params.get("partial_rotary_factor", resolved.get("partial_rotary_factor", 1.0))
        pairs = int(head_dim * share) // 2 if _number(share) else head_dim // 2
        for key, why in _rope_problems(params, family, pairs):
            yield f"{name}.{key}", why


# -- numbers --------------------------------------------------------------------------------------------------


def _unrepresentable(value: Any, path: str) -> tuple[str, str] | None:
    """(path, why) of the first NaN, infinity or integer beyond int64 inside ``value``, or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return path, f"must be a finite number (got {value})"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
        digits = math.floor(math.log10(abs(value))) + 1
        return path, f"must be at most {MAX_INT:,} (got an integer of about {digits} digits)"
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for name, inner in items:
        found = _unrepresentable(inner, f"{path}.{name}" if path else str(name))
        if found is not None:
            return found
    return None


# -- the check -----------------------------------------------------------------------------------------------


def check_model_fields(
    resolved: Mapping[str, Any], *, family: Family, overrides: Mapping[str, Any], attn_implementation: str,
    label: Callable[[str], str],
) -> None:
    """ValueError in one line unless transformers builds ``resolved`` (a family's fields) into a model that trains.

    ``label(path)``: how the message names a field where the user wrote it ('model.overrides.rope_theta',
    'model.config: rope_theta')."""
    declared = FAMILY_FIELDS[family.model_type]
    unknown = sorted(set(overrides) - declared.names)
    if unknown:
        raise ValueError(f"model.overrides.{unknown[0]}: {_unknown_field(unknown[0], declared)}")
    bad = _unrepresentable(dict(resolved), "")
    if bad is not None:
        raise ValueError(f"{label(bad[0])}: {bad[1]}")
    _check_shape(resolved, overrides, label)
    heads = resolved["num_attention_heads"]
    if family.model_type == "gemma2" and resolved["hidden_size"] % heads:  # Gemma2Config's own rule, head_dim or not
        field = "hidden_size" if "hidden_size" in overrides or "num_attention_heads" not in overrides else \
            "num_attention_heads"
        raise ValueError(f"{label(field)}: hidden_size ({resolved['hidden_size']}) must be a multiple of "
                         f"num_attention_heads ({heads}) in {family.name}")
    for name, value in resolved.items():
        if name in IGNORED_FIELDS or name not in declared.types:
            continue
        # A number out of bounds is named before its type: 'rms_norm_eps: 0' must be positive, not only a float.
        bounded = _value_problem(name, value) if _number(value) else None
        why = bounded or _type_problem(declared.types[name], value, declared.class_name) or _value_problem(name, value)
        if why is not None:
            got = "" if "(got " in why else f" (got {_shown(value)})"
            raise ValueError(f"{label(name)}: {why}{got}")
    for path, why in _rope_checks(resolved, family):
        raise ValueError(f"{label(path)}: {why}")
    if resolved.get("output_attentions") and attn_implementation != "eager":
        raise ValueError(f"{label('output_attentions')}: returning the attention weights needs "
                         f"attn_implementation: eager (got {attn_implementation})")


def _unknown_field(name: str, declared: FamilyFields) -> str:
    if name in ("rope_theta", "rope_scaling", "partial_rotary_factor"):
        return (f"not a {declared.class_name} field: transformers 5 keeps it in rope_parameters, e.g. "
                "rope_parameters: {rope_type: default, rope_theta: 500000.0}")
    hint = difflib.get_close_matches(name, sorted(declared.names), n=1)
    extra = f"; did you mean {hint[0]!r}?" if hint else ""
    return f"not a {declared.class_name} field{extra}"


def _check_shape(resolved: Mapping[str, Any], overrides: Mapping[str, Any], label: Callable[[str], str]) -> None:
    """ValueError naming the field unless the sizes and heads can be built (ShapeFields)."""
    try:
        ShapeFields.model_validate(dict(resolved))
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
        raise ValueError(f"{label('.'.join(loc))}: {msg}{given}") from None
