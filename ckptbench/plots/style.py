"""What every plot of a run shares: the run as rows, orders and colours, saving (matplotlib Figure + Agg)."""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import matplotlib as mpl
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from ckptbench.config.grid import PointKey
from ckptbench.results.record import PointRecord
from ckptbench.results.store import Run, atomic_file
from ckptbench.units import SizeUnit

DPI = 110
# One colour and one marker per layout. Ten tab10 hues plus black and gold: no light/dark pairs of
# one hue (tab20 made none/all and first:16/last:16 look alike); with 12 colours and 11 markers the
# (colour, marker) pair stays unique for 132 layouts.
LAYOUT_COLORS = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
    "#000000", "#ffd700",
)
LAYOUT_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "h", "<", ">")


@dataclass(frozen=True)
class PlotRow:
    """One point as the peak and speed plots draw it: its slot (layout, batch size, the key its facet is read from),
    whether it ran, and the figures drawn (None where its record has none)."""

    key: PointKey
    layout: Any  # the key's layout and batch size, as recorded
    batch_size: Any
    status: str
    peak_reserved_bytes: int | None
    tokens_per_s: float | None
    median_step_time_s: float | None
    quartiles_s: tuple[float, float] | None  # of its measured step times

    @classmethod
    def of(cls, rec: PointRecord) -> PlotRow:
        return cls(rec.key, rec.key.get("layout"), rec.key.get("batch_size"), rec.status, rec.peak_reserved_bytes,
                   rec.tokens_per_s, rec.median_step_time_s, _quartiles(rec.step_times_s))


class PlotData:
    """The run as rows, with the orders and colours every plot shares."""

    def __init__(self, run: Run, *, size: SizeUnit | None = None) -> None:
        self.run = run
        self.size = size or SizeUnit.for_sizes(run.sizes())  # the unit of the run's tables too
        self.rows = [PlotRow.of(rec) for rec in run.points]
        keys = [p.key for p in run.points]
        self.layouts = list(dict.fromkeys(str(k.get("layout")) for k in keys))
        self.batches = sorted({k.get("batch_size") for k in keys}, key=lambda b: (b is None, b))
        names = sorted({n for k in keys for n in k} - {"layout", "batch_size"})
        self.facet_axes = [n for n in names if len({repr(k.get(n)) for k in keys}) > 1]
        self.scale, self.unit = self.size.scale, self.size.name
        cmap = colormaps["viridis"]
        n = max(len(self.batches) - 1, 1)
        self.batch_color = {b: cmap(0.1 + 0.75 * i / n) for i, b in enumerate(self.batches)}
        self.layout_color = {lay: LAYOUT_COLORS[i % len(LAYOUT_COLORS)] for i, lay in enumerate(self.layouts)}
        self.layout_marker = {lay: LAYOUT_MARKERS[i % len(LAYOUT_MARKERS)] for i, lay in enumerate(self.layouts)}

    def facets(self) -> list[tuple[str, list[PlotRow]]]:
        """(title, rows) per combination of the key axes other than layout and batch that vary."""
        groups: dict[str, list[PlotRow]] = {}
        for row in self.rows:
            label = ", ".join(f"{short_axis(n)} {row.key.get(n)}" for n in self.facet_axes)
            groups.setdefault(label, []).append(row)
        return list(groups.items())


# A legend names at most this many batch sizes: past it (a grid of dozens of batch sizes) the colours and marker
# sizes grow along a scale, and a legend of every one would be taller than the plot and slow to draw (issue 24).
LEGEND_BATCHES = 12


def legend_batches(batches: list[Any]) -> list[Any]:
    """The batch sizes a legend names: all of them up to ``LEGEND_BATCHES``, else that many spread evenly from
    the first to the last (the scale of their colours and sizes), in order."""
    if len(batches) <= LEGEND_BATCHES:
        return list(batches)
    last = len(batches) - 1
    picked = sorted({round(i * last / (LEGEND_BATCHES - 1)) for i in range(LEGEND_BATCHES)})
    return [batches[i] for i in picked]


def batches_title(shown: int, total: int) -> str | None:
    """The title of a legend that names ``shown`` of ``total`` batch sizes (None when it names them all)."""
    return None if shown == total else f"{shown} of {total} batch sizes named (evenly spread)"


def describe_run(run: Run) -> str:
    """What a plot shows in one line: 'llama-7b, seq 2048, bf16, NVIDIA H200'."""
    model_spec = run.config.get("model") or {}
    model = str(model_spec.get("preset") or "model") + (" (overrides)" if model_spec.get("overrides") else "")
    seqs = sorted({p.key.get("seq_len") for p in run.points}, key=lambda v: (v is None, v))
    precisions = list(dict.fromkeys(str(p.key.get("precision")) for p in run.points))
    device = run.environment.gpu_name or "CPU (live-tensor tracker)"
    return f"{model}, seq {', '.join(str(s) for s in seqs)}, {'/'.join(precisions)}, {device}"


def suptitle(fig: Figure, run: Run, what: str) -> None:
    """'<what>: <run name>' over the model, sequence lengths, precisions and device."""
    fig.suptitle(f"{what}: {run.title}\n{describe_run(run)}", fontsize=12)


def _quartiles(times: list[float]) -> tuple[float, float] | None:
    """First and third quartile of the measured step times (the same method as point_stats)."""
    if not times:
        return None
    if len(times) == 1:
        return times[0], times[0]
    q = statistics.quantiles(times, n=4, method="inclusive")
    return q[0], q[2]


def is_number(value: Any) -> bool:
    return value is not None and value == value


def short_axis(name: str) -> str:
    return {"seq_len": "seq", "batch_size": "batch"}.get(name, name)


def save(fig: Figure, path: Path, **options: Any) -> Path:
    """The PNG written whole or not at all (results/store.py atomic_file): a full disk or Ctrl-C half-way through
    never leaves a cut PNG, nor replaces an earlier good one with it."""
    with atomic_file(path) as tmp:
        fig.savefig(tmp, dpi=DPI, **({"bbox_inches": "tight"} | options))
    return path


def empty_note(ax: Axes, text: str) -> None:
    """A centred grey note on axes that have nothing to show."""
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", fontsize=11, color="#777777")


# matplotlib reads '$...$' in a text as math: a ValueError for '$\\frac{1}$' in a run name, after half a report was
# written. Texts drawn inside plain_text are drawn as given.
P = ParamSpec("P")
R = TypeVar("R")


def plain_text(draw: Callable[P, R]) -> Callable[P, R]:
    """A plotting function whose texts are drawn as given: no mathtext ($...$) in the titles, labels, legends
    and notes it creates (ckptbench draws no formulas; its texts hold names a user chose)."""

    @functools.wraps(draw)
    def drawn(*args: P.args, **kwargs: P.kwargs) -> R:
        with mpl.rc_context({"text.parse_math": False}):  # read by each Text when it is created
            return draw(*args, **kwargs)

    return drawn
