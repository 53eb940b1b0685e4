"""Labels beside points that overlap neither each other nor any point or line (greedy, over candidate places)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Annotation
from matplotlib.transforms import Bbox

# Directions around a point, up-right first, and the text alignment that keeps the text on that side.
_DIRECTIONS = (
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
    taken = [Bbox.from_extents(px - r, py - r, px + r, py + r) for px, py, r in marks]
    taken += [_segment_box(ax, a, b) for line in lines for a, b in itertools.pairwise(line)]
    placed = []
    for label in labels:
        own = tuple(float(v) for v in ax.transData.transform((label.x, label.y)))
        for dx, dy, ha, va, dist in _places(label.radius):
            note = ax.annotate(label.text, (label.x, label.y), xytext=(dx * dist, dy * dist),
                               textcoords="offset points", ha=ha, va=va, fontsize=fontsize, color="#222222",
                               fontweight="bold" if label.bold else "normal")
            box = note.get_window_extent(renderer).padded(_GAP * fig.dpi / 72)  # labels never touch
            if _within(box, inside) and not any(box.overlaps(t) for t in taken) and _nearest(box, own, marks):
                taken.append(box)
                placed.append(note)
                break
            note.remove()
    return placed


def _places(radius: float) -> list[tuple[int, int, str, str, float]]:
    """Candidate places: every direction just outside the point, then a little farther out."""
    near, far = radius + 2.5, 2 * radius + 8
    return [(dx, dy, ha, va, d) for d in (near, far) for dx, dy, ha, va in _DIRECTIONS]


def _nearest(box: Bbox, own: tuple[float, ...], marks: Sequence[tuple[float, float, float]]) -> bool:
    """The label sits nearer to its own point than to any other (so it is read as that point's)."""
    mine = _distance(box, own[0], own[1])
    return all(_distance(box, px, py) >= mine for px, py, _ in marks if (px, py) != (own[0], own[1]))


def _distance(box: Bbox, px: float, py: float) -> float:
    dx = max(box.x0 - px, 0.0, px - box.x1)
    dy = max(box.y0 - py, 0.0, py - box.y1)
    return float((dx * dx + dy * dy) ** 0.5)


def _segment_box(ax: Axes, a: tuple[float, float], b: tuple[float, float]) -> Bbox:
    (x0, y0), (x1, y1) = ax.transData.transform(a), ax.transData.transform(b)
    return Bbox.from_extents(min(x0, x1) - 1, min(y0, y1) - 1, max(x0, x1) + 1, max(y0, y1) + 1)


def _within(box: Bbox, outer: Bbox) -> bool:
    return outer.x0 <= box.x0 and box.x1 <= outer.x1 and outer.y0 <= box.y0 and box.y1 <= outer.y1
