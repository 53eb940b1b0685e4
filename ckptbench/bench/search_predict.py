"""Predictions for the searches: whether a point is predicted to fit, made before it is measured.

The searches (bench/search.py) ask this before they measure anything, so that the GPU time goes to the
boundary. One Estimator serves every search of a sweep: points of one shape share its short-model
trace. "Fits" is judged as a measured point is (bench/search.py ``fits``): with ``budget_gib``, the
predicted peak reserved memory plus the memory outside the allocator within the budget; without it,
no predicted out-of-memory error (under the config's memory cap, if any).
"""

from __future__ import annotations

from typing import Any

from ckptbench.config.grid import Point
from ckptbench.config.schema import SweepConfig
from ckptbench.estimate.api import Estimator
from ckptbench.estimate.gpus import GpuModel
from ckptbench.units import GIB


class SearchPredictor:
    """``predict(point)``: True/False when the point is predicted to fit or not, None when it cannot be estimated."""

    def __init__(self, cfg: SweepConfig, gpu: GpuModel) -> None:
        self.cfg = cfg
        self.estimator = Estimator(cfg, target="cuda", gpu=gpu)
        self.budget = int(cfg.budget_gib * GIB) if cfg.budget_gib else None
        self.records: dict[str, dict[str, Any]] = {}  # by key_id: the fields a record keeps (estimates)

    def __call__(self, point: Point) -> bool | None:
        for _, job in self.estimator.jobs([point]):
            job()
        est = self.estimator.estimate(point, budget_bytes=self.budget)
        reserved = est.reserved
        self.records[point.key_id] = {
            "predicted_peak_allocated_bytes": est.peak_bytes,
            "predicted_peak_reserved_bytes": None if reserved is None else reserved.peak_reserved_bytes,
            "predicted_oom": None if reserved is None else reserved.oom,
        }
        if est.peak_bytes is None or reserved is None:
            return None
        if self.budget is None:
            return reserved.oom is None
        return est.fits
