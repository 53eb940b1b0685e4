"""The per-layer section of report.md: saving and cost per checkpointed layer, ordering, where memory goes.

Markdown tables of what analysis/layer_series.py and analysis/memory_split.py computed, and the plot
of memory and step time against the number of checkpointed layers (plots/layers.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ckptbench.analysis.layer_series import CellSeries, Interval, layer_series
from ckptbench.analysis.memory_split import MemorySplit, memory_splits
from ckptbench.render.tables import markdown_table
from ckptbench.results.store import Run
from ckptbench.units import GIB_UNIT, SizeUnit

LAYERS_PLOT = "layers.png"
INTERVAL_COLUMNS = ("cell", "family", "from", "to", "layers", "saved alloc./layer", "saved res./layer",
                    "step ms/layer", "noise ms")
ORDER_COLUMNS = ("cell", "k", "layouts, lowest peak first (allocated)", "spread")
SPLIT_COLUMNS = ("cell", "layout", "params", "grads", "optimizer", "activation", "allocator cache", "peak reserved",
                 "activation share")
_RIGHT = {"layers", "saved alloc./layer", "saved res./layer", "step ms/layer", "noise ms", "k", "spread", "params",
          "grads", "optimizer", "activation", "allocator cache", "peak reserved", "activation share"}


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:+.2f}"


def _interval_row(cell: str, family: str, i: Interval, size: SizeUnit = GIB_UNIT) -> dict[str, str]:
    noisy = abs(i.time_per_layer_s * i.layers) <= i.time_noise_s  # the whole difference is inside the spread
    return {
        "cell": cell, "family": family, "from": i.layout_from, "to": i.layout_to, "layers": str(i.layers),
        "saved alloc./layer": size(i.saved_allocated_per_layer),
        "saved res./layer": size(i.saved_reserved_per_layer),
        "step ms/layer": _ms(i.time_per_layer_s) + (" (noise)" if noisy else ""),
        "noise ms": f"{i.time_noise_s * 1e3:.1f}",
    }


def interval_table(cells: Sequence[CellSeries], *, size: SizeUnit = GIB_UNIT) -> str:
    """Per cell and family: what each added checkpointed layer saved and cost, between measured layouts."""
    rows = []
    for cell in cells:
        for s in cell.series:
            rows += [_interval_row(cell.label, s.family, i, size) for i in s.intervals]
        if cell.overall is not None:
            rows.append(_interval_row(cell.label, "none -> all", cell.overall, size))
    if not rows:
        return "No cell has a measured series (none/all plus first:k, last:k or every:n at one batch).\n"
    return markdown_table(rows, INTERVAL_COLUMNS, right=_RIGHT)


def fit_lines(cells: Sequence[CellSeries], *, size: SizeUnit = GIB_UNIT) -> str:
    """The least-squares slopes, where a family has three or more points."""
    lines = []
    for cell in cells:
        for s in cell.series:
            if s.fit_saved_allocated_per_layer is not None and s.fit_time_per_layer_s is not None:
                lines.append(f"- {cell.label}, {s.family}: {size(s.fit_saved_allocated_per_layer)} allocated "
                             f"saved and {_ms(s.fit_time_per_layer_s)} ms per layer (least-squares fit over "
                             f"{len(s.points)} points)")
    return "\n".join(lines) + ("\n" if lines else "")


def ordering_table(cells: Sequence[CellSeries], *, size: SizeUnit = GIB_UNIT) -> str:
    """Whole-layer layouts with the same number of checkpointed layers: which layers matters."""
    rows = [
        {"cell": cell.label, "k": str(row.k),
         "layouts, lowest peak first (allocated)": ", ".join(f"{p.layout} {size(p.peak_allocated_bytes)}"
                                                            for p in row.points),
         "spread": size(row.spread_allocated_bytes)}
        for cell in cells for row in cell.ordering
    ]
    if not rows:
        return "No two whole-layer layouts with the same number of checkpointed layers ran in one cell.\n"
    return markdown_table(rows, ORDER_COLUMNS, right=_RIGHT)


def split_table(splits: Sequence[MemorySplit], *, size: SizeUnit = GIB_UNIT) -> str:
    """Where the memory goes: static part, activation part and the allocator's cache, per batch."""
    rows = [
        {"cell": s.cell, "layout": s.layout, "params": size(s.params_bytes), "grads": size(s.grads_bytes),
         "optimizer": size(s.optimizer_state_bytes), "activation": size(s.activation_bytes),
         "allocator cache": size(s.cache_bytes), "peak reserved": size(s.peak_reserved_bytes),
         "activation share": f"{s.activation_share:.1%}"}
        for s in splits
    ]
    if not rows:
        return "No point recorded its static part (parameters, gradients, optimizer state).\n"
    return markdown_table(rows, SPLIT_COLUMNS, right=_RIGHT)


SECTION_INTRO = (
    "Per cell (every key axis but the layout), the whole-layer layouts of one family (`first:k`, `last:k`, "
    "`every:n`, `range:a-b`) with `none` (k = 0) and `all` (k = L) as the ends. Between two measured layouts the "
    "difference of their peaks over the difference of their layer counts is what each added checkpointed layer "
    "saved, and the difference of their median step times what it cost; \"(noise)\" marks a time difference "
    "inside the larger step-time spread (IQR) of the two. The peak is not linear in k: once enough layers are "
    "checkpointed it moves from the start of the backward pass to the optimizer step, and more layers save little."
)
SPLIT_INTRO = (
    "Static part (parameters, gradients, optimizer state) and the activation part (peak allocated above the "
    "static part: a lower bound, since at the peak the gradients are usually only partly allocated), and what the "
    "allocator reserved above the peak allocated bytes, for the least and the most checkpointed layout of each cell."
)


def layer_section(
    run: Run, out_dir: Path, *, limit_bytes: int | None = None, size: SizeUnit = GIB_UNIT
) -> tuple[str, Path | None]:
    """The report's per-layer section and its plot (None when the run has no series to draw); sizes in ``size``,
    the report's one unit."""
    from ckptbench.plots.layers import plot_layers  # matplotlib only when a plot is written

    cells = layer_series(run)
    plot = plot_layers(cells, out_dir / LAYERS_PLOT, title=run.name, limit_bytes=limit_bytes) if cells else None
    parts = ["## Checkpointing per layer\n", SECTION_INTRO + "\n", "### Saving and cost per checkpointed layer\n",
             interval_table(cells, size=size), fit_lines(cells, size=size),
             "### Which layers: equal k, different layers\n", ordering_table(cells, size=size),
             "### Where the memory goes\n", SPLIT_INTRO + "\n", split_table(memory_splits(run), size=size)]
    if plot is not None:
        parts.append(f"![Memory and step time against checkpointed layers]({plot.name})\n")
    return "\n".join(parts), plot
