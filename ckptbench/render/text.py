"""User strings (run names, model overrides, layout labels, paths) shown by rich: never read as markup. Rich reads
'[bold]' and '[/]' as tags (a MarkupError, or the text vanishes). (Plots: plots/style.py plain_text.)"""

from __future__ import annotations

from rich.markup import escape


def rich_safe(text: str) -> str:
    """``text`` for a rich string that is parsed as markup (a table's title, a printed line): shown as given."""
    return escape(text)
