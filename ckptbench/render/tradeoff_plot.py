"""The memory/throughput scatter of a run: every ok point, the Pareto front, the budget, the winner."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from ckptbench.analysis.recommend import Candidate, Recommendation, candidates, pareto_front
from ckptbench.render.plot_style import PlotData, empty_note, save
from ckptbench.results.store import Run
from ckptbench.units import fmt_bytes

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "h", "<", ">")


def plot_tradeoff(run: Run, path: Path, *, rec: Recommendation | None = None) -> Path:
    """Scatter of peak reserved memory against tokens/s, the Pareto front, the budget and the winner."""
    data = PlotData(run)
    cands = candidates(run, seq_len=rec.seq_len if rec is not None else None)
    front = pareto_front(cands)
    fig = Figure(figsize=(11, 6.4), layout="constrained")
    ax = fig.subplots()
    if not cands:
        empty_note(ax, "no point finished ok: nothing to plot")
    marker = {b: MARKERS[i % len(MARKERS)] for i, b in enumerate(data.batches)}
    for c in cands:
        ax.scatter(c.memory_bytes / data.scale, c.tokens_per_s, color=data.layout_color[c.layout],
                   marker=marker[c.key.get("batch_size")], s=46, edgecolor="black", linewidth=0.4, zorder=3)
    ax.step([c.memory_bytes / data.scale for c in front], [c.tokens_per_s for c in front], where="post",
            color="black", linewidth=1.2, zorder=2, label="Pareto front")
    if rec is not None:
        _budget_marks(ax, rec, data.scale)
    ax.margins(x=0.06, y=0.1)
    _label_front(ax, front, data.scale, keep=rec.best if rec is not None else None)
    ax.set_xlabel(f"peak reserved memory ({data.unit})")
    ax.set_ylabel("throughput (tokens/s)")
    ax.grid(alpha=0.3)
    _tradeoff_legend(ax, data, marker, {c.key.get("batch_size") for c in cands})
    seq = f", seq {rec.seq_len}" if rec is not None and rec.seq_len is not None else ""
    fig.suptitle(f"Memory against throughput (ok points{seq}): {run.name}", fontsize=12)
    return save(fig, path)


def _label_front(ax: Axes, front: Sequence[Candidate], scale: int, *, keep: Candidate | None) -> None:
    """Name front points up and to the left, where no point can be (it would dominate them);
    skip a label that would sit on the previous one."""
    to_axes = ax.transData + ax.transAxes.inverted()
    last: tuple[float, float] | None = None
    for c in front:
        x, y = to_axes.transform((c.memory_bytes / scale, c.tokens_per_s))
        crowded = last is not None and abs(y - last[1]) < 0.04 and abs(x - last[0]) < 0.3
        if crowded and c is not keep:
            continue
        near_left = x < 0.2  # no room on the left: below and to the right instead
        ax.annotate(c.label, (c.memory_bytes / scale, c.tokens_per_s), textcoords="offset points",
                    xytext=(6, -11) if near_left else (-5, 5), ha="left" if near_left else "right",
                    fontsize=7.5, color="#222222", fontweight="bold" if c is keep else "normal")
        last = (x, y)


def _budget_marks(ax: Axes, rec: Recommendation, scale: int) -> None:
    ax.axvline(rec.budget_bytes / scale, color="#c44e52", linestyle="--", linewidth=1.2,
               label=f"budget {fmt_bytes(rec.budget_bytes)}")
    if rec.headroom_bytes:
        ax.axvspan(rec.limit_bytes / scale, rec.budget_bytes / scale, color="#c44e52", alpha=0.12,
                   label=f"headroom {fmt_bytes(rec.headroom_bytes)}")
    if rec.best is not None:
        b = rec.best
        ax.scatter(b.memory_bytes / scale, b.tokens_per_s, s=320, facecolor="none", edgecolor="#c44e52",
                   linewidth=2, zorder=4, label="best under budget")


def _tradeoff_legend(ax: Axes, data: PlotData, marker: dict[Any, str], batches: set[Any]) -> None:
    """One legend outside the axes: the lines, then layout colours, then batch-size markers."""
    handles, labels = ax.get_legend_handles_labels()
    blank = Line2D([], [], linestyle="")
    handles.append(blank)
    labels.append("layout (colour)")
    for lay, color in data.layout_color.items():
        handles.append(Line2D([], [], color=color, marker="o", linestyle="", markeredgecolor="black"))
        labels.append(lay)
    handles.append(blank)
    labels.append("batch size (marker)")
    for b in (b for b in data.batches if b in batches):
        handles.append(Line2D([], [], color="grey", marker=marker[b], linestyle=""))
        labels.append(f"batch {b}")
    ax.legend(handles, labels, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
