"""Measured searches instead of a fixed grid: the largest batch that fits, the fewest layers to checkpoint.

Each search proposes one point at a time and is told whether it fitted (results/fit.py: ``measured_fits``
under the config's ``budget_gib``); the runner measures every proposal as an ordinary point (recorded,
OOM included), so the answer rests on measurements only. What a search found is typed (``BatchMaxOutcome``,
``LayoutFitOutcome``); ``outcome`` is its JSON, as run.json keeps it under ``searches``.
Given a ``predict`` function (whether a point is predicted to fit: search/predict.py), a search
starts where the estimate puts the boundary and measures only around it (its two sides first), in a
fresh process each: the GPU time goes to the boundary. Pure: no torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from ckptbench.analysis.boundary import largest_by_doubling, smallest
from ckptbench.config.grid import Point, setup_label
from ckptbench.config.schema import SweepConfig
from ckptbench.json_object import JsonObject
from ckptbench.results.fit import measured_fits, measured_peak_bytes
from ckptbench.results.record import PointRecord

Predict = Callable[[Point], "bool | None"]  # whether a point is predicted to fit (None: no prediction)

_SHORT = {"layout": "{}", "batch_size": "b={}", "seq_len": "s={}", "precision": "{}"}


@dataclass(frozen=True)
class BatchMaxOutcome:
    """What ``batch_size: max`` found for one cell: the largest batch measured to fit (None: not even 1)."""

    template: Point
    batch_size: int | None
    first_failing_batch_size: int | None  # the smallest batch measured not to fit; None: up to the limit fitted
    probes: tuple[int, ...]  # the batch sizes measured, in order
    predicting: bool  # whether the search was given predictions
    predicted: int | None  # the largest batch predicted to fit (0: none); None when none was made

    kind = "batch_max"


@dataclass(frozen=True)
class LayoutFitOutcome:
    """What ``layout: fit`` found for one cell: the fewest first layers to checkpoint that fit (None: not even
    'all')."""

    template: Point
    layout: str | None  # the layout that checkpoints them ('none', 'first:k', 'all')
    num_checkpointed: int | None
    probes: tuple[str, ...]  # the layouts measured, in order
    predicting: bool  # whether the search was given predictions
    predicted: int | None  # the fewest predicted to fit (num_layers + 1: none); None when none was made

    kind = "layout_fit"


def group_label(point: Point, axis: str) -> str:
    """The point's key without the searched axis, short: main axes, then the others that differ from defaults."""
    key = point.key
    parts = [fmt.format(key[k]) for k, fmt in _SHORT.items() if k != axis]
    extras = setup_label({k: v for k, v in key.items() if k != axis})
    return " ".join([*parts, extras] if extras else parts)


@dataclass
class BatchMaxSearch:
    """Grow the batch by doubling until it no longer fits, then bisect to the boundary."""

    template: Point
    limit: int = 1024
    largest_fit: int | None = None
    smallest_fail: int | None = None
    probes: list[int] = field(default_factory=list)
    predict: Predict | None = None
    predicted: int | None = None  # the largest batch predicted to fit (0: none), once asked
    _plan: list[int] = field(default_factory=list)

    kind = BatchMaxOutcome.kind

    def _predict_boundary(self) -> None:
        """Double, then bisect, on predictions alone: the largest batch predicted to fit."""
        predict = self.predict
        assert predict is not None
        fit = largest_by_doubling(lambda b: predict(replace(self.template, batch_size=b)), self.limit)
        if fit is None:
            return
        self.predicted = fit
        self._plan = [b for b in (fit, fit + 1) if 1 <= b <= self.limit]

    def _informative(self, batch: int) -> bool:
        return (self.largest_fit is None or batch > self.largest_fit) and (
            self.smallest_fail is None or batch < self.smallest_fail
        )

    def fresh(self, point: Point) -> bool:
        """Whether a probe is a boundary point to measure in a fresh process (the predicted boundary's sides)."""
        return self.predicted is not None and abs(point.batch_size - self.predicted - 0.5) < 2

    def next_point(self, budget_bytes: int | None = None) -> Point | None:
        if self.predict is not None and self.predicted is None and not self.probes:
            self._predict_boundary()
        while self._plan:
            batch = self._plan.pop(0)
            if self._informative(batch):
                return replace(self.template, batch_size=batch)
        if self.smallest_fail is None:
            batch = 1 if self.largest_fit is None else self.largest_fit * 2
            if batch > self.limit:
                return None
        elif self.largest_fit is None:
            if self.smallest_fail <= 1:
                return None
            batch = self.smallest_fail // 2  # only reached when batch 1 was not the first probe
        else:
            if self.smallest_fail - self.largest_fit <= 1:
                return None
            batch = (self.largest_fit + self.smallest_fail) // 2
        return replace(self.template, batch_size=batch)

    def observe(self, point: Point, record: PointRecord, budget_bytes: int | None) -> bool:
        ok = measured_fits(record, budget_bytes)
        self.probes.append(point.batch_size)
        if ok:
            self.largest_fit = max(self.largest_fit or 0, point.batch_size)
        else:
            self.smallest_fail = min(self.smallest_fail or point.batch_size, point.batch_size)
            if point.batch_size == self.predicted and point.batch_size > 1:
                self._plan.insert(0, point.batch_size - 1)  # the prediction was one too high: try one less
        return ok

    def result(self) -> BatchMaxOutcome:
        """What the search found, from its measured probes."""
        return BatchMaxOutcome(self.template, self.largest_fit, self.smallest_fail, tuple(self.probes),
                               predicting=self.predict is not None, predicted=self.predicted)

    def outcome(self) -> JsonObject:
        """``result`` as run.json keeps it (the runner hands it to the sweep to write)."""
        r = self.result()
        return {
            "kind": r.kind,
            "group": group_label(r.template, "batch_size"),
            "key": {k: v for k, v in r.template.key.items() if k != "batch_size"},
            "answer": {"batch_size": r.batch_size, "first_failing_batch_size": r.first_failing_batch_size},
            "predicted": {"batch_size": r.predicted} if r.predicting else None,
            "probes": list(r.probes),
        }


@dataclass
class LayoutFitSearch:
    """The fewest checkpointed layers (first:k) that fit, found from measured per-layer savings.

    Measures 'none' and 'all'; the difference of their peaks over the layer count is the measured
    activation cost of one layer, which proposes k; first:k is measured to confirm, then k moves by
    bisection between the largest k known not to fit and the smallest known to fit. The first layers
    are chosen because checkpointing early layers lowers the peak most: unchecked late layers are
    freed first in the backward pass. With predictions, the fewest layers predicted to fit (k) and one
    fewer are measured first, in fresh processes; bisection follows only if the prediction was wrong.
    """

    template: Point
    num_layers: int
    peaks: dict[int, int] = field(default_factory=dict)  # k -> peak reserved (or allocated) bytes
    fit_k: int | None = None
    fail_k: int | None = None
    probes: list[str] = field(default_factory=list)
    predict: Predict | None = None
    predicted: int | None = None  # the fewest first layers predicted to fit (num_layers + 1: none fits)
    _plan: list[int] = field(default_factory=list)

    kind = LayoutFitOutcome.kind

    def _layout(self, k: int) -> str:
        return "none" if k == 0 else "all" if k == self.num_layers else f"first:{k}"

    def _ask(self, k: int) -> bool | None:
        assert self.predict is not None
        return self.predict(replace(self.template, layout=self._layout(k)))

    def _predict_boundary(self) -> None:
        """Bisect on predictions alone: the fewest first layers to checkpoint that are predicted to fit."""
        top, bottom = self._ask(self.num_layers), self._ask(0)
        if top is None or bottom is None:
            return
        if not top or bottom:
            self.predicted = 0 if bottom else self.num_layers + 1
            self._plan = [0] if bottom else [self.num_layers]
            return
        answers: dict[int, bool | None] = {}

        def fits(k: int) -> bool:  # 0 is predicted not to fit and num_layers to fit (checked above)
            answers[k] = self._ask(k)
            return bool(answers[k])

        hi = smallest(fits, 1, self.num_layers)
        if hi is None or any(v is None for v in answers.values()):
            return
        self.predicted, self._plan = hi, [hi, hi - 1]

    def fresh(self, point: Point) -> bool:
        """Whether a probe is a boundary point to measure in a fresh process (the predicted boundary's sides)."""
        return self.predicted is not None and abs(self._k_of(point.layout) - self.predicted + 0.5) < 2

    def _informative(self, k: int) -> bool:
        return (self.fail_k is None or k > self.fail_k) and (self.fit_k is None or k < self.fit_k)

    def _propose(self, budget_bytes: int | None) -> int | None:
        if self.predict is not None and self.predicted is None and not self.probes:
            self._predict_boundary()
        while self._plan:
            k = self._plan.pop(0)
            if self._informative(k):
                return k
        lo, hi = self.fail_k, self.fit_k
        if lo is None and hi is None:
            return 0
        if lo is None:  # nothing failed yet: measure 'none' unless it is the answer
            return 0 if hi and 0 not in self.peaks else None
        if hi is None:  # nothing fitted yet: 'all' next, unless it was measured ('all' not fitting: no answer)
            return self.num_layers if lo < self.num_layers else None
        if hi - lo <= 1:
            return None
        guess = self._guess(budget_bytes)
        return guess if guess is not None and lo < guess < hi else (lo + hi) // 2

    def _guess(self, budget_bytes: int | None) -> int | None:
        if budget_bytes is None or 0 not in self.peaks or self.num_layers not in self.peaks:
            return None
        per_layer = (self.peaks[0] - self.peaks[self.num_layers]) / self.num_layers
        if per_layer <= 0:
            return None
        return math.ceil((self.peaks[0] - budget_bytes) / per_layer)

    def next_point(self, budget_bytes: int | None = None) -> Point | None:
        k = self._propose(budget_bytes)
        return None if k is None else replace(self.template, layout=self._layout(k))

    def observe(self, point: Point, record: PointRecord, budget_bytes: int | None) -> bool:
        k = self._k_of(point.layout)
        ok = measured_fits(record, budget_bytes)
        self.probes.append(point.layout)
        if record.ok:
            self.peaks[k] = measured_peak_bytes(record)
        if ok:
            self.fit_k = k if self.fit_k is None else min(self.fit_k, k)
        else:
            self.fail_k = k if self.fail_k is None else max(self.fail_k, k)
            if k == self.predicted and k < self.num_layers:
                self._plan.insert(0, k + 1)  # the prediction was one too low: try one more
        return ok

    def _k_of(self, layout: str) -> int:
        if layout == "none":
            return 0
        if layout == "all":
            return self.num_layers
        return int(layout.split(":", 1)[1])

    def result(self) -> LayoutFitOutcome:
        """What the search found, from its measured probes."""
        k = self.fit_k
        return LayoutFitOutcome(self.template, None if k is None else self._layout(k), k, tuple(self.probes),
                                predicting=self.predict is not None, predicted=self.predicted)

    def outcome(self) -> JsonObject:
        """``result`` as run.json keeps it (the runner hands it to the sweep to write)."""
        r = self.result()
        k = r.num_checkpointed
        return {
            "kind": r.kind,
            "group": group_label(r.template, "layout"),
            "key": {kk: v for kk, v in r.template.key.items() if kk != "layout"},
            "answer": {"layout": r.layout, "num_checkpointed": k, "layers": None if k is None else list(range(k))},
            "predicted": {"num_checkpointed": r.predicted} if r.predicting else None,
            "probes": list(r.probes),
        }


ConfigSearch = BatchMaxSearch | LayoutFitSearch  # the searches a config can ask for


def make_searches(cfg: SweepConfig, predict: Predict | None = None) -> list[ConfigSearch]:
    """The searches a config asks for (batch_size: max or layout: fit), one per searched cell."""
    out: list[ConfigSearch] = []
    for kind, template in cfg.search_templates():
        if kind == "batch_max":
            out.append(BatchMaxSearch(template, limit=cfg.search_max_batch, predict=predict))
        else:
            out.append(LayoutFitSearch(template, num_layers=cfg.model.num_layers, predict=predict))
    return out
