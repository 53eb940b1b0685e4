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


_MAX_DIGITS = 6  # layer indices and strides never need more; int() of 5000 digits is a ValueError of its own


def _q(layout: str) -> str:
    """The user's layout, quoted and shortened for a one-line message."""
    text = repr(layout)
    return text if len(text) <= 40 else text[:35] + "..." + text[-1]


def _int(text: str, layout: str, what: str) -> int:
    # ASCII digits only: Python's \d and int() also take '٣' and '２', which nobody means as a layer.
    digits = text.strip()
    if not re.fullmatch(r"[0-9]+", digits):
        raise LayoutError(f"layout {_q(layout)}: {what} must be a non-negative integer, got {_q(text)}")
    if len(digits.lstrip("0")) > _MAX_DIGITS:
        raise LayoutError(f"layout {_q(layout)}: {what} must have at most {_MAX_DIGITS} digits")
    return int(digits)


@dataclass(frozen=True)
class _Syntax:
    """A layout string parsed without the model: selector, its numbers, granularity."""

    name: str
    args: tuple[int, ...]
    granularity: str

    def text(self) -> str:
        """The one canonical spelling: lower case, no spaces, sorted layers, '@block' and '+0' left out."""
        if self.name == "every" and self.args[1]:
            arg = f"{self.args[0]}+{self.args[1]}"
        elif self.name == "range":
            arg = f"{self.args[0]}-{self.args[1]}"
        else:  # every:N, first:K, last:K, layers:I,J
            arg = ",".join(map(str, self.args[:1] if self.name == "every" else self.args))
        selector = f"{self.name}:{arg}" if self.args else self.name
        plain = self.granularity == "block" or self.name == "none"  # 'none@mlp' checkpoints nothing either
        return selector if plain else f"{selector}@{self.granularity}"


def _args(name: str, arg: str, layout: str) -> tuple[int, ...]:
    if name in ("none", "all"):
        if arg:
            raise LayoutError(f"layout {_q(layout)}: {name!r} takes no argument")
        return ()
    if not arg:
        raise LayoutError(f"layout {_q(layout)}: unknown or incomplete layout; allowed: {SYNTAX_HELP}")
    if name == "every":
        n_text, _, off_text = arg.partition("+")
        return (_int(n_text, layout, "N"), _int(off_text, layout, "OFFSET") if off_text else 0)
    if name in ("first", "last"):
        return (_int(arg, layout, "K"),)
    if name == "range":
        a_text, sep, b_text = arg.partition("-")
        if not sep:
            raise LayoutError(f"layout {_q(layout)}: range needs A-B, for example range:8-19")
        return (_int(a_text, layout, "A"), _int(b_text, layout, "B"))
    if name == "layers":
        return tuple(sorted({_int(t, layout, "layer index") for t in arg.split(",")}))
    raise LayoutError(f"layout {_q(layout)}: unknown selector {name!r}; allowed: {SYNTAX_HELP}")


def _syntax(layout: str) -> _Syntax:
    """Parse a layout string's syntax (no layer count needed); LayoutError when it is not a layout."""
    if not isinstance(layout, str) or not layout.strip():
        raise LayoutError(f"layout must be a non-empty string; allowed: {SYNTAX_HELP}")
    text = layout.strip()
    selector, _, granularity = text.partition("@")
    granularity = granularity.strip().lower() or "block"
    if granularity not in GRANULARITIES:
        raise LayoutError(
            f"layout {_q(text)}: unknown granularity {_q(granularity)}; allowed: {', '.join(GRANULARITIES)}"
        )
    name, _, arg = selector.strip().partition(":")
    name = name.strip().lower()
    return _Syntax(name, _args(name, arg.strip(), text), granularity)


def canonical_layout(layout: str) -> str:
    """The canonical spelling of a layout ('ALL', ' all', 'all@block' -> 'all'); 'fit' stays 'fit'.
    Text that is not a layout is returned as it is (parse_layout reports it)."""
    if isinstance(layout, str) and layout.strip().lower() == "fit":
        return "fit"
    try:
        return _syntax(layout).text()
    except LayoutError:
        return layout


def _select(syntax: _Syntax, num_layers: int, layout: str) -> tuple[int, ...]:
    """The layers a parsed layout chooses in a model of ``num_layers`` layers."""
    name, args = syntax.name, syntax.args
    if name in ("none", "all"):
        return () if name == "none" else tuple(range(num_layers))
    if name == "every":
        n, offset = args
        if n < 1:
            raise LayoutError(f"layout {_q(layout)}: every:N needs N >= 1, got {n}")
        if offset >= n:
            raise LayoutError(f"layout {_q(layout)}: OFFSET must be below N ({n}), got {offset}")
        return tuple(i for i in range(num_layers) if i % n == offset)
    if name in ("first", "last"):
        k = args[0]
        if k < 1 or k > num_layers:
            raise LayoutError(f"layout {_q(layout)}: K must be 1..{num_layers} (the model has {num_layers} layers)")
        return tuple(range(k)) if name == "first" else tuple(range(num_layers - k, num_layers))
    if name == "range":
        a, b = args
        if a > b or b >= num_layers:
            raise LayoutError(
                f"layout {_q(layout)}: range must satisfy A <= B <= {num_layers - 1} "
                f"(the model has {num_layers} layers)"
            )
        return tuple(range(a, b + 1))
    bad = [i for i in args if i >= num_layers]  # layers:
    if bad:
        raise LayoutError(
            f"layout {_q(layout)}: layer {bad[0]} does not exist (the model has {num_layers} layers, 0-based)"
        )
    return args


def parse_layout(layout: str, num_layers: int) -> LayoutPlan:
    """Resolve a layout string for a model with ``num_layers`` decoder layers."""
    syntax = _syntax(layout)
    if num_layers < 1:
        raise LayoutError(f"the model must have at least one layer, got {num_layers}")
    text = layout.strip()
    layers = _select(syntax, num_layers, text)
    return LayoutPlan(layout=text, num_layers=num_layers, layers=layers, granularity=syntax.granularity)  # type: ignore[arg-type]
