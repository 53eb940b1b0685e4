"""Measured points of several runs, looked up by key, each cited with the run it comes from (pure).

The answers quote points from several committed runs. A key is looked up in the runs in the order
they were given (the first run that holds it wins), so the same inputs always cite the same point.
Technique axes a query leaves out mean plain training; an axis a run wrote but this ckptbench does
not know (a newer axis) must match exactly, so a newer technique is never mistaken for plain training.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ckptbench.config.grid import AXIS_DEFAULTS, PointKey, setup_label
from ckptbench.results.fit import measured_fits, measured_needed_bytes
from ckptbench.results.record import PointRecord
from ckptbench.results.store import Run
from ckptbench.units import fmt_bytes


@dataclass(frozen=True)
class Scope:
    """The cell every claim is about, unless it says otherwise: model, sequence length, precision."""

    model: str = "llama-7b"
    seq_len: int = 2048
    precision: str = "bf16"
    num_layers: int = 32
    architecture: str = "llama"  # the model's family (config/families.py)

    def key(self, layout: str, batch_size: int, **axes: Any) -> PointKey:
        base = {"model": self.model, "seq_len": self.seq_len, "precision": self.precision,
                "architecture": self.architecture}
        return {**AXIS_DEFAULTS, **base, "layout": layout, "batch_size": batch_size, **axes}


def key_label(key: Mapping[str, Any]) -> str:
    """The whole key in short: layout, batch, sequence length, precision, techniques other than plain."""
    parts = [str(key.get("layout")), f"b={key.get('batch_size')}", f"s={key.get('seq_len')}", str(key.get("precision"))]
    extra = setup_label(key)
    return " ".join([*parts, extra] if extra else parts)


def key_short(key: Mapping[str, Any]) -> str:
    """Layout, batch and techniques only (for sentences about one sequence length and precision)."""
    extra = setup_label(key)
    return f"{key.get('layout')} b={key.get('batch_size')}" + (f" {extra}" if extra else "")


@dataclass(frozen=True)
class Cite:
    """One measured point and the run it comes from."""

    run: str  # the run directory as given on the command line
    record: PointRecord
    tag = "measured"  # how every number of a Cite was obtained (a predicted point says 'predicted')

    @property
    def key(self) -> PointKey:
        return dict(self.record.key)

    @property
    def label(self) -> str:
        return key_label(self.key)

    @property
    def short(self) -> str:
        return key_short(self.key)

    @property
    def ok(self) -> bool:
        return self.record.ok

    @property
    def known(self) -> bool:
        """Its memory is known: it ran, or it ran out of memory."""
        return self.record.status in ("ok", "oom")

    @property
    def mem(self) -> int:
        """What must fit (results/fit.py: peak reserved plus the context measured with the point); 0 for a
        point that did not run."""
        return measured_needed_bytes(self.record) if self.ok else 0

    @property
    def alloc(self) -> int:
        return self.record.peak_allocated_bytes or 0

    @property
    def step_s(self) -> float:
        return self.record.median_step_time_s or 0.0

    @property
    def tps(self) -> float:
        return self.record.tokens_per_s or 0.0

    def fits(self, limit_bytes: int) -> bool:
        """It ran and what it needs is within the limit (results/fit.py: ``measured_fits``)."""
        return measured_fits(self.record, limit_bytes)

    def gib(self) -> str:
        return fmt_bytes(self.mem) if self.ok else self.record.status.upper()

    def gb(self) -> str:
        """Decimal gigabytes, the unit of the claims' own words ("50+ GB"), beside which it is quoted."""
        return f"{self.mem / 1e9:.1f} GB"



def _matches(record_key: PointKey, query: PointKey) -> bool:
    for name in set(record_key) | set(query):
        default = AXIS_DEFAULTS.get(name)
        if record_key.get(name, default) != query.get(name, default):
            return False
    return True


class Evidence:
    """Every point of the given runs, in the order the runs were given."""

    def __init__(self, runs: Sequence[Run], *, scope: Scope | None = None) -> None:
        self.runs = list(runs)
        self.scope = scope or Scope()
        self._cites = [Cite(str(run.path), rec) for run in self.runs for rec in run.points]

    def find(self, layout: str, batch_size: int, *, run: str | None = None, **axes: Any) -> Cite | None:
        """The first recorded point with this key (in ``run`` only, when given); OOM points count."""
        query = self.scope.key(layout, batch_size, **axes)
        for cite in self._cites:
            if (run is None or cite.run == run) and _matches(cite.key, query):
                return cite
        return None

    def ok(self, layout: str, batch_size: int, *, run: str | None = None, **axes: Any) -> Cite | None:
        """Like find, but only a point that ran."""
        cite = self.find(layout, batch_size, run=run, **axes)
        return cite if cite is not None and cite.ok else None

    def pair(self, a: PointKey, b: PointKey) -> tuple[Cite | None, Cite | None]:
        """Two points from the same run where one run holds both (a like-for-like comparison)."""
        for run in self.runs:
            x, y = self.find(run=str(run.path), **a), self.find(run=str(run.path), **b)
            if x is not None and y is not None:
                return x, y
        return self.find(**a), self.find(**b)

    def select(self, where: Callable[[PointKey], bool]) -> list[Cite]:
        """Every point whose key satisfies ``where`` (the first run's record per key), in run order."""
        seen: dict[str, Cite] = {}
        for c in self._cites:
            if where(c.key):
                seen.setdefault(c.record.key_id, c)
        return list(seen.values())

    def fastest_fitting(self, batch_size: int, limit_bytes: int, *, prefer_run: str | None = None) -> Cite | None:
        """The fastest plain-training point at this batch whose peak reserved fits; from ``prefer_run`` when it
        has one (a like-for-like comparison within one session), else from any run."""
        fits = [c for lay in self.layouts(batch_size) if (c := self.ok(lay, batch_size)) and c.fits(limit_bytes)]
        if prefer_run is not None:
            own = [c for lay in self.layouts(batch_size)
                   if (c := self.ok(lay, batch_size, run=prefer_run)) and c.fits(limit_bytes)]
            fits = own or fits
        return max(fits, key=lambda c: (c.tps, -c.mem), default=None)

    def batches(self, layout: str, **axes: Any) -> list[int]:
        """Every batch size at which the layout was recorded (any status), ascending."""
        found = {
            int(c.key.get("batch_size", 0))
            for c in self._cites
            if _matches(c.key, self.scope.key(layout, int(c.key.get("batch_size", 0)), **axes))
        }
        return sorted(found)

    def layouts(self, batch_size: int, **axes: Any) -> list[str]:
        """Every layout recorded at this batch (plain technique axes unless given), in first-seen order."""
        out: dict[str, None] = {}
        for c in self._cites:
            if _matches(c.key, self.scope.key(str(c.key.get("layout")), batch_size, **axes)):
                out[str(c.key.get("layout"))] = None
        return list(out)
