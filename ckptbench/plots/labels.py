"""Labels beside points that overlap neither each other nor any point or line (greedy, over candidate places)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Annotation
from matplotlib.transforms import Bbox

HAlign = Literal["left", "center", "right"]
VAlign = Literal["bottom", "center", "top"]

# Directions around a point, up-right first, and the text alignment that keeps the text on that side.
_DIRECTIONS: tuple[tuple[int, int, HAlign, VAlign], ...] = (
    (1, 1, "left", "bottom"), (-1, 1, "right", "bottom"), (1, -1, "left", "top"), (-1, -1, "right", "top"),
    (1, 0, "left", "center"), (-1, 0, "right", "center"), (0, 1, "center", "bottom"), (0, -1, "center", "top"),
)
_GAP = 1.5  # points kept clear around each label


@dataclass(frozen=True)
class Label:
    """A text for the point at (x, y) in data coordinates, drawn ``radius`` points wide around it."""

    x: float
    y: float
    text: str
    radius: float = 4.0
    bold: bool = False


def place_labels(
    fig: Figure, ax: Axes, labels: Sequence[Label], *, points: Sequence[tuple[float, float, float]] = (),
    lines: Sequence[Sequence[tuple[float, float]]] = (), fontsize: float = 7.5,
) -> list[Annotation]:
    """Place each label (most important first) at the first place around its point where it stays
    inside the axes, clear of the labels already placed, of every labelled or other point ((x, y,
    radius in points)) and of the lines (polylines of horizontal and vertical segments), and nearer to
    its own point than to any other; a label with no such place is left out rather than drawn over
    something or next to the wrong point. Freezes the figure's layout first."""
    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    canvas.draw()  # the layout engine settles where the axes are
    fig.set_layout_engine("none")  # and they must not move once the label boxes are checked
    renderer = canvas.get_renderer()
    inside = ax.get_window_extent(renderer)
    marks = [(*ax.transData.transform((x, y)), r * fig.dpi / 72) for x, y, r in [
        *points, *((lab.x, lab.y, lab.radius) for lab in labels)]]
    taken = _Grid()
    for px, py, r in marks:
        taken.add((px - r, py - r, px + r, py + r))
    for line in lines:
        for a, b in itertools.pairwise(line):
            taken.add(_segment_box(ax, a, b))
    centres = _Grid()
    for px, py, _ in marks:
        centres.add((px, py, px, py))
    placed = []
    pixels = fig.dpi / 72
    pad = _GAP * pixels
    for label in labels:
        own = tuple(float(v) for v in ax.transData.transform((label.x, label.y)))
        if _hopeless(own, label.radius, pixels=pixels, pad=pad, inside=inside, taken=taken, centres=centres):
            continue  # refused at every place whatever the text's size: not drawn, not measured
        note: Annotation | None = None
        first: _FirstPlace | None = None
        for dx, dy, ha, va, dist in _places(label.radius):
            if first is not None:
                # Where the text would be, from its size at the first place: a place whose box, shrunk by a
                # pixel, already leaves the axes or overlaps something is refused without asking matplotlib
                # (the exact box holds the shrunk one, so it would be refused too); the others are measured.
                guess = first.box_at(dx * dist * pixels, dy * dist * pixels, ha, va)
                if not _within(guess, inside) or taken.overlaps(guess) or _surely_nearer_another(guess, own, centres):
                    continue
            if note is None:
                note = ax.annotate(label.text, (label.x, label.y), xytext=(dx * dist, dy * dist),
                                   textcoords="offset points", ha=ha, va=va, fontsize=fontsize, color="#222222",
                                   fontweight="bold" if label.bold else "normal")
            else:  # the same text moved to the next place: one artist per label, not one per place
                note.xyann = (dx * dist, dy * dist)
                note.set_horizontalalignment(ha)
                note.set_verticalalignment(va)
            box = _extents(note.get_window_extent(renderer).padded(_GAP * pixels))  # labels never touch
            if first is None:
                first = _FirstPlace.of(box, own, (dx * dist * pixels, dy * dist * pixels), ha, va, pad=_GAP * pixels)
            if _within(box, inside) and not taken.overlaps(box) and _nearest(box, own, centres):
                taken.add(box)
                placed.append(note)
                note = None
                break
        if note is not None:
            note.remove()
    return placed


Box = tuple[float, float, float, float]  # x0, y0, x1, y1 in display pixels

_ALIGN = {"left": 0.0, "bottom": 0.0, "center": 0.5, "right": 1.0, "top": 1.0}
_SHRINK = 1.0  # pixels: far more than the rounding between a guessed and a measured box


@dataclass(frozen=True)
class _FirstPlace:
    """A label's padded box measured at its first place, from which its box at any other place is guessed:
    the text keeps its size, the offset moves it, and the alignment shifts it by a share of the text's width
    or height (left/bottom 0, center 1/2, right/top 1)."""

    x0: float  # the padded box's lower-left corner with the offset and the alignment shift taken out
    y0: float
    width: float  # of the padded box
    height: float
    pad: float

    @classmethod
    def of(
        cls, box: Box, own: tuple[float, ...], offset: tuple[float, float], ha: str, va: str, *, pad: float
    ) -> _FirstPlace | None:
        """None when the measured box is not where that model puts it (``pad`` pixels around the text at the
        anchor plus the offset; an anchor matplotlib does not draw has a unit box): then no place is guessed,
        every one is measured."""
        width, height = box[2] - box[0], box[3] - box[1]
        x0 = box[0] - offset[0] + _ALIGN[ha] * (width - 2 * pad)
        y0 = box[1] - offset[1] + _ALIGN[va] * (height - 2 * pad)
        if not (width > 2 * _SHRINK and height > 2 * _SHRINK):
            return None
        if not (abs(x0 + pad - own[0]) < _SHRINK / 4 and abs(y0 + pad - own[1]) < _SHRINK / 4):
            return None
        return cls(x0, y0, width, height, pad)

    def box_at(self, off_x: float, off_y: float, ha: str, va: str) -> Box:
        """The box at another place, shrunk by ``_SHRINK`` pixels on every side (inside the exact one)."""
        x0 = self.x0 + off_x - _ALIGN[ha] * (self.width - 2 * self.pad)
        y0 = self.y0 + off_y - _ALIGN[va] * (self.height - 2 * self.pad)
        return x0 + _SHRINK, y0 + _SHRINK, x0 + self.width - _SHRINK, y0 + self.height - _SHRINK


def _hopeless(
    own: tuple[float, ...], radius: float, *, pixels: float, pad: float, inside: Bbox, taken: _Grid, centres: _Grid
) -> bool:
    """Whether every place of a label is refused whatever its text, so that it need not be measured (crowded
    points: most labels of a 1,000-point plot). At each place the padded text box holds its core, the anchor
    with ``pad`` around it (the anchor is a corner, or on an edge's middle, of the text box for every
    alignment), here shrunk by ``_SHRINK`` against rounding: a core leaving the axes or overlapping something
    means the box does too. And the text extends away from its point (the alignment puts it on the far side of
    the anchor), so the box is as far from its own point as the core's near side, at least as far as the core
    grown by ``_SHRINK``: ``_surely_nearer_another`` on the core refuses exactly what ``_nearest`` would refuse
    for any box holding it. Only for a point inside the axes: matplotlib gives a label it does not draw
    another box."""
    if not (inside.x0 <= own[0] <= inside.x1 and inside.y0 <= own[1] <= inside.y1):
        return False
    half = pad - _SHRINK
    for dx, dy, _, _, dist in _places(radius):
        x, y = own[0] + dx * dist * pixels, own[1] + dy * dist * pixels
        core = (x - half, y - half, x + half, y + half)
        if _within(core, inside) and not taken.overlaps(core) and not _surely_nearer_another(core, own, centres):
            return False
    return True


class _Grid:
    """Boxes bucketed by the square cells they cover, so an overlap check looks only at its neighbourhood
    (placing n labels is linear in n, not quadratic). Checks are Bbox.overlaps' exactly (touching overlaps)."""

    CELL = 32.0  # pixels
    MAX_CELLS = 4096  # a box covering more (a long line) is checked against every query instead

    def __init__(self) -> None:
        self.cells: dict[tuple[int, int], list[Box]] = {}
        self.everywhere: list[Box] = []

    def _span(self, box: Box, margin: float = 0.0) -> tuple[range, range] | None:
        x0, y0, x1, y1 = box
        lo_x, hi_x, lo_y, hi_y = min(x0, x1) - margin, max(x0, x1) + margin, min(y0, y1) - margin, max(y0, y1) + margin
        if not all(math.isfinite(v) for v in (lo_x, hi_x, lo_y, hi_y)):
            return None
        cx, cy = range(math.floor(lo_x / self.CELL), math.floor(hi_x / self.CELL) + 1), \
            range(math.floor(lo_y / self.CELL), math.floor(hi_y / self.CELL) + 1)
        return (cx, cy) if len(cx) * len(cy) <= self.MAX_CELLS else None

    def add(self, box: Box) -> None:
        span = self._span(box)
        if span is None:
            self.everywhere.append(box)
            return
        for i in span[0]:
            for j in span[1]:
                self.cells.setdefault((i, j), []).append(box)

    def near(self, box: Box, margin: float = 0.0) -> list[Box]:
        """Every box that may lie within ``margin`` of ``box`` (a superset: the callers check exactly)."""
        span = self._span(box, margin)
        if span is None:
            return [b for cell in self.cells.values() for b in cell] + self.everywhere
        found = list(self.everywhere)
        cells = self.cells
        for i in span[0]:
            for j in span[1]:
                found += cells.get((i, j), ())
        return found

    def overlaps(self, box: Box) -> bool:
        return any(_overlaps(box, other) for other in self.near(box))


def _extents(bbox: Bbox) -> Box:
    x0, y0, x1, y1 = bbox.extents
    return float(x0), float(y0), float(x1), float(y1)


def _overlaps(a: Box, b: Box) -> bool:
    """Bbox.overlaps on extents."""
    ax1, ay1, ax2, ay2 = a
    bx1, by1, bx2, by2 = b
    if ax2 < ax1:
        ax2, ax1 = ax1, ax2
    if ay2 < ay1:
        ay2, ay1 = ay1, ay2
    if bx2 < bx1:
        bx2, bx1 = bx1, bx2
    if by2 < by1:
        by2, by1 = by1, by2
    return ax1 <= bx2 and bx1 <= ax2 and ay1 <= by2 and by1 <= ay2


def _places(radius: float) -> list[tuple[int, int, HAlign, VAlign, float]]:
    """Candidate places: every direction just outside the point, then a little farther out."""
    near, far = radius + 2.5, 2 * radius + 8
    return [(dx, dy, ha, va, d) for d in (near, far) for dx, dy, ha, va in _DIRECTIONS]


def _nearest(box: Box, own: tuple[float, ...], centres: _Grid) -> bool:
    """The label sits nearer to its own point than to any other (so it is read as that point's): only points
    within that distance of the box (plus a pixel against rounding) can be nearer."""
    mine = _distance(box, own[0], own[1])
    return all(_distance(box, px, py) >= mine for px, py, _, _ in centres.near(box, mine + 1.0)
               if (px, py) != (own[0], own[1]))


def _surely_nearer_another(guess: Box, own: tuple[float, ...], centres: _Grid) -> bool:
    """Whether the exact box of a guessed place is nearer to another point than to its own, whatever the exact
    box: it holds the guess (shrunk by ``_SHRINK``) and lies inside the guess grown by twice that, so it is at
    most ``_distance(guess, p)`` from a point p and at least ``_distance(grown, own)`` from its own; when some
    point is nearer than that, ``_nearest`` would refuse the measured box (the measurement is skipped)."""
    x0, y0, x1, y1 = guess
    grow = 2 * _SHRINK
    least = _distance((x0 - grow, y0 - grow, x1 + grow, y1 + grow), own[0], own[1])
    return any(_distance(guess, px, py) < least for px, py, _, _ in centres.near(guess, least + 1.0)
               if (px, py) != (own[0], own[1]))


def _distance(box: Box, px: float, py: float) -> float:
    x0, y0, x1, y1 = box
    dx = max(x0 - px, 0.0, px - x1)
    dy = max(y0 - py, 0.0, py - y1)
    return float((dx * dx + dy * dy) ** 0.5)


def _segment_box(ax: Axes, a: tuple[float, float], b: tuple[float, float]) -> Box:
    (x0, y0), (x1, y1) = ax.transData.transform(a), ax.transData.transform(b)
    return float(min(x0, x1) - 1), float(min(y0, y1) - 1), float(max(x0, x1) + 1), float(max(y0, y1) + 1)


def _within(box: Box, outer: Bbox) -> bool:
    return bool(outer.x0 <= box[0] and box[2] <= outer.x1 and outer.y0 <= box[1] and box[3] <= outer.y1)
