"""A sweep's predictions: the fields each point's record keeps of its estimate, made before the point runs.

Estimates in execution order, each as soon as its traces have run (sweep/predictions.py streams them from
a background process on CUDA). Pure estimation: no printing, no measured data.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from ckptbench.config.grid import Point
from ckptbench.config.schema import SweepConfig
from ckptbench.estimator.api import Estimator, Target, card
from ckptbench.estimator.gpus import GpuModel
from ckptbench.estimator.record import Estimate


def predict_records(
    cfg: SweepConfig, points: Sequence[Point], *, target: Target = "cuda", gpu: GpuModel | str | None = None
) -> dict[str, dict[str, Any]]:
    """The fields a sweep records next to each point's measurement, made before the run (estimates)."""
    return dict(iter_predictions(cfg, points, target=target, gpu=gpu))


def predicted_fields(e: Estimate) -> dict[str, Any]:
    """What a point's record keeps of its estimate: peak allocated, peak reserved (or the predicted OOM)."""
    r = e.reserved
    return {
        "predicted_peak_allocated_bytes": e.peak_bytes,
        "predicted_peak_reserved_bytes": r.peak_reserved_bytes if r is not None else e.peak_bytes,
        "predicted_oom": r.oom if r is not None else None,
    }


def iter_predictions(
    cfg: SweepConfig, points: Sequence[Point], *, target: Target = "cuda", gpu: GpuModel | str | None = None
) -> Iterator[tuple[str, dict[str, Any]]]:
    """(key_id, predicted fields) of each point as soon as its traces have run.

    The traces are those estimate_points runs (every point's layer classes are registered before the
    first trace), in the points' order, so a sweep measuring the points in that order gets the first
    predictions first (sweep/predictions.py makes them in a background process). On CUDA the allocator
    is replayed on ``gpu`` (default: the H200).
    """
    est = Estimator(cfg, target=target, gpu=card(gpu) if target == "cuda" else None)
    pending = list(points)
    for _, job in est.jobs(points):
        job()
        ready = [p for p in pending if est.ready(p)]
        pending = [p for p in pending if p not in ready]
        yield from ((p.key_id, predicted_fields(est.estimate(p))) for p in ready)
    yield from ((p.key_id, predicted_fields(est.estimate(p))) for p in pending)
