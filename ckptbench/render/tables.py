"""Generic table rendering: rich tables, GitHub Markdown and CSV of string rows (no metrics here)."""

from __future__ import annotations

import csv
import io
from collections.abc import Collection, Sequence

from rich.table import Table

_RIGHT = {"batch", "seq", "peak", "predicted", "pred. err", "reserved", "pred. reserved", "res. err", "activation",
          "step ms", "± ms", "tok/s", "MFU", "count"}


def rich_table(rows: Sequence[dict[str, str]], columns: Sequence[str], *, title: str | None = None) -> Table:
    """A rich table of string rows."""
    table = Table(title=title, show_lines=False, header_style="bold")
    for col in columns:
        table.add_column(col, justify="right" if col in _RIGHT else "left", no_wrap=col != "status")
    for row in rows:
        style = None if row.get("status", "ok").startswith("ok") else "yellow"
        table.add_row(*(row[c] for c in columns), style=style)
    return table


def markdown_table(
    rows: Sequence[dict[str, str]], columns: Sequence[str], *, right: Collection[str] = _RIGHT
) -> str:
    """A GitHub-flavoured Markdown table of string rows; ``right`` names the right-aligned columns."""

    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    lines = ["| " + " | ".join(columns) + " |"]
    lines.append("| " + " | ".join("---:" if c in right else "---" for c in columns) + " |")
    lines += ["| " + " | ".join(cell(r[c]) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def csv_text(rows: Sequence[dict[str, object]], columns: Sequence[str]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()
