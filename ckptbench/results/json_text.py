"""JSON text of a run read with a bound on nesting: a value nested thousands deep (json's RecursionError, a
crash in every reader that walks it) costs that value only, named in a note, never the run."""

from __future__ import annotations

import json
from typing import Any

from ckptbench.json_object import JsonObject

MAX_DEPTH = 64  # a record or run.json nests a few levels (plan.layers, ranks[i], searches[i].probes[j])


class TooDeep(ValueError):
    """JSON text (or a parsed value) that nests more than MAX_DEPTH levels."""


def too_deep(value: Any, *, limit: int = MAX_DEPTH) -> bool:
    """Whether ``value`` (parsed JSON) nests lists and objects more than ``limit`` levels deep."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth >= limit:
                return True
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return False


def loads_bounded(data: bytes | str) -> Any:
    """``json.loads``; TooDeep (a ValueError, as for any text that is not JSON) when it nests more than
    MAX_DEPTH levels."""
    try:
        value = json.loads(data)
    except RecursionError:
        raise TooDeep(f"nested more than {MAX_DEPTH} levels deep") from None
    # Nesting MAX_DEPTH + 1 levels takes that many opening brackets: text with fewer (a point record has about
    # ten) cannot be too deep, and the walk over every value (most of a 20,000-point run's reading) is skipped.
    opening = data.count(b"[") + data.count(b"{") if isinstance(data, bytes) else data.count("[") + data.count("{")
    if opening > MAX_DEPTH and too_deep(value):
        raise TooDeep(f"nested more than {MAX_DEPTH} levels deep")
    return value


def loads_object_fields(text: str) -> tuple[JsonObject, list[str]]:
    """A JSON object's fields, each parsed on its own: a field nested too deep is left out and named in
    the second value. ValueError when the text is not a JSON object at all."""
    try:
        whole = json.loads(text)
    except RecursionError:
        return _fields_one_by_one(text)
    if not isinstance(whole, dict):
        return whole, []  # the caller says what it expected
    deep = [name for name, value in whole.items() if too_deep(value, limit=MAX_DEPTH - 1)]
    return {k: v for k, v in whole.items() if k not in deep}, deep


def _fields_one_by_one(text: str) -> tuple[JsonObject, list[str]]:
    decoder = json.JSONDecoder()
    fields: JsonObject = {}
    deep: list[str] = []
    i = _skip_space(text, 0)
    if text[i : i + 1] != "{":
        raise ValueError("not a JSON object")
    i = _skip_space(text, i + 1)
    while text[i : i + 1] != "}":
        if text[i : i + 1] != '"':
            raise ValueError("expected a field name")
        name, i = decoder.raw_decode(text, i)  # a string: flat, no recursion
        i = _skip_space(text, i)
        if text[i : i + 1] != ":":
            raise ValueError("expected ':' after a field name")
        start = _skip_space(text, i + 1)
        stop = _value_end(text, start)
        try:
            fields[name] = loads_bounded(text[start:stop])
        except ValueError:
            deep.append(name)
        i = _skip_space(text, stop)
        if text[i : i + 1] == ",":
            i = _skip_space(text, i + 1)
        elif text[i : i + 1] != "}":
            raise ValueError("expected ',' or '}' after a field")
    return fields, deep


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def _value_end(text: str, i: int) -> int:
    """Where the JSON value starting at ``i`` ends: brackets counted outside strings, no recursion."""
    depth, in_string, escaped = 0, False, False
    for j in range(i, len(text)):
        c = text[j]
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
                if depth == 0:
                    return j + 1
        elif c == '"':
            in_string = True
        elif c in "[{":
            depth += 1
        elif c in "]}":
            if depth == 0:
                return j  # the enclosing object's end: a scalar value ended before it
            depth -= 1
            if depth == 0:
                return j + 1
        elif c == "," and depth == 0:
            return j
    raise ValueError("the text ends inside a value")
