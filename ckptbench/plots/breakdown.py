"""What the peak is made of, per layout at one shared shape, without stating what was not measured.

A measurement gives the peak (allocated and reserved) and the static memory (parameters and optimizer
state, live all the time), not how the rest of the peak splits into gradients, saved activations and
temporaries: at the peak the gradients are often not allocated yet. So a bar is either
- the estimate's breakdown at its predicted peak (``ckptbench estimate``, a fake-tensor trace of the same
  step), labelled as an estimate, with the measured peak drawn over it; or, without an estimate,
- measured parameters + optimizer state, and the rest of the measured peak, not split.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.figure import Figure

from ckptbench.config.grid import PointKey
from ckptbench.estimator.record import CATEGORIES, PART_NAMES, Estimate
from ckptbench.plots.style import PlotData, empty_note, plain_text, save, short_axis, suptitle
from ckptbench.results.record import PointRecord
from ckptbench.results.store import Run
from ckptbench.units import SizeUnit

# One colour per estimate category (CATEGORIES order), then the two measured parts.
PART_COLORS = ("#4c72b0", "#937860", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#8c8c8c")
STATIC_LABEL = "parameters + optimizer state (measured)"
REST_LABEL = "rest of the measured peak (not split)"
CACHE_LABEL = "reserved, not allocated (measured)"
PEAK_LABEL = "measured peak allocated"


def reference_shape(run: Run) -> PointKey | None:
    """The non-layout part of the key with the most ok layouts (ties: the most tokens per step)."""
    counts: dict[str, tuple[int, int, PointKey]] = {}
    for p in run.points:
        shape = {k: v for k, v in p.key.items() if k != "layout"}
        sig = repr(sorted(shape.items()))
        n = counts.get(sig, (0, 0, shape))[0]
        counts[sig] = (n + p.ok, p.tokens_per_step or 0, shape)
    best = max(counts.values(), key=lambda t: (t[0], t[1]), default=None)
    return None if best is None or best[0] == 0 else best[2]


def breakdown_points(run: Run) -> list[PointRecord]:
    """The ok points the breakdown shows: one per layout, at the reference shape."""
    shape = reference_shape(run)
    if shape is None:
        return []
    return [p for p in run.points if p.ok and {k: p.key.get(k) for k in shape} == shape]


@plain_text
def plot_breakdown(
    run: Run, path: Path, *, budget_bytes: int | None = None, size: SizeUnit | None = None,
    estimates: Sequence[Estimate] = (),
) -> Path:
    """memory_breakdown.png (see ``breakdown_figure``)."""
    return save(breakdown_figure(run, budget_bytes=budget_bytes, size=size, estimates=estimates), path)


@plain_text
def breakdown_figure(
    run: Run, *, budget_bytes: int | None = None, size: SizeUnit | None = None, estimates: Sequence[Estimate] = ()
) -> Figure:
    """Stacked bars per layout at the reference shape: the estimate's parts (or measured static + rest),
    the measured peak allocated as a black tick, the reserved-but-unallocated memory hatched on top."""
    data = PlotData(run, size=size)
    shape = reference_shape(run) or {}
    by_layout = {str(p.key.get("layout")): p for p in breakdown_points(run)}
    by_key = {e.point.key_id: e for e in estimates if e.peak_bytes is not None and e.breakdown}
    fig = Figure(figsize=(max(9.0, 0.95 * len(data.layouts) + 4), 5.8), layout="constrained")
    ax = fig.subplots()
    if not by_layout:
        empty_note(ax, "no point finished ok: nothing to break down")
    for i, lay in enumerate(data.layouts if by_layout else []):
        rec = by_layout.get(lay)
        if rec is None:
            _not_run(ax, i, run, {**shape, "layout": lay})
            continue
        est = by_key.get(rec.key_id)
        top = _stack_estimate(ax, i, est, data) if est is not None else _stack_measured(ax, i, rec, data)
        _measured_marks(ax, i, rec, data, top)
    _axes_decor(ax, data, budget_bytes)
    _legend(ax)
    names = ["batch_size", "seq_len", *(n for n in data.facet_axes if n != "seq_len")]
    where = ", ".join(f"{short_axis(n)} {shape[n]}" for n in names if n in shape)
    suptitle(fig, run, f"Memory at the peak per layout ({where})" if where else "Memory at the peak per layout")
    ax.set_title(_subtitle(by_layout, by_key), fontsize=9)
    return fig


def _subtitle(by_layout: dict[str, PointRecord], by_key: dict[str, Estimate]) -> str:
    estimated = sum(1 for p in by_layout.values() if p.key_id in by_key)
    if estimated == len(by_layout):
        return "coloured parts: ckptbench estimate at its predicted peak (fake-tensor trace, not measured)"
    if estimated == 0:
        return "measured: parameters + optimizer state, and the rest of the peak (its split was not measured)"
    return "coloured parts: ckptbench estimate where it could be made, else measured static + rest"


def _stack_estimate(ax: Axes, x: int, est: Estimate, data: PlotData) -> float:
    bottom = 0.0
    for name, color in zip(CATEGORIES, PART_COLORS, strict=True):
        height = data.size.value(est.breakdown.get(name, 0))
        ax.bar(x, height, 0.6, bottom=bottom, color=color, label=f"{PART_NAMES[name]} (estimate)")
        bottom += height
    return bottom


def _stack_measured(ax: Axes, x: int, rec: PointRecord, data: PlotData) -> float:
    static = (rec.memory.params_bytes or 0) + (rec.memory.optimizer_state_bytes or 0)
    peak = rec.peak_allocated_bytes or 0
    ax.bar(x, data.size.value(static), 0.6, color="#4c72b0", label=STATIC_LABEL)
    rest = max(0, peak - static)
    ax.bar(x, data.size.value(rest), 0.6, bottom=data.size.value(static), color="#d9d9d9", edgecolor="#999999",
           label=REST_LABEL)
    return data.size.value(static + rest)


def _measured_marks(ax: Axes, x: int, rec: PointRecord, data: PlotData, top: float) -> None:
    """The measured peak allocated (a tick), what the allocator reserved above it, and its number."""
    alloc = data.size.value(rec.peak_allocated_bytes or 0)
    reserved = data.size.value(rec.peak_reserved_bytes or rec.peak_allocated_bytes or 0)
    if reserved > alloc:
        ax.bar(x, reserved - alloc, 0.6, bottom=alloc, color="white", edgecolor="#999999", hatch="///",
               label=CACHE_LABEL)
    ax.plot([x - 0.36, x + 0.36], [alloc, alloc], color="black", linewidth=2, label=PEAK_LABEL)
    ax.annotate(data.size(rec.peak_reserved_bytes or rec.peak_allocated_bytes), (x, max(reserved, top)),
                xytext=(0, 2), textcoords="offset points", ha="center", va="bottom", fontsize=7.5)


def _not_run(ax: Axes, x: int, run: Run, key: PointKey) -> None:
    status = next((p.status for p in run.points if p.key == key), "not run")
    ax.text(x, 0, f" {str(status).upper()}", rotation=90, ha="center", va="bottom", fontsize=8,
            color="#c44e52", fontweight="bold")


def _axes_decor(ax: Axes, data: PlotData, budget_bytes: int | None) -> None:
    many = len(data.layouts) > 5
    ax.set_xticks(range(len(data.layouts)), data.layouts, rotation=30 if many else 0, ha="right" if many else "center")
    ax.set_xlim(-0.6, len(data.layouts) - 0.4)
    ax.set_ylabel(f"memory at the peak ({data.unit})")
    ax.grid(axis="y", alpha=0.3)
    ax.margins(y=0.08)
    ax.set_ylim(bottom=0)
    if budget_bytes:
        y = data.size.value(budget_bytes)
        ax.axhline(y, color="#c44e52", linestyle="--", linewidth=1.2, label=f"budget {data.size(budget_bytes)}")
        ax.set_ylim(top=max(ax.get_ylim()[1], y * 1.06))


def _legend(ax: Axes) -> None:
    """One entry per part, top of the stack first, then the measured marks."""
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))
    marks = [k for k in (PEAK_LABEL, CACHE_LABEL) if k in unique]
    parts = [k for k in unique if k not in marks and not k.startswith("budget")][::-1]
    budget = [k for k in unique if k.startswith("budget")]
    order = [*budget, *marks, *parts]
    if not order:
        return
    ax.legend([unique[k] for k in order], order, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0),
              title="number on top: measured peak reserved", title_fontsize=8)
