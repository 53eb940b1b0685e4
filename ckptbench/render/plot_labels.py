"""Labels beside points that overlap neither each other nor any point (greedy, over candidate positions)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Annotation
from matplotlib.transforms import Bbox

# (x, y) offset in points from the point, and the text's alignment there: up-right first, then around.
OFFSETS = (
    (5, 4, "left", "bottom"), (-5, 4, "right", "bottom"), (5, -4, "left", "top"), (-5, -4, "right", "top"),
    (7, 0, "left", "center"), (-7, 0, "right", "center"), (0, 7, "center", "bottom"), (0, -7, "center", "top"),
    (12, 10, "left", "bottom"), (-12, 10, "right", "bottom"), (12, -10, "left", "top"), (-12, -10, "right", "top"),
)


@dataclass(frozen=True)
class Label:
    """A text for the point at (x, y), in data coordinates."""

    x: float
    y: float
    text: str
    bold: bool = False


def place_labels(
    fig: Figure, ax: Axes, labels: Sequence[Label], *, points: Sequence[tuple[float, float, float]],
    lines: Sequence[Sequence[tuple[float, float]]] = (), fontsize: float = 7.5,
) -> list[Annotation]:
    """Place each label (most important first) at the first offset where it stays inside the axes and
    clear of the labels already placed, of every point ((x, y, radius in points)) and of the lines
    (polylines of horizontal and vertical segments, in data coordinates); a label with no free place is
    left out rather than drawn over something. Freezes the figure's layout first."""
    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    canvas.draw()  # the layout engine settles where the axes are
    fig.set_layout_engine("none")  # and they must not move once the label boxes are checked
    renderer = canvas.get_renderer()
    inside = ax.get_window_extent(renderer)
    taken = [_point_box(ax, fig, x, y, r) for x, y, r in points]
    taken += [_segment_box(ax, a, b) for line in lines for a, b in itertools.pairwise(line)]
    placed = []
    for label in labels:
        for dx, dy, ha, va in OFFSETS:
            note = ax.annotate(label.text, (label.x, label.y), xytext=(dx, dy), textcoords="offset points", ha=ha,
                               va=va, fontsize=fontsize, color="#222222",
                               fontweight="bold" if label.bold else "normal")
            box = note.get_window_extent(renderer)
            if _within(box, inside) and not any(box.overlaps(t) for t in taken):
                taken.append(box)
                placed.append(note)
                break
            note.remove()
    return placed


def _point_box(ax: Axes, fig: Figure, x: float, y: float, radius_pt: float) -> Bbox:
    px, py = ax.transData.transform((x, y))
    r = radius_pt * fig.dpi / 72
    return Bbox.from_extents(px - r, py - r, px + r, py + r)


def _segment_box(ax: Axes, a: tuple[float, float], b: tuple[float, float]) -> Bbox:
    (x0, y0), (x1, y1) = ax.transData.transform(a), ax.transData.transform(b)
    return Bbox.from_extents(min(x0, x1) - 1, min(y0, y1) - 1, max(x0, x1) + 1, max(y0, y1) + 1)


def _within(box: Bbox, outer: Bbox) -> bool:
    return outer.x0 <= box.x0 and box.x1 <= outer.x1 and outer.y0 <= box.y0 and box.y1 <= outer.y1
