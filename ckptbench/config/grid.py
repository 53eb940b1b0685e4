"""The grid: points (one cell each, identified by its key) expanded from axis values. Pure data."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from ckptbench.config.parallel import world_size


@dataclass(frozen=True)
class Axis:
    """One axis of a point: its name, the type of its values, and (a technique axis) the value that means
    plain training; ``plain`` None: an axis of the cell itself (model, layout, shape, precision). ``absent``:
    what a key written before the axis existed means, for a cell axis added later (a technique axis's is
    its plain value)."""

    name: str
    kind: type
    plain: Any = None
    absent: Any = None


# Every axis of a point, once, in the order of ``Point.key``; ``Point``'s fields are these (tests/test_axes.py
# holds them to it), in the order a positional ``Point(...)`` takes them.
KEY_AXES: tuple[Axis, ...] = (
    Axis("model", str),
    # The model's transformers model_type ('llama', 'qwen3', ...): compare never matches points of two
    # architectures. Runs written before it existed built LLaMA only.
    Axis("architecture", str, absent="llama"),
    Axis("layout", str),
    Axis("batch_size", int),
    Axis("seq_len", int),
    Axis("precision", str),
    Axis("optimizer", str, "adamw_fused"),
    Axis("micro_batches", int, 1),
    Axis("offload", str, "none"),
    Axis("lora", str, "none"),
    Axis("compile", bool, False),
    Axis("attn_implementation", str, "sdpa"),
    Axis("loss", str, "default"),
    Axis("optimizer_in_backward", bool, False),
    Axis("optimizer_offload", str, "none"),
    Axis("parallel", str, "none"),
    Axis("allocator", str, "default"),
)
# Values of the technique axes that mean "plain training"; tables name only the axes that differ.
AXIS_DEFAULTS: dict[str, Any] = {a.name: a.plain for a in KEY_AXES if a.plain is not None}
# What a recorded key that lacks an axis means: the technique axes' plain values, the later cell axes' ``absent``.
KEY_FILLS: dict[str, Any] = {
    a.name: a.absent if a.absent is not None else a.plain for a in KEY_AXES if (a.absent, a.plain) != (None, None)
}



def filled_key(key: Mapping[str, Any]) -> dict[str, Any]:
    """A recorded key naming every axis: an axis added after it was written takes its ``KEY_FILLS`` value (plain
    training; a cell axis its ``absent`` value), so older keys match newer ones."""
    return {**{k: v for k, v in KEY_FILLS.items() if k not in key}, **key}


def setup_label(key: Mapping[str, Any]) -> str:
    """The technique axes of a key that differ from plain training: 'optimizer=sgd offload=all'."""
    return " ".join(f"{k}={key[k]}" for k in AXIS_DEFAULTS if k in key and key[k] != AXIS_DEFAULTS[k])


@dataclass(frozen=True, order=True)
class Point:
    """One cell of the grid. ``key`` identifies it across runs."""

    precision: str
    lora: str
    layout: str
    seq_len: int
    batch_size: int
    model: str
    optimizer: str
    micro_batches: int = 1
    offload: str = "none"
    compile: bool = False
    attn_implementation: str = "sdpa"
    loss: str = "default"
    optimizer_in_backward: bool = False
    optimizer_offload: str = "none"
    parallel: str = "none"
    allocator: str = "default"
    architecture: str = "llama"

    @property
    def key(self) -> dict[str, Any]:
        return {a.name: getattr(self, a.name) for a in KEY_AXES}

    @property
    def key_id(self) -> str:
        """A stable string form of the key, for matching and display."""
        return key_id(self.key)

    @classmethod
    def from_key(cls, key: Mapping[str, Any]) -> Point:
        """The point a recorded key names (the inverse of ``key``)."""
        return cls(**dict(key))

    @property
    def world_size(self) -> int:
        """Ranks (devices) the point runs on: 1 unless the parallel axis spreads it."""
        return world_size(self.parallel)

    @property
    def tokens(self) -> int:
        """Tokens per optimizer step over all ranks (every micro-batch counts; batch_size is per rank)."""
        return self.batch_size * self.seq_len * self.micro_batches * self.world_size


def point_of(key: Mapping[str, Any]) -> Point | None:
    """The point a recorded key names, or None when it is not a point of this version: a field missing
    or extra (a key edited by hand, or written by a newer ckptbench with another axis), or a wrong type."""
    kinds = {a.name: a.kind for a in KEY_AXES}
    if set(key) != set(kinds) or any(type(key[name]) is not kind for name, kind in kinds.items()):
        return None
    return Point(**dict(key))


def key_id(key: Mapping[str, Any]) -> str:
    """Stable text of a key dict: 'batch_size=2|layout=all|...' (sorted by field)."""
    return "|".join(f"{k}={key[k]}" for k in sorted(key))


def key_without(point: Point, field_name: str) -> tuple[Any, ...]:
    """A point's key without one field: it groups the points that differ only in that field
    (batch size: skips after an OOM; layout: the layouts whose losses must match)."""
    return tuple(sorted((k, v) for k, v in point.key.items() if k != field_name))


# The axes a config's sweep lists values for (every axis but the model's), in ``Point``'s field order.
AXES = tuple(f.name for f in fields(Point) if f.name not in ("model", "architecture"))
# Execution order: precision and LoRA outermost (the model is rebuilt only when they change; the allocator's
# settings need a process of their own), batch innermost; sharded points (each in its own processes) after
# the single-device points of the same setup.
_ORDER = ("precision", "lora", "allocator", "optimizer", "optimizer_offload", "optimizer_in_backward", "loss",
          "micro_batches", "offload", "compile", "attn_implementation", "parallel", "layout", "seq_len",
          "batch_size")


def search_templates(
    model: str, values: Mapping[str, Sequence[Any]], kind: str, *, architecture: str = "llama"
) -> list[tuple[str, Point]]:
    """(kind, template point) for every searched cell; the searched axis holds a placeholder
    (batch 1 for 'batch_max', layout 'none' for 'layout_fit')."""
    values = dict(values)
    if kind == "batch_max":
        values["batch_size"] = [1]
    else:
        values["layout"] = ["none"]
    cells = itertools.product(*(values[a] for a in AXES))
    return [(kind, Point(model=model, architecture=architecture, **dict(zip(AXES, c, strict=True)))) for c in cells]


def expand(
    model: str,
    values: Mapping[str, Sequence[Any]],
    explicit: Sequence[Mapping[str, Any]] = (),
    *,
    replace_grid: bool = False,
    architecture: str = "llama",
) -> list[Point]:
    """Grid (unless replaced) plus explicit points, de-duplicated, ordered for model reuse.

    An explicit point's unset (None) fields take the first value of their axis. Precision and LoRA
    are the outer loops (the model is rebuilt only when they change), 'none' runs first among
    layouts (its losses are the reference), and batch size is the innermost loop, ascending, so a
    layout that runs out of memory can skip larger batches.
    """
    cells: set[tuple[Any, ...]] = set()
    if not replace_grid:
        cells.update(itertools.product(*(values[a] for a in AXES)))
    for given in explicit:
        cells.add(tuple(given[a] if given.get(a) is not None else values[a][0] for a in AXES))
    rank = {a: {v: i for i, v in enumerate(values[a])} for a in AXES}
    rank["layout"]["none"] = -1
    rank["parallel"]["none"] = -1  # unsharded points first: they are the loss references of sharded ones

    def sort_key(cell: tuple[Any, ...]) -> tuple[Any, ...]:
        by_axis = dict(zip(AXES, cell, strict=True))
        return tuple((rank[a].get(by_axis[a], len(rank[a])), str(by_axis[a])) for a in _ORDER)

    return [Point(model=model, architecture=architecture, **dict(zip(AXES, c, strict=True)))
            for c in sorted(cells, key=sort_key)]
