"""What each checkpointed layer saves and costs, measured: first:k / last:k / every:n series of a run (pure).

A *cell* is every key axis except the layout (batch, sequence length, precision, techniques). In a
cell, the whole-layer layouts of one family (``first``, ``last``, ``every``, ``range``, ``layers``)
form a series over k, the number of checkpointed layers, with ``none`` (k = 0) and ``all`` (k = L)
as the shared ends. Between consecutive measured k the differences give the saving and the time
cost per checkpointed layer; the peak is not linear in k (the step's peak moves from the start of
the backward pass to the optimizer step once enough layers are checkpointed), so differences are
kept per interval and a least-squares slope is given only as a summary over three or more points.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ckptbench.config.grid import PointKey, key_id, setup_label
from ckptbench.config.model import ModelSpec
from ckptbench.results.fit import measured_peak_bytes
from ckptbench.results.record import PointRecord
from ckptbench.results.store import Run

FAMILIES = ("first", "last", "every", "range", "layers")
Key = PointKey  # a layer series cell's key: the point key less its layout


def family_of(layout: str) -> str:
    """'first:16' -> 'first', 'every:4+3' -> 'every', 'all@attn' -> 'all'."""
    return layout.split("@", 1)[0].split(":", 1)[0]


def cell_key(key: Mapping[str, Any]) -> Key:
    """The key without its layout: the cell a point belongs to."""
    return {k: v for k, v in key.items() if k != "layout"}


def cell_label(key: Mapping[str, Any]) -> str:
    """'b=8 s=2048 bf16' plus every technique axis that is not plain training."""
    parts = [f"b={key.get('batch_size')}", f"s={key.get('seq_len')}", str(key.get("precision"))]
    extra = setup_label(key)
    return " ".join([*parts, extra] if extra else parts)


@dataclass(frozen=True)
class SeriesPoint:
    """One measured whole-layer layout of a cell."""

    layout: str
    k: int
    key_id: str
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    median_step_time_s: float
    step_time_iqr_s: float
    tokens_per_s: float


@dataclass(frozen=True)
class Interval:
    """From k_from to k_to checkpointed layers: what each added layer saved and cost on average."""

    layout_from: str
    layout_to: str
    k_from: int
    k_to: int
    saved_allocated_per_layer: float  # bytes
    saved_reserved_per_layer: float  # bytes
    time_per_layer_s: float  # added step time per layer
    time_noise_s: float  # the larger step-time spread of the two ends: smaller differences are noise

    @property
    def layers(self) -> int:
        return self.k_to - self.k_from


@dataclass(frozen=True)
class Series:
    """One family's measured points in a cell, ordered by k, with the differences between them."""

    family: str
    points: tuple[SeriesPoint, ...]
    intervals: tuple[Interval, ...]
    fit_saved_allocated_per_layer: float | None  # least-squares slope (bytes per layer), 3+ points
    fit_time_per_layer_s: float | None


@dataclass(frozen=True)
class OrderingRow:
    """Whole-layer layouts with the same k in one cell: which layers are chosen changes the peak."""

    k: int
    points: tuple[SeriesPoint, ...]  # by peak allocated, lowest first

    @property
    def spread_allocated_bytes(self) -> int:
        return self.points[-1].peak_allocated_bytes - self.points[0].peak_allocated_bytes


@dataclass(frozen=True)
class CellSeries:
    """Everything the per-layer analysis found in one cell."""

    key: Key
    label: str
    num_layers: int
    series: tuple[Series, ...]
    ordering: tuple[OrderingRow, ...]
    none: SeriesPoint | None
    all: SeriesPoint | None

    @property
    def overall(self) -> Interval | None:
        """From none to all: the average over every layer (when both ran)."""
        return None if self.none is None or self.all is None else _interval(self.none, self.all)

    def family(self, name: str) -> Series | None:
        return next((s for s in self.series if s.family == name), None)


def num_layers_of(run: Run) -> int | None:
    """The model's decoder layer count from the run's stored config (None if it cannot be read)."""
    try:
        return ModelSpec.model_validate(run.config.get("model") or {}).num_layers
    except ValueError:
        return None


def _series_point(rec: PointRecord, num_layers: int) -> SeriesPoint | None:
    """A whole-layer (block) point that ran; others are not part of a series."""
    plan = rec.plan or {}
    layout = str(rec.key.get("layout"))
    if not rec.ok or plan.get("granularity", "block") != "block":
        return None
    k = rec.num_checkpointed if rec.num_checkpointed is not None else len(plan.get("layers") or [])
    alloc, med, tps = rec.peak_allocated_bytes, rec.median_step_time_s, rec.tokens_per_s
    if alloc is None or med is None or tps is None or not 0 <= k <= num_layers:
        return None
    iqr = float(rec.step_time_iqr_s or 0.0)
    return SeriesPoint(layout, k, rec.key_id, alloc, measured_peak_bytes(rec), med, iqr, tps)


def _interval(a: SeriesPoint, b: SeriesPoint) -> Interval:
    n = b.k - a.k
    return Interval(
        a.layout, b.layout, a.k, b.k,
        saved_allocated_per_layer=(a.peak_allocated_bytes - b.peak_allocated_bytes) / n,
        saved_reserved_per_layer=(a.peak_reserved_bytes - b.peak_reserved_bytes) / n,
        time_per_layer_s=(b.median_step_time_s - a.median_step_time_s) / n,
        time_noise_s=max(a.step_time_iqr_s, b.step_time_iqr_s),
    )


def slope(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Least-squares slope of ys over xs; None for fewer than three points or a single x."""
    if len(xs) < 3:
        return None
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    return None if sxx == 0 else sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx


def _series(family: str, pts: Sequence[SeriesPoint], ends: Sequence[SeriesPoint]) -> Series | None:
    """The family's points plus the ends (none, all); None without a point of the family itself."""
    own = [p for p in pts if family_of(p.layout) == family]
    if not own:
        return None
    chain = sorted({p.k: p for p in [*ends, *own]}.values(), key=lambda p: p.k)
    intervals = tuple(_interval(a, b) for a, b in itertools.pairwise(chain))
    ks = [float(p.k) for p in chain]
    saved = slope(ks, [float(p.peak_allocated_bytes) for p in chain])
    cost = slope(ks, [p.median_step_time_s for p in chain])
    return Series(family, tuple(chain), intervals, None if saved is None else -saved, cost)


def _ordering(pts: Iterable[SeriesPoint], num_layers: int) -> tuple[OrderingRow, ...]:
    by_k: dict[int, list[SeriesPoint]] = {}
    for p in pts:
        if 0 < p.k < num_layers:
            by_k.setdefault(p.k, []).append(p)
    rows = [
        OrderingRow(k, tuple(sorted(ps, key=lambda p: (p.peak_allocated_bytes, p.layout))))
        for k, ps in sorted(by_k.items())
        if len({family_of(p.layout) for p in ps}) > 1 or len(ps) > 1
    ]
    return tuple(rows)


def _cell(key: Key, pts: list[SeriesPoint], num_layers: int) -> CellSeries:
    none = next((p for p in pts if p.layout == "none"), None)
    full = next((p for p in pts if p.layout == "all"), None)
    ends = [p for p in (none, full) if p is not None]
    series = (_series(f, pts, ends) for f in FAMILIES)
    return CellSeries(
        key=key, label=cell_label(key), num_layers=num_layers,
        series=tuple(s for s in series if s is not None), ordering=_ordering(pts, num_layers), none=none, all=full,
    )


def layer_series(run: Run) -> list[CellSeries]:
    """Per cell (in the run's order): the series of every family, the ordering rows, the ends."""
    num_layers = num_layers_of(run)
    if num_layers is None:
        return []
    cells: dict[str, tuple[Key, list[SeriesPoint]]] = {}
    for rec in run.points:
        key = cell_key(rec.key)
        entry = cells.setdefault(key_id(key), (key, []))
        point = _series_point(rec, num_layers)
        if point is not None:
            entry[1].append(point)
    out = [_cell(key, pts, num_layers) for key, pts in cells.values() if pts]
    return [c for c in out if c.series or c.ordering or (c.none and c.all)]
