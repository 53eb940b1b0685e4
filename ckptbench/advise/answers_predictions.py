"""The predictions `ckptbench answers` hands the claims: the points and searches answers/predictions.py asks for,
predicted by the estimator on the runs' card, and the step-time model fitted to the same runs.

The answers room is pure (no torch); the estimator imports torch. This room sits above both: it runs the
estimator once for every point the claims name (one Estimator, so each short-model trace runs once and the
points of one shape share it), runs each search by bisection, and returns plain data.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence

from ckptbench.analysis.boundary import largest, smallest
from ckptbench.analysis.step_time import StepTimeModel
from ckptbench.answers.evidence import Scope
from ckptbench.answers.predictions import OomFigures, Pred, PredictedPoint, Predictions, Search, wanted
from ckptbench.config.grid import Point, PointKey, point_of
from ckptbench.config.load import parse_config
from ckptbench.errors import ResultsError
from ckptbench.estimator.estimator import Estimator
from ckptbench.estimator.gpus import DEFAULT_GPU, GpuModel, gpu_for_name, gpu_model
from ckptbench.estimator.record import Estimate, EstimateProgress
from ckptbench.results.store import Run


def predicted_point(e: Estimate) -> PredictedPoint:
    """The estimate as the answers room reads it (plain data, no torch)."""
    r, oom = e.reserved, None
    if r is not None and r.oom is not None:
        o = r.oom
        oom = OomFigures(f"{o['phase']}, {o.get('where') or o.get('segment') or 'setup'}", int(o["request_bytes"]),
                         int(o["allocated_bytes"]), int(o["reserved_bytes"]))
    return PredictedPoint(
        key=e.point.key, peak_allocated_bytes=e.peak_bytes,
        peak_reserved_bytes=r.peak_reserved_bytes if r is not None else None, oom=oom,
        params_bytes=e.static.get("params_bytes"), grads_bytes=e.static.get("grads_bytes"),
        optimizer_state_bytes=e.static.get("optimizer_state_bytes"), note=e.note,
    )


class _Predictor:
    """The answers' view of one Estimator: each point predicted once (the Estimator's memo), as plain data."""

    def __init__(self, estimator: Estimator, on_progress: Callable[[EstimateProgress], None] | None) -> None:
        self.estimator, self.on_progress = estimator, on_progress
        self.done: dict[Point, PredictedPoint] = {}

    def prime(self, points: Sequence[Point]) -> None:
        """Run the traces ``points`` need, together (one short model per shape holds every layer class)."""
        self.estimator.run_traces(points, on_progress=self.on_progress)

    def predict(self, point: Point) -> PredictedPoint:
        if point not in self.done:
            self.done[point] = predicted_point(self.estimator.predict(point))
        return self.done[point]


def _point(key: PointKey) -> Point:
    found = point_of(key)
    if found is None:  # the claims' keys are built from the declared axes: a mismatch is a bug here
        raise ResultsError(f"answers: not a point of this ckptbench: {key}")
    return found


def _run_search(pred: _Predictor, search: Search, limit_bytes: int) -> None:
    """Predict the points ``search``'s boundary rests on (they stay in ``pred.done``): every count of a layout
    family (fitting is not monotone in the count near the limit: answers/predictions.py walks them), a batch by
    bisection."""
    if search.vary != "batch_size":
        for v in range(search.lo, search.hi + 1):
            pred.predict(_point(search.at(v)))
        return

    def fits(v: int) -> bool:
        return Pred(pred.predict(_point(search.at(v))), None).fits(limit_bytes)

    found = (smallest if search.want == "smallest" else largest)(fits, search.lo, search.hi)
    if found is None:
        return
    # The neighbour beyond the boundary, so that the answers can show both sides (usually visited already).
    beyond = found - 1 if search.want == "smallest" else found + 1
    if search.lo <= beyond <= search.hi:
        pred.predict(_point(search.at(beyond)))


def card_of(runs: Sequence[Run]) -> GpuModel:
    """The card the runs were measured on, where ckptbench has its device model; else the default (H200)."""
    return gpu_for_name(runs[0].environment.gpu_name) or gpu_model(DEFAULT_GPU)


def predict_for_claims(
    runs: Sequence[Run], *, scope: Scope, limit_bytes: int,
    on_progress: Callable[[EstimateProgress], None] | None = None,
) -> Predictions:
    """Every point the claims ask for (answers/predictions.py: ``wanted``), predicted as a fresh process on the
    runs' card from the first run's config, every search run, and the step-time model fitted to the runs."""
    if not runs:
        raise ResultsError("answers: give at least one run directory")
    run = runs[0]
    if not run.config:
        raise ResultsError(f"{run.path}: run.json holds no config; nothing to predict from")
    cfg = parse_config(run.config, source=f"{run.path}/run.json")
    card = card_of(runs)
    pred = _Predictor(Estimator(cfg, target="cuda", gpu=card), on_progress)
    want = wanted(scope)
    points = [_point(k) for k in want.points]
    # Every search's first probe shares a shape above or adds its own: trace them all together.
    firsts = [_point(s.at(s.lo)) for s in want.searches]
    pred.prime([*points, *firsts])
    for p in points:
        pred.predict(p)
    for s in want.searches:
        _run_search(pred, s, limit_bytes)
    if on_progress is not None:
        on_progress(EstimateProgress(1, 1, "done"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # notes about single points (busy host) are not the answers' subject
        times = StepTimeModel.from_runs(runs)
    source = (f"ckptbench's estimator on the {card.name} device model ({'measured' if card.measured else 'estimated'}"
              " card figures): exact allocated bytes, and the card's caching allocator replayed as a fresh process "
              f"runs the point, from {run.path}'s config")
    return Predictions(
        points={p.key_id: p for p in pred.done.values()}, card=card.name, card_total_bytes=card.total_bytes,
        context_bytes=card.context_bytes, source=source, times=times,
    )
