"""Generic tables of string rows: rich tables that fit the terminal, GitHub Markdown and CSV (no metrics here).

Every table declares its columns with a priority. ``fit_columns`` decides, for a given width, which
columns are shown and how wide: numbers are never shortened or wrapped; text columns marked ``wrap``
fold onto more lines down to their minimum width; when even that is too wide, the columns with the
highest priority number are left out, and the table's caption names them. When even the columns always
shown do not fit (40 columns, 20), every text column folds down to a narrow floor that keeps each number in
it whole, and then always-shown columns are left out too (the highest ``keep`` first), and named: a number is
never cut, at any width. ``FitTable`` is a rich renderable that makes that decision at
print time, with the width of the console it is printed on. Markdown and CSV are always complete.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, replace

from rich import box
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, JustifyMethod, RenderResult
from rich.measure import Measurement
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

from ckptbench.render.text import rich_safe

# A rich table with the default box and padding: one edge, then per column 2 padding + 1 rule.
_EDGE, _PER_COLUMN = 1, 3
# Wrapped text breaks after a space or a comma, so that '0,2,4,...,30' never splits a number.
_PIECE = re.compile(r"[^\s,]*,?\s*")
_NUMBER = re.compile(r"[-+]?[\d.,]*\d +")  # a number followed by a space ...
_UNIT = re.compile(r"(?:[KMGT]i?B|B|ms|s|%)\b")  # ... and the unit it goes with
_LONGEST_KEPT_WHOLE = 30  # a wrapping column is at least as wide as its longest word, up to this
_COMFORTABLE = 40  # a wrapping column this wide reads well; beyond it, it wraps rather than hide a column


@dataclass(frozen=True)
class Column:
    """One column of a table and how it gives way when the terminal is narrow."""

    name: str
    priority: int = 0  # 0: always shown; when the width is short, the highest number is left out first
    numeric: bool = False  # right-aligned, never wrapped or shortened
    wrap: bool = False  # text that may fold onto more lines, down to ``min_width``, before anything is left out
    min_width: int = 12
    # Characters after which this column's text may also break ('@' in 'every:2@selective'): none by default.
    breaks: str = ""
    # A word longer than the column folds onto the next line at the width (text such as
    # 'attn_implementation=eager', never a number): the column may then be as narrow as ``min_width``.
    fold: bool = False
    # A wrapping column of secondary text (a status) that folds down to ``min_width`` before any optional
    # column is left out: optional columns are chosen as if it were at its minimum.
    gives_way: bool = False
    # Only when even the always-shown columns (priority 0) do not fit the width: the one with the highest ``keep``
    # is left out first (ties: the rightmost), until the rest fits or one column is left.
    keep: int = 0


@dataclass(frozen=True)
class Fit:
    """The columns shown at one width, their content widths, and the names of those left out."""

    columns: tuple[Column, ...]
    widths: tuple[int, ...]
    left_out: tuple[str, ...]

    @property
    def total_width(self) -> int:
        return sum(self.widths) + _PER_COLUMN * len(self.widths) + _EDGE


def _natural(col: Column, rows: Sequence[dict[str, str]]) -> int:
    """The width a column needs to show its header and every cell on one line."""
    cells = (cell_len(line) for row in rows for line in row.get(col.name, "").splitlines() or [""])
    return max(cell_len(col.name), max(cells, default=0))  # no rows at all: the header's width


def _minimum(col: Column, natural: int, rows: Sequence[dict[str, str]]) -> int:
    if not col.wrap:
        return natural
    longest_header_word = max(cell_len(w) for w in col.name.split())
    longest_word = 0 if col.fold else min(_longest_piece(col, rows), _LONGEST_KEPT_WHOLE)
    return min(natural, max(col.min_width, longest_header_word, longest_word))


def _pieces(text: str, breaks: str = "") -> list[str]:
    """Unbreakable pieces: a word with its trailing comma (or one of ``breaks``) and spaces; a number keeps
    its unit ('1.95 GiB' never ends one line and starts the next)."""
    if not breaks:
        found = [p for p in _PIECE.findall(text) if p]
    else:
        ends = re.escape("," + breaks)
        found = [p for p in re.findall(rf"[^\s{ends}]*[{ends}]?\s*", text) if p]
    pieces: list[str] = []
    for piece in found:
        if pieces and _NUMBER.fullmatch(pieces[-1]) and _UNIT.match(piece):
            pieces[-1] += piece
        else:
            pieces.append(piece)
    return pieces


def wrap_text(text: str, width: int, *, breaks: str = "") -> str:
    """``text`` folded onto lines of at most ``width`` cells, broken after spaces and commas (and the
    characters in ``breaks``; a piece longer than a line is folded at the width onto the next line:
    only text is ever that long, never a number)."""
    lines: list[str] = []
    for paragraph in text.splitlines() or [""]:
        line = ""
        for piece in _pieces(paragraph, breaks):
            if cell_len((line + piece).rstrip()) <= width:
                line += piece
                continue
            if line:
                lines.append(line.rstrip())
            while cell_len(piece.rstrip()) > width:
                lines.append(piece[:width])
                piece = piece[width:]
            line = piece
        lines.append(line.rstrip())
    return "\n".join(lines)


def _longest_piece(col: Column, rows: Sequence[dict[str, str]]) -> int:
    pieces = (p for row in rows for p in _pieces(row.get(col.name, ""), col.breaks))
    return max((cell_len(p.rstrip()) for p in pieces), default=0)


def _overhead(n: int) -> int:
    return _PER_COLUMN * n + _EDGE


def fit_columns(columns: Sequence[Column], rows: Sequence[dict[str, str]], width: int) -> Fit:
    """Which columns to show at ``width`` (in display order) and how wide each one's content is."""
    natural = {c.name: _natural(c, rows) for c in columns}
    minimum = {c.name: _minimum(c, natural[c.name], rows) for c in columns}
    essential = [c for c in columns if c.priority == 0] or list(columns[:1])
    if sum(minimum[c.name] for c in essential) + _overhead(len(essential)) > width:
        return _narrow_fit(columns, rows, width, natural)
    # Essential columns first; then the others, most important first (ties: leftmost), each one that
    # still fits at its minimum width next to the chosen ones at a comfortable width: a column is
    # added only where it does not force a more important one to wrap (up to _COMFORTABLE cells).
    comfortable = {c.name: natural[c.name] if not c.wrap else minimum[c.name] if c.gives_way
                   else min(natural[c.name], max(minimum[c.name], _COMFORTABLE)) for c in columns}
    chosen = [c for c in columns if c.priority == 0]
    for col in sorted((c for c in columns if c.priority > 0), key=lambda c: _rank(c, rows)):
        need = sum(comfortable[c.name] for c in chosen) + minimum[col.name] + _overhead(len(chosen) + 1)
        if need <= width:
            chosen.append(col)
    shown = [c for c in columns if c in chosen]  # back in display order
    widths = _share(shown, natural, minimum, room=width - _overhead(len(shown)))
    left_out = tuple(c.name for c in columns if c not in shown)
    return Fit(columns=tuple(shown), widths=tuple(widths[c.name] for c in shown), left_out=left_out)


# In a terminal too narrow for the columns always shown, a text column folds down to this many cells (or its
# longest word, up to _NARROW_WORD), never below the longest piece of it that holds a digit ('s=2048', '1.95 GiB').
_NARROW_TEXT, _NARROW_WORD = 6, 10
_DIGIT = re.compile(r"\d")


def _narrow_floor(col: Column, natural: int, rows: Sequence[dict[str, str]]) -> int:
    """How narrow a column may become when not even the always-shown columns fit: a number column as wide as its
    widest cell (its header may wrap: never a number); a text column folds, keeping each number in it whole."""
    header_word = max(cell_len(w) for w in col.name.split())
    if col.numeric:
        cells = (cell_len(line) for row in rows for line in row.get(col.name, "").splitlines())
        return max(max(cells, default=0), header_word)
    pieces = [p.rstrip() for row in rows for p in _pieces(row.get(col.name, ""), col.breaks)]
    numbers = max((cell_len(p) for p in pieces if _DIGIT.search(p)), default=0)
    words = min(max((cell_len(p) for p in pieces), default=0), _NARROW_WORD)
    return min(natural, max(_NARROW_TEXT, min(header_word, _NARROW_WORD), words, numbers))


def _narrow_fit(columns: Sequence[Column], rows: Sequence[dict[str, str]], width: int,
                natural: dict[str, int]) -> Fit:
    """The fit when even the always-shown columns do not fit at their minimum: every text column may fold (to its
    narrow floor), and always-shown columns are left out, the highest ``keep`` first (ties: the rightmost), until
    the rest fits; the first column stays, folded to the width if it must."""
    floor = {c.name: _narrow_floor(c, natural[c.name], rows) for c in columns}
    kept = [c for c in columns if c.priority == 0] or list(columns[:1])
    for col in sorted(kept, key=lambda c: (c.keep, kept.index(c)), reverse=True)[:-1]:
        if sum(floor[c.name] for c in kept) + _overhead(len(kept)) <= width:
            break
        kept.remove(col)
    room = width - _overhead(len(kept))
    if len(kept) == 1 and not kept[0].numeric:  # one text column left: as wide as the terminal allows
        floor[kept[0].name] = max(1, min(floor[kept[0].name], room))
    folding = {c.name: replace(c, wrap=True, fold=True, min_width=floor[c.name]) if not c.numeric else c
               for c in kept}
    shown = [folding[c.name] for c in kept]
    widths = {c.name: natural[c.name] for c in shown}
    excess = sum(widths.values()) - room
    # Text folds first (the rightmost first), then a number column's header wraps down to its widest cell.
    for col in sorted(shown, key=lambda c: (not c.numeric, shown.index(c)), reverse=True):
        give = max(0, min(excess, widths[col.name] - floor[col.name]))
        widths[col.name] -= give
        excess -= give
    left_out = tuple(c.name for c in columns if c.name not in folding)
    return Fit(columns=tuple(shown), widths=tuple(widths[c.name] for c in shown), left_out=left_out)


def _rank(col: Column, rows: Sequence[dict[str, str]]) -> tuple[bool, int]:
    """Optional columns by priority; one with nothing but '-' in it (MFU on a CPU run) comes last."""
    return all(row.get(col.name, "-") == "-" for row in rows), col.priority


def _share(shown: Sequence[Column], natural: dict[str, int], minimum: dict[str, int], *, room: int) -> dict[str, int]:
    """Natural widths if they fit; otherwise wrapping columns give way, the least important first
    (ties: the rightmost), each down to its minimum before the next one wraps."""
    widths = {c.name: natural[c.name] for c in shown}
    excess = sum(widths.values()) - room
    for col in sorted((c for c in shown if c.wrap), key=lambda c: (c.priority, shown.index(c)), reverse=True):
        if excess <= 0:
            break
        give = min(excess, widths[col.name] - minimum[col.name])
        widths[col.name] -= give
        excess -= give
    return widths


class FitTable:
    """A rich table of string rows that fits the width of the console it is printed on."""

    def __init__(
        self,
        rows: Sequence[dict[str, str]],
        columns: Sequence[Column],
        *,
        title: str | None = None,
        caption: str | None = None,
        styles: Sequence[str | None] | None = None,
        title_justify: JustifyMethod = "center",
        complete_hint: str = "widen the terminal or set COLUMNS",
    ) -> None:
        self.rows, self.columns = list(rows), list(columns)
        self.title, self.caption, self.title_justify = title, caption, title_justify
        self.styles = list(styles) if styles is not None else [None] * len(self.rows)
        self.complete_hint = complete_hint

    def table(self, width: int) -> Table:
        """The rich table for a console ``width`` columns wide."""
        return self._table(width, fit_columns(self.columns, self.rows, width))

    def _table(self, width: int, fit: Fit, *, rows: bool = True) -> Table:
        """The rich table of ``fit`` (``rows=False``: its title, header and caption only)."""
        table = Table(title=rich_safe(self.title) if self.title else None,
                      caption=rich_safe(self._caption(width, fit)) or None, header_style="bold",
                      title_justify=self.title_justify)
        narrow = _narrow(fit, width)
        for col, w in zip(fit.columns, fit.widths, strict=True):
            # A header wider than its column (a narrow terminal) wraps: never its cells, which fit.
            table.add_column(col.name, justify="right" if col.numeric else "left", width=w,
                             no_wrap=not col.wrap and not narrow, overflow="fold")
        for row, style in zip(self.rows, self.styles, strict=True) if rows else ():
            table.add_row(*(Text(cell) for cell in _cells(row, fit)), style=style)
        return table

    def _caption(self, width: int, fit: Fit) -> str:
        captions = [self.caption] if self.caption else []
        if fit.left_out:
            captions.append(f"not shown at {width} columns: {', '.join(fit.left_out)} ({self.complete_hint})")
        return "\n".join(captions)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        fit = fit_columns(self.columns, self.rows, width)
        # (a coloured console too where no row has a style of its own: rich's cells are then as plain; the header's
        # bold, the title's and the caption's styles are rich's)
        joined = (console.color_system is None or not any(self.styles)) and not _narrow(fit, width)
        lines = _plain_lines(self.rows, fit) if joined else None
        plain = None if lines is None else _plain_table(self._table(width, fit, rows=False), lines, fit.widths,
                                                         console, options)
        if plain is None:
            yield self._table(width, fit)
        else:
            yield from plain

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, self.table(options.max_width))


def _narrow(fit: Fit, width: int) -> bool:
    """Whether even the fit's columns overflow ``width``, or a header is wider than its column (it then wraps)."""
    return sum(fit.widths) + _overhead(len(fit.widths)) > width or any(
        w < cell_len(c.name) for c, w in zip(fit.columns, fit.widths, strict=True))


def _cells(row: dict[str, str], fit: Fit) -> list[str]:
    """A row's cells as the fit shows them (wrapping columns folded to their width)."""
    return [wrap_text(row.get(c.name, ""), w, breaks=c.breaks) if c.wrap else row.get(c.name, "")
            for c, w in zip(fit.columns, fit.widths, strict=True)]


# A table whose rows are plain text (a console without colours, or rows without a style of their own) has its body's
# lines joined here, as rich lays them out (the fit's widths, one space of padding each side, text left or numbers
# right, a cell's lines from the top), in a few string operations per row rather than rich's renderables per cell: the
# 704-point estimate's table took 0.45 s of its 10.7 s in rich, on a 2-core machine. Title, header, borders and
# caption are still rich's own; a cell rich would change (a character other than printable ASCII, a tab, a line wider
# than its column, a trailing newline) leaves the whole table to rich. tests/test_tables.py holds both to the same
# bytes, with and without colours.
PlainRow = list[list[str]]  # a row's cells, each as its lines padded to the column's width


def _plain_lines(rows: Sequence[dict[str, str]], fit: Fit) -> list[PlainRow] | None:
    """Every body row's cells as padded lines, or None where one cell needs rich's own rendering."""
    widths, right = fit.widths, [c.numeric for c in fit.columns]
    out: list[PlainRow] = []
    for row in rows:
        cells: PlainRow = []
        for text, w, numeric in zip(_cells(row, fit), widths, right, strict=True):
            if not text.isascii() or not text.replace("\n", "").isprintable() or text.endswith("\n"):
                return None  # (rich measures other characters by cells, expands tabs, drops control codes)
            lines = text.split("\n")
            if any(len(line) > w for line in lines):
                return None
            cells.append([line.rstrip().rjust(w) if numeric else line.ljust(w) for line in lines])
        out.append(cells)
    return out


def _plain_table(frame: Table, rows: list[PlainRow], widths: Sequence[int], console: Console,
                 options: ConsoleOptions) -> list[Segment] | None:
    """``frame`` (the table without rows: title, header, caption) with ``rows`` as its body (content ``widths``), as
    rich renders the whole table: rich draws the line under the header, then the bottom line, also where no row comes
    between them; the body goes between the two. None where rich drew something else there."""
    shell = list(console.render(frame, options))
    if not rows:
        return shell
    lines = list(Segment.split_lines(shell))
    table_box = (frame.box or box.HEAVY_HEAD).substitute(
        options, safe=console.safe_box if frame.safe_box is None else frame.safe_box)
    spans = [w + 2 for w in widths]
    texts = ["".join(s.text for s in line) for line in lines]
    head = table_box.get_row(spans, "head", edge=True)  # (the top line may read as the bottom: ASCII draws both alike)
    at = texts.index(head) + 1 if head in texts else 0
    if not at or at >= len(texts) or texts[at] != table_box.get_bottom(spans):
        return None
    out: list[Segment] = []
    for line in lines[:at]:
        out += [*line, Segment.line()]
    for n, cells in enumerate(rows):
        left, mid, right = ((table_box.foot_left, table_box.foot_vertical, table_box.foot_right) if n == len(rows) - 1
                            else (table_box.mid_left, table_box.mid_vertical, table_box.mid_right))
        for i in range(max(len(cell) for cell in cells)):
            parts = [f" {cell[i]} " if i < len(cell) else " " * span for cell, span in zip(cells, spans, strict=True)]
            out += [Segment(left + mid.join(parts) + right), Segment.line()]
    for line in lines[at:]:
        out += [*line, Segment.line()]
    return out


def status_style(status: str) -> str | None:
    """Rows of points that did not finish ok are yellow."""
    return None if status.startswith("ok") else "yellow"


def markdown_table(
    rows: Sequence[dict[str, str]], columns: Sequence[str], *, right: Collection[str] = ()
) -> str:
    """A GitHub-flavoured Markdown table of string rows; ``right`` names the right-aligned columns."""

    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(columns) + " |"]
    lines.append("| " + " | ".join("---:" if c in right else "---" for c in columns) + " |")
    lines += ["| " + " | ".join(cell(r[c]) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def markdown_of(rows: Sequence[dict[str, str]], columns: Sequence[Column]) -> str:
    """The complete Markdown table of rows declared with ``Column``s."""
    return markdown_table(rows, names(columns), right=numeric_names(columns))


def names(columns: Iterable[Column]) -> list[str]:
    return [c.name for c in columns]


def numeric_names(columns: Iterable[Column]) -> set[str]:
    return {c.name for c in columns if c.numeric}


def csv_text(rows: Sequence[dict[str, object]], columns: Sequence[str]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()
