"""The memory/throughput scatter of a run: every ok point, the Pareto front, the budget, the winner."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from ckptbench.analysis.recommend import Recommendation, RecommendCandidate, candidates, pareto_front
from ckptbench.plots.labels import Label, place_labels
from ckptbench.plots.style import PlotData, empty_note, legend_batches, plain_text, save, suptitle
from ckptbench.results.store import Run
from ckptbench.units import SizeUnit

BEST_RING = 420.0  # area (points^2) of the ring around the recommended point


@plain_text
def plot_tradeoff(run: Run, path: Path, *, rec: Recommendation | None = None, size: SizeUnit | None = None) -> Path:
    """Scatter of needed memory (peak reserved + CUDA context) against tokens/s, the Pareto front, the budget
    and the winner."""
    return save(tradeoff_figure(run, rec=rec, size=size), path)


@plain_text
def tradeoff_figure(run: Run, *, rec: Recommendation | None = None, size: SizeUnit | None = None) -> Figure:
    """The scatter as a Figure: one colour and marker per layout, marker size by batch, labels that never overlap."""
    data = PlotData(run, size=size)
    cands = candidates(run, seq_len=rec.seq_len if rec is not None else None)
    front = pareto_front(cands)
    fig = Figure(figsize=(11.5, 6.8), layout="constrained")
    ax = fig.subplots()
    if not cands:
        empty_note(ax, "no point finished ok: nothing to plot")
    area = _marker_areas(data, cands)
    # One scatter per layout (its colour and marker; the batch in each marker's size), not one per point: a
    # collection per point made a 1,000-point report spend seconds in matplotlib for the same picture.
    for lay, group in by_layout(cands).items():
        ax.scatter([data.size.value(c.memory_bytes) for c in group], [c.tokens_per_s for c in group],
                   color=data.layout_color[lay], marker=data.layout_marker[lay],
                   s=[area[c.key.get("batch_size")] for c in group], edgecolor="black", linewidth=0.5, zorder=3)
    ax.step([data.size.value(c.memory_bytes) for c in front], [c.tokens_per_s for c in front], where="post",
            color="black", linewidth=1.2, zorder=2, label="Pareto front")
    if rec is not None:
        _budget_marks(ax, rec, data.size)
    ax.margins(x=0.08, y=0.1)
    # The x value is what must fit (results/fit.py): peak reserved alone only without a CUDA context.
    counted = any(c.context_bytes for c in cands)
    ax.set_xlabel(f"needed: peak reserved + CUDA context ({data.unit})" if counted else f"peak reserved ({data.unit})")
    ax.set_ylabel("throughput (tokens/s)")
    ax.grid(alpha=0.3)
    _tradeoff_legend(ax, data, cands, area)
    seq = f", seq {rec.seq_len}" if rec is not None and rec.seq_len is not None else ""
    suptitle(fig, run, f"Memory against throughput (ok points{seq})")
    _label_points(fig, ax, data, cands, front, best=rec.best if rec is not None else None, area=area)
    return fig


def by_layout(cands: Sequence[RecommendCandidate]) -> dict[str, list[RecommendCandidate]]:
    """The candidates of each layout, in the order of the candidates (the layouts by first appearance): the
    scatters the plot draws, one per layout."""
    groups: dict[str, list[RecommendCandidate]] = {}
    for c in cands:
        groups.setdefault(c.layout, []).append(c)
    return groups


def _marker_areas(data: PlotData, cands: Sequence[RecommendCandidate]) -> dict[Any, float]:
    """Larger markers for larger batches (in points^2), in the order of the run's batch sizes."""
    shown = [b for b in data.batches if any(c.key.get("batch_size") == b for c in cands)]
    return {b: 40.0 + 45.0 * i for i, b in enumerate(shown)}


def _label_points(
    fig: Figure, ax: Axes, data: PlotData, cands: Sequence[RecommendCandidate], front: Sequence[RecommendCandidate], *,
    best: RecommendCandidate | None, area: dict[Any, float],
) -> None:
    """Name points where there is room: the recommended one first, then the Pareto front, then the rest
    by speed; a label that would cover another label or a point is left out (the legend still names it)."""
    order = [*([best] if best is not None else []), *front, *sorted(cands, key=lambda c: -c.tokens_per_s)]
    one_seq = len({c.key.get("seq_len") for c in cands}) == 1  # then the title names it
    seen: set[int] = set()
    labels = []
    for c in order:
        if c.index in seen:
            continue
        seen.add(c.index)
        text = c.label.replace(f" s={c.key.get('seq_len')}", "") if one_seq else c.label
        radius = (BEST_RING if c is best else area[c.key.get("batch_size")]) ** 0.5 / 2
        labels.append(Label(data.size.value(c.memory_bytes), c.tokens_per_s, text, radius=radius, bold=c is best))
    place_labels(fig, ax, labels, lines=[_staircase(front, data.size)])


def _staircase(front: Sequence[RecommendCandidate], size: SizeUnit) -> list[tuple[float, float]]:
    """The vertices of the Pareto front as ax.step(where='post') draws it."""
    vertices: list[tuple[float, float]] = []
    for a, b in itertools.pairwise(front):
        vertices += [(size.value(a.memory_bytes), a.tokens_per_s), (size.value(b.memory_bytes), a.tokens_per_s)]
    if front:
        vertices.append((size.value(front[-1].memory_bytes), front[-1].tokens_per_s))
    return vertices


def _budget_marks(ax: Axes, rec: Recommendation, size: SizeUnit) -> None:
    ax.axvline(size.value(rec.budget_bytes), color="#c44e52", linestyle="--", linewidth=1.2,
               label=f"budget {size(rec.budget_bytes)}")
    if rec.headroom_bytes:
        ax.axvspan(size.value(rec.limit_bytes), size.value(rec.budget_bytes), color="#c44e52", alpha=0.12,
                   label=f"headroom {size(rec.headroom_bytes)}")
    if rec.best is not None:
        b = rec.best
        ax.scatter(size.value(b.memory_bytes), b.tokens_per_s, s=BEST_RING, facecolor="none", edgecolor="#c44e52",
                   linewidth=2, zorder=4, label="best under budget")


def _tradeoff_legend(ax: Axes, data: PlotData, cands: Sequence[RecommendCandidate], area: dict[Any, float]) -> None:
    """One legend outside the axes: the lines, then each layout's colour and marker, then batch sizes."""
    handles, labels = ax.get_legend_handles_labels()
    blank = Line2D([], [], linestyle="")
    handles.append(blank)
    labels.append("layout")
    for lay in (lay for lay in data.layouts if any(c.layout == lay for c in cands)):
        handles.append(Line2D([], [], color=data.layout_color[lay], marker=data.layout_marker[lay], linestyle="",
                              markeredgecolor="black", markersize=8))
        labels.append(lay)
    handles.append(blank)
    shown = legend_batches(list(area))
    labels.append("batch size (marker size)" if len(shown) == len(area)
                  else f"batch size (marker size; {len(shown)} of {len(area)} named)")
    for b in shown:
        handles.append(Line2D([], [], color="#bbbbbb", marker="o", linestyle="", markeredgecolor="black",
                              markersize=area[b]**0.5))
        labels.append(f"batch {b}")
    ax.legend(handles, labels, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), labelspacing=0.9)
