"""``json.dumps(value, indent=2, sort_keys=True)``, the same text, several times faster on large documents.

With an indent, the standard library encodes in pure Python, one generator per container; a comparison
of 20,000 points is millions of values. Here every container whose items are all plain scalars (the
bulk: a point's key, a metric) is encoded by the standard library's C encoder, with the item separator
carrying the newline and the indent of its level; only the containers above them are walked in Python.
The C and the Python encoders write scalars alike (``float.__repr__``, ``int.__repr__``, NaN/Infinity,
ASCII-escaped strings) and sort keys alike (``sorted(dict.items())``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

_INDENT = "  "
# Exact types the C encoder writes as the pure-Python one does with no container inside.
_SCALARS = frozenset({str, int, float, bool, type(None)})
_STR = frozenset({str})
_encoders: dict[str, Callable[[Any], str]] = {}
_ascii: Callable[[str], str] = json.encoder.encode_basestring_ascii  # what the encoders write strings with


def _flat_encoder(newline: str) -> Callable[[Any], str]:
    """The encoder whose item separator is ',' plus the newline and indent of one level: the C encoder
    made once per level (``JSONEncoder.encode`` would make it again at every call)."""
    enc = _encoders.get(newline)
    if enc is None:
        std = json.JSONEncoder(sort_keys=True, separators=("," + newline, ": "), check_circular=False)
        make = getattr(json.encoder, "c_make_encoder", None)
        if make is None:  # no C accelerator: the standard encoder, same text
            enc = std.encode
        else:
            c_encode = make(None, std.default, json.encoder.encode_basestring_ascii, None, ": ",
                            "," + newline, True, False, True)

            def enc(value: Any, c_encode: Any = c_encode, std: json.JSONEncoder = std) -> str:
                if isinstance(value, str):
                    return std.encode(value)
                return "".join(c_encode(value, 0))
        _encoders[newline] = enc
    return enc


Convert = Callable[[Any], Any]


def dumps_indented(value: Any, *, convert: Convert | None = None) -> str:
    """Exactly ``json.dumps(value, indent=2, sort_keys=True)`` (TypeError/ValueError as it raises them);
    ``convert``: what each value that is neither a container nor a scalar (a dataclass) is written as, when it
    is met (a dict or list, its own values converted the same way): no converted copy of the whole document."""
    parts: list[str] = []
    _encode(value, "\n", parts, convert)
    return "".join(parts)


def _encode(value: Any, newline: str, parts: list[str], convert: Convert | None = None) -> None:
    """Append the text of ``value`` at the level whose line break and indent is ``newline``."""
    if isinstance(value, dict):
        _encode_dict(value, newline, parts, convert)
    elif isinstance(value, list | tuple):
        _encode_list(value, newline, parts, convert)
    elif convert is not None and type(value) not in _SCALARS:
        _encode(convert(value), newline, parts, convert)
    else:  # a scalar (or what the standard encoder refuses, refused the same way)
        parts.append(_flat_encoder(newline)(value))


def _encode_dict(value: dict[Any, Any], newline: str, parts: list[str], convert: Convert | None = None) -> None:
    if not value:
        parts.append("{}")
        return
    inner = newline + _INDENT
    # (set.issuperset over map(type, ...): the all(...) of a generator, without a Python frame per item)
    if _STR.issuperset(map(type, value)) and _SCALARS.issuperset(map(type, value.values())):
        text = _flat_encoder(inner)(value)  # '{"a": 1,<inner>"b": 2}'
        parts.append("{" + inner + text[1:-1] + newline + "}")
        return
    sep = "{" + inner
    for key, item in sorted(value.items()):  # as the standard encoder (TypeError on keys that do not compare)
        kind = type(item)
        if kind is str:  # the most common value: straight to the C string encoder
            parts.append(sep + _key_text(key) + ": " + _ascii(item))
        elif kind in _SCALARS:
            parts.append(sep + _key_text(key) + ": " + _flat_encoder(inner)(item))
        else:
            parts.append(sep + _key_text(key) + ": ")
            _encode(item, inner, parts, convert)
        sep = "," + inner
    parts.append(newline + "}")


def _encode_list(
    value: list[Any] | tuple[Any, ...], newline: str, parts: list[str], convert: Convert | None = None
) -> None:
    if not value:
        parts.append("[]")
        return
    inner = newline + _INDENT
    if _SCALARS.issuperset(map(type, value)):
        text = _flat_encoder(inner)(list(value))
        parts.append("[" + inner + text[1:-1] + newline + "]")
        return
    sep = "[" + inner
    for item in value:
        parts.append(sep)
        _encode(item, inner, parts, convert)
        sep = "," + inner
    parts.append(newline + "]")


def _key_text(key: Any) -> str:
    """A dict key as the standard encoder writes it (strings as they are, numbers and constants as text)."""
    if type(key) is str:
        return _ascii(key)
    if isinstance(key, str):
        return json.encoder.encode_basestring_ascii(key)
    # float keys as floats are written, True/False/None as JSON constants, ints as ints: then quoted
    if key is True or key is False or key is None or isinstance(key, int | float):
        return json.encoder.encode_basestring_ascii(json.dumps(key))
    raise TypeError(f"keys must be str, int, float, bool or None, not {key.__class__.__name__}")
