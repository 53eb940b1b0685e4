"""PNG plots of a run (matplotlib Figure + Agg, no pyplot state): peak memory bars, relative speed dots.

The memory/throughput scatter lives in tradeoff_plot.py, the memory breakdown in breakdown_plot.py;
report.write_plots draws all four.

Only points that finished ok are drawn as values; out-of-memory and skipped points are marked
as text in their slot, so a missing bar is never mistaken for a zero.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter
from matplotlib.transforms import blended_transform_factory

from ckptbench.plots.style import (
    PlotData,
    PlotRow,
    batches_title,
    is_number,
    legend_batches,
    plain_text,
    save,
    suptitle,
)
from ckptbench.results.store import Run
from ckptbench.units import SizeUnit


def _scaled(n: Any, data: PlotData) -> float | None:
    """A size in the plot's unit; None for a point that recorded none (an ok record may lack its peaks)."""
    return n / data.scale if is_number(n) else None


def first_rows(rows: list[PlotRow]) -> dict[tuple[Any, Any], PlotRow]:
    """The first row of each (layout, batch size): what a scan for the first match would find, in one pass."""
    cells: dict[tuple[Any, Any], PlotRow] = {}
    for r in rows:
        cells.setdefault((r.layout, r.batch_size), r)
    return cells


def _grouped_bars(
    ax: Axes, data: PlotData, rows: list[PlotRow], value: Any, *, err: Any = None
) -> None:
    """One group per layout, one bar per batch size; non-ok points leave a labelled slot."""
    layouts = [lay for lay in data.layouts if any(r.layout == lay for r in rows)]
    width = 0.8 / max(len(data.batches), 1)
    cells = first_rows(rows)
    for j, batch in enumerate(data.batches):
        xs: list[float] = []
        heights: list[float] = []
        errs: list[Any] = []
        for i, lay in enumerate(layouts):
            row = cells.get((lay, batch))
            if row is None:
                continue
            x = i - 0.4 + width * (j + 0.5)
            if row.status == "ok" and is_number(value(row)):
                xs.append(x)
                heights.append(value(row))
                errs.append(err(row) if err is not None else None)
            else:
                color = "#c44e52" if row.status == "oom" else "#777777"
                ax.text(x, 0, f" {row.status.upper()}", rotation=90, ha="center", va="bottom",
                        fontsize=7, color=color, fontweight="bold")
        if xs:  # one call per batch size (its colour), not one per bar: the same bars, drawn much quicker
            yerr = None if all(e is None for e in errs) else errs
            ax.bar(xs, heights, width, color=data.batch_color[batch], yerr=yerr, capsize=2)
    ax.set_xticks(range(len(layouts)), layouts, rotation=30 if len(layouts) > 5 else 0, ha="right")
    ax.set_xlim(-0.6, len(layouts) - 0.4)
    ax.set_ylim(bottom=0)  # bars start at zero; OOM/SKIPPED marks sit there
    ax.grid(axis="y", alpha=0.3)


def _batch_legend(ax: Axes, data: PlotData, rows: list[PlotRow]) -> None:
    """Any labelled lines of the axes (budget, card), then the colours of the batch sizes shown."""
    handles, labels = ax.get_legend_handles_labels()
    present = {r.batch_size for r in rows}
    ran = [b for b in data.batches if b in present]
    shown = legend_batches(ran)
    handles += [Line2D([], [], color=data.batch_color[b], marker="s", ls="", markersize=9) for b in shown]
    labels += [f"batch {b}" for b in shown]
    ax.legend(handles, labels, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0),
              title=batches_title(len(shown), len(ran)), title_fontsize=8)


def _hline(ax: Axes, y: float, label: str, color: str, style: str) -> None:
    ax.axhline(y, color=color, linestyle=style, linewidth=1.2, label=label)
    ax.set_ylim(top=max(ax.get_ylim()[1], y * 1.06))


def _width(data: PlotData) -> float:
    return min(16.0, max(9.0, 0.35 * len(data.layouts) * max(len(data.batches), 2)))


@plain_text
def plot_peak_memory(run: Run, path: Path, *, budget_bytes: int | None = None, size: SizeUnit | None = None) -> Path:
    """Grouped bars: peak reserved memory per layout and batch size, with the budget and the card."""
    data = PlotData(run, size=size)
    facets = data.facets()
    fig = Figure(figsize=(_width(data), 3.8 * len(facets)), layout="constrained")
    axes = fig.subplots(len(facets), 1, squeeze=False)[:, 0]
    total = run.environment.gpu_total_memory_bytes
    for ax, (label, rows) in zip(axes, facets, strict=True):
        _grouped_bars(ax, data, rows, lambda r: _scaled(r.peak_reserved_bytes, data))
        ax.set_ylabel(f"peak reserved ({data.unit})")
        ax.set_title(label or None, fontsize=10)
        if total:
            _hline(ax, total / data.scale, f"{run.environment.gpu_name or 'GPU'}: {data.size(total)}",
                   "#555555", ":")
        if budget_bytes:
            _hline(ax, budget_bytes / data.scale, f"budget {data.size(budget_bytes)}", "#c44e52", "--")
        _batch_legend(ax, data, rows)
    suptitle(fig, run, "Peak reserved memory per layout and batch size")
    return save(fig, path)


@plain_text
def plot_speed(run: Run, path: Path, *, size: SizeUnit | None = None) -> Path:
    """Throughput of each point relative to `none` at the same batch size (and other axes): one dot per
    point, so a batch-8 step of 1.8 s does not squash the difference between 388 and 493 ms at batch 2."""
    data = PlotData(run, size=size)
    facets = data.facets()
    fig = Figure(figsize=(_width(data), 3.9 * len(facets) + 0.6), layout="constrained")
    axes = fig.subplots(len(facets), 1, squeeze=False)[:, 0]
    for ax, (label, rows) in zip(axes, facets, strict=True):
        refs = speed_references(rows)
        _relative_dots(ax, data, rows, refs)
        ax.axhline(1.0, color="#555555", linewidth=1, linestyle=":")
        ax.set_ylabel("tokens/s relative to the reference")
        where = f" ({label})" if label else ""
        ax.set_title(f"Throughput against `none` at the same batch size{where}; error bar: inter-quartile "
                     "range of the point's step times", fontsize=9.5)
        handles, texts, title = _reference_legend(data, rows, refs)
        ax.legend(handles, texts, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), title=title,
                  title_fontsize=8)
    suptitle(fig, run, "Speed relative to no checkpointing")
    return save(fig, path)


def speed_references(rows: list[PlotRow]) -> dict[Any, PlotRow]:
    """Per batch size: the `none` point when it ran ok, else the fastest ok point (named in the legend)."""
    refs: dict[Any, PlotRow] = {}
    for batch in dict.fromkeys(r.batch_size for r in rows):
        ok = [r for r in rows if r.batch_size == batch and r.status == "ok" and is_number(r.tokens_per_s)]
        none = next((r for r in ok if r.layout == "none"), None)
        fastest = max(ok, key=lambda r: r.tokens_per_s or 0.0, default=None)  # ok: each has a rate
        if none is not None or fastest is not None:
            refs[batch] = none if none is not None else fastest  # type: ignore[assignment]
    return refs


def _relative_dots(ax: Axes, data: PlotData, rows: list[PlotRow], refs: dict[Any, PlotRow]) -> None:
    layouts = [lay for lay in data.layouts if any(r.layout == lay for r in rows)]
    width = 0.8 / max(len(data.batches), 1)
    cells = first_rows(rows)
    below = blended_transform_factory(ax.transData, ax.transAxes)
    for j, batch in enumerate(data.batches):
        xs: list[float] = []
        rels: list[float] = []
        lows: list[float] = []
        highs: list[float] = []
        for i, lay in enumerate(layouts):
            row = cells.get((lay, batch))
            x = i - 0.4 + width * (j + 0.5)
            if row is None:
                continue
            ref = refs.get(batch)
            if row.status != "ok" or ref is None or not is_number(row.tokens_per_s):
                ax.text(x, 0.02, row.status.upper(), transform=below, rotation=90, ha="center", va="bottom",
                        fontsize=7, fontweight="bold", color="#c44e52" if row.status == "oom" else "#777777")
                continue
            rel, (low, high) = _relative(row, ref)
            xs.append(x)
            rels.append(rel)
            lows.append(rel - low)
            highs.append(high - rel)
        if xs:  # one errorbar per batch size (its colour), not one per point: the same dots, drawn much quicker
            ax.errorbar(xs, rels, yerr=[lows, highs], fmt="o", color=data.batch_color[batch], markersize=6,
                        capsize=2, markeredgecolor="black", markeredgewidth=0.4)
    ax.set_xticks(range(len(layouts)), layouts, rotation=30 if len(layouts) > 5 else 0,
                  ha="right" if len(layouts) > 5 else "center")
    ax.set_xlim(-0.6, len(layouts) - 0.4)
    ax.margins(y=0.15)  # a ratio axis: it need not start at zero, and the status marks sit at the bottom
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.2f}x"))
    ax.grid(axis="y", alpha=0.3)


def _relative(row: PlotRow, ref: PlotRow) -> tuple[float, tuple[float, float]]:
    """tokens/s over the reference's, and the range from the point's own step-time quartiles."""
    # Drawn only for an ok row with a rate, against a reference with one (speed_references): a median too.
    assert row.tokens_per_s is not None and ref.tokens_per_s is not None and row.median_step_time_s is not None
    rel = row.tokens_per_s / ref.tokens_per_s
    q = row.quartiles_s
    med = row.median_step_time_s
    if q is None or not q[0] or not q[1]:
        return rel, (rel, rel)
    return rel, (rel * med / q[1], rel * med / q[0])  # a slower step (third quartile) is the lower end


def _reference_legend(
    data: PlotData, rows: list[PlotRow], refs: dict[Any, PlotRow]
) -> tuple[list[Any], list[str], str | None]:
    """The reference line, then each batch's colour and reference (a batch whose reference is not `none` is
    always named; past LEGEND_BATCHES the others are an even spread), and the legend's title."""
    handles: list[Any] = [Line2D([], [], color="#555555", linestyle=":")]
    labels = ["1.00x = the reference"]
    present = {r.batch_size for r in rows}
    ran = [b for b in data.batches if b in present]
    spread = set(legend_batches(ran))
    named = [b for b in ran if b in spread or b not in refs or refs[b].layout != "none"]
    for batch in named:
        ref = refs.get(batch)
        if ref is None:
            text = f"batch {batch}: nothing ran"
        elif ref.layout == "none":
            text = f"batch {batch}: vs none ({ref.tokens_per_s:,.0f} tok/s)"
        else:
            text = f"batch {batch}: vs {ref.layout} (none did not run)"
        handles.append(Line2D([], [], color=data.batch_color[batch], marker="o", ls="", markersize=7,
                              markeredgecolor="black", markeredgewidth=0.4))
        labels.append(text)
    return handles, labels, batches_title(len(named), len(ran))
