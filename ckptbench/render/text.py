"""User strings (run names, model overrides, layout labels, paths) shown by rich or drawn by matplotlib: never
read as markup. Rich reads '[bold]' and '[/]' as tags (a MarkupError, or the text vanishes); matplotlib reads
'$...$' as math (a ValueError for '$\\frac{1}$', after half a report was written)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import matplotlib as mpl
from rich.markup import escape

P = ParamSpec("P")
R = TypeVar("R")


def rich_safe(text: str) -> str:
    """``text`` for a rich string that is parsed as markup (a table's title, a printed line): shown as given."""
    return escape(text)


def plain_text(draw: Callable[P, R]) -> Callable[P, R]:
    """A plotting function whose texts are drawn as given: no mathtext ($...$) in the titles, labels, legends
    and notes it creates (ckptbench draws no formulas; its texts hold names a user chose)."""

    @functools.wraps(draw)
    def drawn(*args: P.args, **kwargs: P.kwargs) -> R:
        with mpl.rc_context({"text.parse_math": False}):  # read by each Text when it is created
            return draw(*args, **kwargs)

    return drawn
