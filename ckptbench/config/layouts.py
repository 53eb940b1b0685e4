"""Layout grammar: a layout string and a layer count give a plan of what to checkpoint. Pure.

Grammar (layer indices are 0-based decoder-layer indices of ``model.model.layers``)::

    LAYOUT      := SELECTOR [ "@" GRANULARITY ]
    SELECTOR    := "none" | "all"
                 | "every:" N [ "+" OFFSET ]   layers i with i % N == OFFSET (OFFSET defaults to 0)
                 | "first:" K | "last:" K
                 | "range:" A "-" B            A..B inclusive
                 | "layers:" I ("," I)*        an explicit list
    GRANULARITY := "block" (default: the whole decoder layer)
                 | "attn" | "mlp"              only that sub-module of each chosen layer
                 | "attn+mlp"                  attention and MLP wrapped separately
                 | "selective"                 the whole layer, per-op: matmul and attention outputs
                                               are saved, everything else is recomputed
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, get_args

from ckptbench.errors import LayoutError

Granularity = Literal["block", "attn", "mlp", "attn+mlp", "selective"]
GRANULARITIES: tuple[str, ...] = get_args(Granularity)

_SUBMODULES: dict[str, tuple[str, ...]] = {
    "block": ("",),
    "attn": ("self_attn",),
    "mlp": ("mlp",),
    "attn+mlp": ("self_attn", "mlp"),
    "selective": ("",),
}

SYNTAX_HELP = (
    "none | all | every:N[+OFFSET] | first:K | last:K | range:A-B | layers:I,J,... "
    "optionally followed by @block|@attn|@mlp|@attn+mlp|@selective"
)


@dataclass(frozen=True)
class LayoutPlan:
    """Which decoder layers to checkpoint and which part of each."""

    layout: str
    num_layers: int
    layers: tuple[int, ...]
    granularity: Granularity

    @property
    def submodules(self) -> tuple[str, ...]:
        """Sub-module names wrapped inside each chosen layer ('' is the whole layer)."""
        return _SUBMODULES[self.granularity] if self.layers else ()

    @property
    def targets(self) -> tuple[str, ...]:
        """Dotted paths below ``model.model.layers`` that get wrapped, in order."""
        return tuple(f"{i}.{s}" if s else str(i) for i in self.layers for s in self.submodules)

    def describe_layers(self) -> str:
        """Compact layer list: '0-3,8,10-11', or '-' when nothing is checkpointed."""
        return compress_ranges(self.layers)

    def describe(self) -> str:
        """One human sentence of what the plan checkpoints."""
        if not self.layers:
            return "nothing checkpointed"
        part = {
            "block": "whole decoder layer",
            "attn": "self_attn only",
            "mlp": "mlp only",
            "attn+mlp": "self_attn and mlp wrapped separately",
            "selective": "whole decoder layer, per-op (matmuls and attention saved)",
        }[self.granularity]
        return f"{len(self.layers)}/{self.num_layers} layers [{self.describe_layers()}], {part}"


def compress_ranges(indices: tuple[int, ...] | list[int]) -> str:
    """Format sorted integers as ranges: (0,1,2,5) -> '0-2,5'."""
    if not indices:
        return "-"
    parts: list[str] = []
    start = prev = indices[0]
    for i in [*indices[1:], None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    return ",".join(parts)


def _int(text: str, layout: str, what: str) -> int:
    if not re.fullmatch(r"\d+", text.strip()):
        raise LayoutError(f"layout {layout!r}: {what} must be a non-negative integer, got {text!r}")
    return int(text)


def _select(selector: str, num_layers: int, layout: str) -> tuple[int, ...]:
    name, _, arg = selector.partition(":")
    name = name.strip().lower()
    if name in ("none", "all"):
        if arg:
            raise LayoutError(f"layout {layout!r}: {name!r} takes no argument")
        return () if name == "none" else tuple(range(num_layers))
    if not arg:
        raise LayoutError(f"layout {layout!r}: unknown or incomplete layout; allowed: {SYNTAX_HELP}")
    if name == "every":
        n_text, _, off_text = arg.partition("+")
        n = _int(n_text, layout, "N")
        offset = _int(off_text, layout, "OFFSET") if off_text else 0
        if n < 1:
            raise LayoutError(f"layout {layout!r}: every:N needs N >= 1, got {n}")
        if offset >= n:
            raise LayoutError(f"layout {layout!r}: OFFSET must be below N ({n}), got {offset}")
        return tuple(i for i in range(num_layers) if i % n == offset)
    if name in ("first", "last"):
        k = _int(arg, layout, "K")
        if k < 1 or k > num_layers:
            raise LayoutError(f"layout {layout!r}: K must be 1..{num_layers} (the model has {num_layers} layers)")
        return tuple(range(k)) if name == "first" else tuple(range(num_layers - k, num_layers))
    if name == "range":
        a_text, sep, b_text = arg.partition("-")
        if not sep:
            raise LayoutError(f"layout {layout!r}: range needs A-B, for example range:8-19")
        a, b = _int(a_text, layout, "A"), _int(b_text, layout, "B")
        if a > b or b >= num_layers:
            raise LayoutError(
                f"layout {layout!r}: range must satisfy A <= B <= {num_layers - 1} "
                f"(the model has {num_layers} layers)"
            )
        return tuple(range(a, b + 1))
    if name == "layers":
        items = sorted({_int(t, layout, "layer index") for t in arg.split(",")})
        bad = [i for i in items if i >= num_layers]
        if bad:
            raise LayoutError(
                f"layout {layout!r}: layer {bad[0]} does not exist (the model has {num_layers} layers, 0-based)"
            )
        return tuple(items)
    raise LayoutError(f"layout {layout!r}: unknown selector {name!r}; allowed: {SYNTAX_HELP}")


def parse_layout(layout: str, num_layers: int) -> LayoutPlan:
    """Resolve a layout string for a model with ``num_layers`` decoder layers."""
    if not isinstance(layout, str) or not layout.strip():
        raise LayoutError(f"layout must be a non-empty string; allowed: {SYNTAX_HELP}")
    if num_layers < 1:
        raise LayoutError(f"the model must have at least one layer, got {num_layers}")
    text = layout.strip()
    selector, _, granularity = text.partition("@")
    granularity = granularity.strip().lower() or "block"
    if granularity not in GRANULARITIES:
        raise LayoutError(
            f"layout {layout!r}: unknown granularity {granularity!r}; allowed: {', '.join(GRANULARITIES)}"
        )
    layers = _select(selector.strip(), num_layers, text)
    return LayoutPlan(layout=text, num_layers=num_layers, layers=layers, granularity=granularity)  # type: ignore[arg-type]
