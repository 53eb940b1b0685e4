"""The grid: points (one cell each, identified by its key) expanded from a validated config. Pure."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ckptbench.config import SweepConfig

# Values of the technique axes that mean "plain training"; tables name only the axes that differ.
AXIS_DEFAULTS: dict[str, Any] = {
    "optimizer": "adamw_fused",
    "micro_batches": 1,
    "offload": "none",
    "lora": "none",
    "compile": False,
    "attn_implementation": "sdpa",
}


def setup_label(key: dict[str, Any]) -> str:
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

    @property
    def key(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "layout": self.layout,
            "batch_size": self.batch_size,
            "seq_len": self.seq_len,
            "precision": self.precision,
            "optimizer": self.optimizer,
            "micro_batches": self.micro_batches,
            "offload": self.offload,
            "lora": self.lora,
            "compile": self.compile,
            "attn_implementation": self.attn_implementation,
        }

    @property
    def key_id(self) -> str:
        """A stable string form of the key, for matching and display."""
        return key_id(self.key)

    @property
    def tokens(self) -> int:
        """Tokens per optimizer step (every micro-batch counts)."""
        return self.batch_size * self.seq_len * self.micro_batches


def key_id(key: dict[str, Any]) -> str:
    """Stable text of a key dict: 'batch_size=2|layout=all|...' (sorted by field)."""
    return "|".join(f"{k}={key[k]}" for k in sorted(key))


_AXES = ("precision", "lora", "layout", "seq_len", "batch_size", "optimizer", "micro_batches", "offload",
         "compile", "attn_implementation")


def _axis_values(cfg: SweepConfig) -> dict[str, list[Any]]:
    axes = cfg.sweep
    return {
        "precision": list(axes.precision),
        "lora": list(axes.lora),
        "layout": [x for x in axes.layout if x != "fit"],
        "seq_len": list(axes.seq_len),
        "batch_size": [] if axes.batch_size == "max" else list(axes.batch_size),
        "optimizer": list(axes.optimizer or [cfg.optimizer]),
        "micro_batches": list(axes.micro_batches),
        "offload": list(axes.offload),
        "compile": list(axes.compile),
        "attn_implementation": list(axes.attn_implementation or [cfg.model.attn_implementation]),
    }


def search_templates(cfg: SweepConfig) -> list[tuple[str, Point]]:
    """('batch_max' | 'layout_fit', template point) for every searched cell, in execution order.

    The template carries every other axis; the searched one is a placeholder (batch 1, layout 'none').
    """
    values = _axis_values(cfg)
    if cfg.sweep.batch_size == "max":
        kind, values["batch_size"] = "batch_max", [1]
    elif "fit" in cfg.sweep.layout:
        kind, values["layout"] = "layout_fit", ["none"]
    else:
        return []
    cells = itertools.product(*(values[a] for a in _AXES))
    return [(kind, Point(model=cfg.model.name, **dict(zip(_AXES, c, strict=True)))) for c in cells]


def expand(cfg: SweepConfig) -> list[Point]:
    """Grid (unless replaced) plus explicit points, de-duplicated, ordered for model reuse.

    Precision and LoRA are the outer loops (the model is rebuilt only when they change), 'none'
    runs first among layouts (its losses are the reference), and batch size is the innermost
    loop, ascending, so a layout that runs out of memory can skip larger batches.
    """
    values = _axis_values(cfg)
    cells: set[tuple[Any, ...]] = set()
    if cfg.points_mode == "add" or not cfg.points:
        cells.update(itertools.product(*(values[a] for a in _AXES)))
    for spec in cfg.points:
        given = spec.model_dump()
        cells.add(tuple(given[a] if given.get(a) is not None else values[a][0] for a in _AXES))
    rank = {a: {v: i for i, v in enumerate(values[a])} for a in _AXES}
    rank["layout"]["none"] = -1

    def sort_key(cell: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple((rank[a].get(v, len(rank[a])), str(v)) for a, v in zip(_AXES, cell, strict=True))

    order = ["precision", "lora", "optimizer", "micro_batches", "offload", "compile", "attn_implementation",
             "layout", "seq_len", "batch_size"]
    idx = [_AXES.index(a) for a in order]
    cells_sorted = sorted(cells, key=lambda c: tuple(sort_key(c)[i] for i in idx))
    return [Point(model=cfg.model.name, **dict(zip(_AXES, c, strict=True))) for c in cells_sorted]
