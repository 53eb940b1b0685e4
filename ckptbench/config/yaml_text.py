"""YAML text -> plain data, safely: only plain types, duplicate keys refused, expanded size bounded. No torch.

PyYAML's safe loader builds plain data only, but it keeps two surprises this module removes:

- a key given twice in one mapping silently keeps the last value (``name: a`` ... ``name: b``);
- aliases share one object, so seven levels of ten aliases (a 547-byte file) are ten million values
  once anything walks them (validation, JSON, a point key). :func:`check_expanded_size` counts a
  shared part each time it appears, in time proportional to the distinct parts, and stops at a bound.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import yaml
from yaml.constructor import ConstructorError

from ckptbench.errors import ConfigError

# A real config has a few hundred values; 100,000 explicit points of a few fields stay well below.
MAX_NODES = 2_000_000
MAX_CHARS = 32 * 2**20  # characters of all strings (keys included), aliases counted each time
MAX_DEPTH = 64

_Base: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's parser when present: 10x faster


class UniqueKeyLoader(_Base):
    """A safe loader that refuses a key given twice in one mapping, at any depth, with both lines."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first_line: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # '<<: *base' then overriding a key is the point
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                line = first_line.get(key)
            except TypeError:  # an unhashable key: the safe constructor refuses it with its own message
                continue
            if line is not None:
                raise ConstructorError(
                    None, None, f"duplicate key {key!r} (first given on line {line})", key_node.start_mark
                )
            first_line[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def read_yaml(text: str) -> Any:
    """Parse YAML text into plain data (yaml.YAMLError on syntax errors and duplicate keys)."""
    return yaml.load(text, Loader=UniqueKeyLoader)  # a safe loader: plain types only


def check_expanded_size(data: Any, *, source: str) -> None:
    """ConfigError unless ``data``, with every shared (aliased) part counted each time, stays within the
    bounds; a part that contains itself (a recursive alias) is refused too."""
    memo: dict[int, tuple[int, int]] = {}
    active: set[int] = set()

    def size(value: Any, path: str, depth: int) -> tuple[int, int]:
        if isinstance(value, str):
            return 1, len(value)
        if not isinstance(value, dict | list | tuple | set | frozenset):
            return 1, 0
        ident = id(value)
        if ident in memo:
            return memo[ident]
        where = path or "(top level)"
        if ident in active:
            raise ConfigError(f"{source}: {where}: a YAML alias refers to itself (an endless value)")
        if depth > MAX_DEPTH:
            raise ConfigError(f"{source}: {where}: nested more than {MAX_DEPTH} levels deep")
        active.add(ident)
        nodes, chars = 1, 0
        for item, inner in _children(value, path):
            more_nodes, more_chars = size(item, inner, depth + 1)
            nodes, chars = nodes + more_nodes, chars + more_chars
            if nodes > MAX_NODES or chars > MAX_CHARS:
                raise ConfigError(
                    f"{source}: {where}: expands to more than {MAX_NODES:,} values or {MAX_CHARS // 2**20} MiB "
                    "of text (YAML aliases are counted each time they are used); a config is far smaller"
                )
        active.discard(ident)
        memo[ident] = (nodes, chars)
        return nodes, chars

    size(data, "", 0)


def _children(value: Any, path: str) -> Iterator[tuple[Any, str]]:
    """The parts of a container with their dotted paths (a mapping's keys count as parts too)."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield key, path
            yield item, f"{path}.{key}" if path else str(key)
    else:
        for i, item in enumerate(value):
            yield item, f"{path}.{i}" if path else str(i)
