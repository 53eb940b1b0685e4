"""Predictions for the searches' probes: the fields a record keeps, and whether a point is predicted to fit.

Probes are not known up front, so each is estimated just before it runs, by one Estimator for the
whole sweep (points of one shape share its short-model trace). On a GPU the searches (search/searches.py)
also ask, before they measure anything, whether candidates are predicted to fit, so that GPU time goes
to the boundary. "Fits" is judged as a measured point is (results/fit.py ``measured_fits``): with
``budget_gib``, the predicted peak reserved memory plus the memory outside the allocator within the
budget; without it, no predicted out-of-memory error (under the config's memory cap, if any).
"""

from __future__ import annotations

import warnings

from ckptbench.config.grid import Point
from ckptbench.config.schema import SweepConfig
from ckptbench.estimator.estimator import Estimator, prediction_of
from ckptbench.estimator.gpus import GpuModel
from ckptbench.estimator.record import Estimate
from ckptbench.results.record import Prediction
from ckptbench.units import GIB


class SearchPredictor:
    """``record(point)``: the estimates a probe's record keeps; ``predict(point)`` (calling it): True/False when
    the point is predicted to fit or not, None when it cannot be estimated. ``gpu`` None: the CPU target."""

    def __init__(self, cfg: SweepConfig, gpu: GpuModel | None) -> None:
        self.cfg = cfg
        self.estimator = Estimator(cfg, target="cuda" if gpu is not None else "cpu", gpu=gpu)
        self.budget = int(cfg.budget_gib * GIB) if cfg.budget_gib else None
        self._failed: set[Point] = set()

    def _estimate(self, point: Point) -> Estimate | None:
        if point in self._failed:
            return None
        try:
            return self.estimator.predict(point, budget_bytes=self.budget)  # made once (the Estimator's memo)
        except Exception as exc:  # as for the grid: a failing estimate must not cost a measured probe
            warnings.warn(f"no prediction for {point.key_id}: {exc.__class__.__name__}: {exc}", stacklevel=2)
            self._failed.add(point)
            return None

    def record(self, point: Point) -> Prediction | None:
        """What a probe's record keeps of its estimate, made before it runs."""
        est = self._estimate(point)
        return None if est is None else prediction_of(est)

    def __call__(self, point: Point) -> bool | None:
        est = self._estimate(point)
        if est is None or est.peak_bytes is None or est.reserved is None:
            return None
        if self.budget is None:
            return est.reserved.oom is None
        return est.fits
