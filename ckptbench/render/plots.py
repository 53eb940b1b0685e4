"""PNG bar plots of a run (matplotlib Figure + Agg, no pyplot state): peak memory, speed, breakdown.

The memory/throughput scatter lives in tradeoff_plot.py; report.write_plots draws all four.

Only points that finished ok are drawn as values; out-of-memory and skipped points are marked
as text in their slot, so a missing bar is never mistaken for a zero.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from ckptbench.analysis.recommend import BREAKDOWN, Candidate, candidates
from ckptbench.render.plot_style import PlotData, empty_note, is_number, save, short_axis
from ckptbench.results.store import Run
from ckptbench.units import fmt_bytes

PART_COLORS = ("#4c72b0", "#8da0cb", "#dd8452", "#55a868")


def _grouped_bars(
    ax: Axes, data: PlotData, rows: list[dict[str, Any]], value: Any, *, err: Any = None
) -> None:
    """One group per layout, one bar per batch size; non-ok points leave a labelled slot."""
    layouts = [lay for lay in data.layouts if any(r["layout"] == lay for r in rows)]
    width = 0.8 / max(len(data.batches), 1)
    for j, batch in enumerate(data.batches):
        for i, lay in enumerate(layouts):
            row = next((r for r in rows if r["layout"] == lay and r["batch_size"] == batch), None)
            if row is None:
                continue
            x = i - 0.4 + width * (j + 0.5)
            if row["status"] == "ok" and is_number(value(row)):
                yerr = err(row) if err is not None else None
                ax.bar(x, value(row), width, color=data.batch_color[batch], yerr=yerr, capsize=2)
            else:
                color = "#c44e52" if row["status"] == "oom" else "#777777"
                ax.text(x, 0, f" {row['status'].upper()}", rotation=90, ha="center", va="bottom",
                        fontsize=7, color=color, fontweight="bold")
    ax.set_xticks(range(len(layouts)), layouts, rotation=30 if len(layouts) > 5 else 0, ha="right")
    ax.set_xlim(-0.6, len(layouts) - 0.4)
    ax.set_ylim(bottom=0)  # bars start at zero; OOM/SKIPPED marks sit there
    ax.grid(axis="y", alpha=0.3)


def _batch_legend(ax: Axes, data: PlotData, rows: list[dict[str, Any]]) -> None:
    """Any labelled lines of the axes (budget, card), then the colours of the batch sizes shown."""
    handles, labels = ax.get_legend_handles_labels()
    shown = [b for b in data.batches if any(r["batch_size"] == b for r in rows)]
    handles += [Line2D([], [], color=data.batch_color[b], marker="s", ls="", markersize=9) for b in shown]
    labels += [f"batch {b}" for b in shown]
    ax.legend(handles, labels, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))


def _hline(ax: Axes, y: float, label: str, color: str, style: str) -> None:
    ax.axhline(y, color=color, linestyle=style, linewidth=1.2, label=label)
    ax.set_ylim(top=max(ax.get_ylim()[1], y * 1.06))


def _width(data: PlotData) -> float:
    return min(16.0, max(9.0, 0.35 * len(data.layouts) * max(len(data.batches), 2)))


def plot_peak_memory(run: Run, path: Path, *, budget_bytes: int | None = None) -> Path:
    """Grouped bars: peak reserved memory per layout and batch size, with the budget and the card."""
    data = PlotData(run)
    facets = data.facets()
    fig = Figure(figsize=(_width(data), 3.8 * len(facets)), layout="constrained")
    axes = fig.subplots(len(facets), 1, squeeze=False)[:, 0]
    total = run.environment.get("gpu_total_memory_bytes")
    for ax, (label, rows) in zip(axes, facets, strict=True):
        _grouped_bars(ax, data, rows, lambda r: r["peak_reserved_bytes"] / data.scale)
        ax.set_ylabel(f"peak reserved ({data.unit})")
        ax.set_title(label or None, fontsize=10)
        if total:
            _hline(ax, total / data.scale, f"{run.environment.get('gpu_name') or 'GPU'}: {fmt_bytes(total)}",
                   "#555555", ":")
        if budget_bytes:
            _hline(ax, budget_bytes / data.scale, f"budget {fmt_bytes(budget_bytes)}", "#c44e52", "--")
        _batch_legend(ax, data, rows)
    fig.suptitle(f"Peak reserved memory per layout and batch size: {run.name}", fontsize=12)
    return save(fig, path)


def plot_speed(run: Run, path: Path) -> Path:
    """Step time (median; error bar: inter-quartile range) and tokens/s per layout and batch size."""
    data = PlotData(run)
    facets = data.facets()
    fig = Figure(figsize=(_width(data), 3.4 * 2 * len(facets)), layout="constrained")
    axes = fig.subplots(2 * len(facets), 1, squeeze=False)[:, 0]
    for i, (label, rows) in enumerate(facets):
        ax_t, ax_s = axes[2 * i], axes[2 * i + 1]
        where = f" ({label})" if label else ""
        _grouped_bars(ax_t, data, rows, lambda r: r["median_step_time_s"] * 1e3, err=_iqr_ms)
        ax_t.set_ylabel("median step time (ms)")
        ax_t.set_title(f"Step time{where}, error bar: inter-quartile range", fontsize=10)
        _grouped_bars(ax_s, data, rows, lambda r: r["tokens_per_s"])
        ax_s.set_ylabel("throughput (tokens/s)")
        ax_s.set_title(f"Tokens/s{where}", fontsize=10)
        _batch_legend(ax_t, data, rows)
        _batch_legend(ax_s, data, rows)
    fig.suptitle(f"Step time and throughput per layout: {run.name}", fontsize=12)
    return save(fig, path)


def _iqr_ms(row: dict[str, Any]) -> list[list[float]] | None:
    """Error bar from the median down to the first and up to the third quartile, in ms."""
    q = row.get("quartiles_s")
    if q is None:
        return None
    med = row["median_step_time_s"]
    return [[max(0.0, med - q[0]) * 1e3], [max(0.0, q[1] - med) * 1e3]]


def reference_shape(run: Run) -> dict[str, Any] | None:
    """The non-layout part of the key with the most ok layouts (ties: the most tokens per step)."""
    counts: dict[str, tuple[int, int, dict[str, Any]]] = {}
    for p in run.points:
        shape = {k: v for k, v in p.key.items() if k != "layout"}
        sig = repr(sorted(shape.items()))
        n = counts.get(sig, (0, 0, shape))[0]
        counts[sig] = (n + p.ok, p.tokens_per_step or 0, shape)
    best = max(counts.values(), key=lambda t: (t[0], t[1]), default=None)
    return None if best is None or best[0] == 0 else best[2]


def plot_breakdown(run: Run, path: Path, *, budget_bytes: int | None = None) -> Path:
    """Stacked bars per layout at one shared shape: params, grads, optimizer state, activation, cache."""
    data = PlotData(run)
    shape = reference_shape(run)
    by_layout = {c.layout: c for c in candidates(run) if shape and {k: c.key.get(k) for k in shape} == shape}
    fig = Figure(figsize=(max(9.0, 0.9 * len(data.layouts) + 3), 5.4), layout="constrained")
    ax = fig.subplots()
    if shape is None:
        empty_note(ax, "no point finished ok: nothing to break down")
        shape = {}
    for i, lay in enumerate(data.layouts if by_layout else []):
        c = by_layout.get(lay)
        if c is not None:
            _stack(ax, i, c, data.scale, data.unit)
            continue
        key = {**shape, "layout": lay}
        status = next((p.status for p in run.points if p.key == key), "not run")
        ax.text(i, 0, f" {str(status).upper()}", rotation=90, ha="center", va="bottom", fontsize=8,
                color="#c44e52", fontweight="bold")
    ax.set_xticks(range(len(data.layouts)), data.layouts, rotation=30 if len(data.layouts) > 5 else 0,
                  ha="right" if len(data.layouts) > 5 else "center")
    ax.set_xlim(-0.6, len(data.layouts) - 0.4)
    ax.set_ylabel(f"memory at peak ({data.unit})")
    ax.grid(axis="y", alpha=0.3)
    ax.margins(y=0.08)
    ax.set_ylim(bottom=0)
    if budget_bytes:
        _hline(ax, budget_bytes / data.scale, f"budget {fmt_bytes(budget_bytes)}", "#c44e52", "--")
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))  # one entry per part, top of the stack first
    ax.legend(list(unique.values())[::-1], list(unique)[::-1], fontsize=8, loc="upper left",
              bbox_to_anchor=(1.01, 1.0), title="numbers: peak reserved", title_fontsize=8)
    names = ["batch_size", "seq_len", *(n for n in data.facet_axes if n != "seq_len")]
    where = ", ".join(f"{short_axis(n)} {shape[n]}" for n in names if n in shape)
    where = f" ({where})" if where else ""
    fig.suptitle(f"Memory breakdown at the peak, per layout{where}: {run.name}", fontsize=12)
    return save(fig, path)


def _stack(ax: Axes, x: int, c: Candidate, scale: int, unit: str) -> None:
    bottom = 0.0
    for (name, label), color in zip(BREAKDOWN, PART_COLORS, strict=True):
        height = c.breakdown[name] / scale
        ax.bar(x, height, 0.6, bottom=bottom, color=color, label=label)
        bottom += height
    cache = max(0, c.memory_bytes - c.peak_allocated_bytes) / scale
    if cache > 0:
        ax.bar(x, cache, 0.6, bottom=bottom, color="white", edgecolor="#999999", hatch="///",
               label="reserved, not allocated")
    ax.annotate(f"{c.memory_bytes / scale:.1f} {unit}", (x, bottom + cache), xytext=(0, 2),
                textcoords="offset points", ha="center", va="bottom", fontsize=8)
