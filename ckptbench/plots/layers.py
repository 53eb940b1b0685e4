"""Memory and step time against the number of checkpointed layers (first:k vs last:k vs every:n), and the
saving per checkpointed layer against the batch size. One PNG; matplotlib Figure + Agg, no pyplot state."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.figure import Figure

from ckptbench.analysis.layer_series import CellSeries, Series
from ckptbench.plots.style import empty_note, plain_text, save
from ckptbench.units import GIB

FAMILY_STYLE = {"first": ("#4c72b0", "o"), "last": ("#dd8452", "s"), "every": ("#55a868", "^"),
                "range": ("#8172b3", "D"), "layers": ("#937860", "v")}
MAX_CELLS = 6  # columns; a run with more cells shows those with the most measured layouts


def _pick(cells: Sequence[CellSeries]) -> list[CellSeries]:
    if len(cells) <= MAX_CELLS:
        return list(cells)
    ranked = sorted(cells, key=lambda c: -sum(len(s.points) for s in c.series))[:MAX_CELLS]
    return [c for c in cells if c in ranked]


def _chain(cell: CellSeries, s: Series | None) -> list[tuple[int, float, float]]:
    """(k, peak reserved GiB, step ms) of a family's points, or of none and all alone."""
    pts = s.points if s is not None else tuple(p for p in (cell.none, cell.all) if p is not None)
    return [(p.k, p.peak_reserved_bytes / GIB, p.median_step_time_s * 1e3) for p in pts]


def _cell_panels(ax_mem: Axes, ax_time: Axes, cell: CellSeries, limit_bytes: int | None) -> None:
    for s in cell.series:
        color, marker = FAMILY_STYLE.get(s.family, ("#777777", "x"))
        chain = _chain(cell, s)
        ks = [c[0] for c in chain]
        ax_mem.plot(ks, [c[1] for c in chain], color=color, marker=marker, label=s.family)
        ax_time.plot(ks, [c[2] for c in chain], color=color, marker=marker, label=s.family)
    if not cell.series:
        chain = _chain(cell, None)
        ax_mem.plot([c[0] for c in chain], [c[1] for c in chain], color="#777777", marker="x", label="none/all")
        ax_time.plot([c[0] for c in chain], [c[2] for c in chain], color="#777777", marker="x", label="none/all")
    if limit_bytes:
        ax_mem.axhline(limit_bytes / GIB, color="#c44e52", linestyle="--", linewidth=1,
                       label=f"limit {limit_bytes / GIB:.0f} GiB")
    ax_mem.set_title(cell.label, fontsize=9)
    ax_mem.legend(fontsize=7, loc="upper right")
    ax_time.set_xlabel("checkpointed layers (k)")
    for ax in (ax_mem, ax_time):
        ax.set_xlim(-1, cell.num_layers + 1)
        ax.grid(alpha=0.3)


def _saving_panel(ax: Axes, cells: Sequence[CellSeries]) -> None:
    """Saving per checkpointed layer (reserved) against batch size, one line per first/last interval."""
    lines: dict[str, list[tuple[int, float]]] = {}
    for cell in cells:
        batch = cell.key.get("batch_size")
        for s in cell.series:
            if s.family not in ("first", "last") or not isinstance(batch, int):
                continue
            for i in s.intervals:
                name = f"{s.family} {i.k_from}->{i.k_to}"
                lines.setdefault(name, []).append((batch, i.saved_reserved_per_layer / GIB))
    if not lines:
        empty_note(ax, "no first:k / last:k series")
        return
    for name, pts in sorted(lines.items()):
        color, marker = FAMILY_STYLE[name.split()[0]]
        pts.sort()
        style = "-" if name.endswith(f"->{max(c.num_layers for c in cells)}") else ":"
        ax.plot([p[0] for p in pts], [p[1] for p in pts], color=color, marker=marker, linestyle=style, label=name)
    batches = sorted({b for pts in lines.values() for b, _ in pts})
    ax.set_xscale("log", base=2)
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.minorticks_off()
    ax.set_xlabel("batch size")
    ax.set_ylabel("GiB saved per layer (reserved)")
    ax.set_title("saving per checkpointed layer", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


@plain_text
def plot_layers(cells: Sequence[CellSeries], path: Path, *, title: str, limit_bytes: int | None = None) -> Path:
    """Top: peak reserved against k per cell; bottom: median step time; right: saving per layer against batch."""
    shown = _pick(cells)
    n = max(len(shown), 1)
    fig = Figure(figsize=(3.4 * (n + 1), 6.6), layout="constrained")
    grid = fig.add_gridspec(2, n + 1)
    axes_mem = [fig.add_subplot(grid[0, i]) for i in range(n)]
    axes_time = [fig.add_subplot(grid[1, i], sharex=axes_mem[i]) for i in range(n)]
    for ax_m, ax_t, cell in zip(axes_mem, axes_time, shown, strict=False):
        _cell_panels(ax_m, ax_t, cell, limit_bytes)
    if not shown:
        empty_note(axes_mem[0], "no series to draw")
    axes_mem[0].set_ylabel("peak reserved (GiB)")
    axes_time[0].set_ylabel("median step (ms)")
    _saving_panel(fig.add_subplot(grid[:, n]), shown)
    fig.suptitle(f"Memory and step time against the number of checkpointed layers: {title}", fontsize=11)
    return save(fig, path, bbox_inches=None, metadata={"Software": None})
