"""One meaning of "fits": every command judges the same measured point (or prediction) under the same limit alike.

The measured points are the committed H200 run (results/h200-gpu-check-2/check); the limits are each ok
point's own need and one byte less, so every point is judged on both sides of its boundary.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from matplotlib.collections import PathCollection

from ckptbench.analysis.recommend import candidates, recommend
from ckptbench.analysis.tune_planner import Margin, TuneCandidate, TunePlanner, predicted_fit
from ckptbench.answers.evidence import Cite
from ckptbench.config.grid import Point
from ckptbench.estimator.gpus import gpu_for_name
from ckptbench.estimator.record import Estimate, Reserved
from ckptbench.plots.tradeoff import by_layout, tradeoff_figure
from ckptbench.render.recommend import pareto_rows
from ckptbench.results.fit import measured_fits, measured_needed_bytes, reserved_upper_bound
from ckptbench.results.record import PointRecord
from ckptbench.results.store import Run, load_run
from ckptbench.search.searches import BatchMaxSearch, LayoutFitSearch

H200_RUN = Path(__file__).parent.parent / "results" / "h200-gpu-check-2" / "check"

def _h200_context() -> int:
    card = gpu_for_name("NVIDIA H200")
    assert card is not None
    return card.context_bytes


H200_CONTEXT = _h200_context()


def _with_context(run: Run) -> Run:
    """The committed run as a newer ckptbench records it: each point with the CUDA context it measured."""
    points = [p.model_copy(update={"context_bytes": H200_CONTEXT}) if p.ok else p for p in run.points]
    return Run(path=run.path, meta=run.meta, points=points)


def _limits(run: Run) -> list[int]:
    needs = sorted({measured_needed_bytes(p) for p in run.points if p.ok})
    return sorted({n + d for n in needs for d in (-1, 0)})


def _recommend(run: Run, limit: int) -> dict[str, bool]:
    """recommend's verdict per point: its JSON's ``fits`` (every candidate), checked against the Pareto table."""
    cands = candidates(run)
    out = {c.record.key_id: bool(c.to_json(limit_bytes=limit)["fits"]) for c in cands}
    rec = recommend(run, budget_bytes=limit, headroom_bytes=0)
    for row, c in zip(pareto_rows(rec.pareto, limit_bytes=limit), rec.pareto, strict=True):
        assert (row["fits"] == "yes") is out[c.record.key_id]
    if rec.best is not None:
        assert out[rec.best.record.key_id]
    return out


def _tune(record: PointRecord, limit: int) -> bool:
    """tune's verdict on a measured candidate (what it records as ``fits`` in run.json)."""
    point = Point.from_key(record.key)
    estimate = Estimate(point, "cuda", "test", None, {}, {}, None, None, "not estimated: test")
    planner = TunePlanner([TuneCandidate(point, 1, estimate)], limit_bytes=limit)
    assert planner.next() == point
    planner.observe(point, record)
    measured = planner.decided[-1].measured
    assert measured is not None and measured.fits is planner.measured[-1].fits
    return planner.measured[-1].fits


def _searches(record: PointRecord, limit: int) -> bool:
    """The searches' verdict on a probe (both searches judge alike; layout_fit only knows its own layouts)."""
    point = Point.from_key(record.key)
    by_batch = BatchMaxSearch(point).observe(point, record, limit)
    if point.layout in ("none", "all") or point.layout.startswith("first:"):
        assert LayoutFitSearch(point, num_layers=32).observe(point, record, limit) is by_batch
    return by_batch


def _plot(run: Run, limit: int) -> dict[str, bool]:
    """The tradeoff plot's verdict: each plotted point left of (or on) the budget line (no headroom)."""
    fig = tradeoff_figure(run, rec=recommend(run, budget_bytes=limit, headroom_bytes=0))
    ax = fig.axes[0]
    line = next(ln for ln in ax.get_lines() if str(ln.get_label()).startswith("budget"))
    x_limit = float(np.asarray(line.get_xdata())[0])
    # Drawn one scatter per layout (by_layout: its points in the candidates' order), before the ring around the best.
    groups = by_layout(candidates(run))
    scatters = [c for c in ax.collections if isinstance(c, PathCollection)][: len(groups)]
    return {c.record.key_id: float(x) <= x_limit
            for group, s in zip(groups.values(), scatters, strict=True)
            for c, (x, _) in zip(group, np.asarray(s.get_offsets()), strict=True)}


@pytest.fixture(scope="module")
def h200() -> Run:
    return load_run(H200_RUN)


def test_every_command_judges_a_measured_point_alike(h200: Run) -> None:
    run = _with_context(h200)
    limits = _limits(run)
    seen = set()
    for limit in limits:
        rec = _recommend(run, limit)
        plot = _plot(run, limit)
        for p in run.points:
            rule = measured_fits(p, limit)
            said = {
                "recommend": rec.get(p.key_id, False),  # a point that did not run is no candidate
                "tune": _tune(p, limit),
                "searches": _searches(p, limit),
                "answers": Cite(str(run.path), p).fits(limit),
            }
            if p.ok:
                said["plot"] = plot[p.key_id]
            assert set(said.values()) == {rule}, (p.key_id, limit, said)
            seen.add(rule)
    assert seen == {True, False}


def test_a_run_without_measured_context_is_the_one_difference(h200: Run) -> None:
    """Records written before the context was measured: recommend (and its plot and report) count the card's
    figure from the device model; tune, the searches and the answers, which judge their own runs, count none."""
    assert all(p.context_bytes is None for p in h200.points)
    rec_fits = {c.record.key_id: c for c in candidates(h200)}
    for limit in _limits(_with_context(h200)):
        for p in (p for p in h200.points if p.ok):
            assert rec_fits[p.key_id].fits(limit) is measured_fits(p, limit, card_context_bytes=H200_CONTEXT)
            assert _tune(p, limit) is _searches(p, limit) is Cite("r", p).fits(limit) is measured_fits(p, limit)


def test_tune_also_refuses_a_point_whose_loss_differs(h200: Run) -> None:
    """Fits is the same rule; tune's answer must also train what the config trains (recommend notes it instead)."""
    ok = next(p for p in h200.points if p.ok and p.loss_check is not None)
    assert ok.loss_check is not None
    bad = ok.model_copy(update={"loss_check": ok.loss_check.model_copy(update={"match": False})})
    assert bad.loss_mismatch
    limit = measured_needed_bytes(ok)
    assert measured_fits(bad, limit) and _searches(bad, limit) and not _tune(bad, limit)


def _estimate(*, peak: int | None, reserved: int | None = None, context: int = 0, oom: bool = False,
              budget: int | None = None, cap: bool = False) -> Estimate:
    point = Point("bf16", "none", "all", 2048, 2, "llama-7b", "adamw_fused")
    replay = None
    if reserved is not None or oom:
        where = {"phase": "warm-up", "segment": "logits@0", "where": "the loss"}
        replay = Reserved(None if oom else reserved, peak, 0, where if oom else None, "h200", context, True)
    return Estimate(point, "cuda", "fast", peak, {}, {}, None, budget, None if peak else "not estimated: x",
                    reserved=replay, budget_is_cap=cap)


@pytest.mark.parametrize(("peak", "reserved", "context", "oom"), [
    (90, 95, 5, False), (90, 95, 6, False), (90, 96, 5, False), (100, None, 0, False), (101, None, 0, False),
    (None, None, 0, False), (10, None, 0, True),
])
def test_estimate_tune_and_the_searches_judge_a_prediction_alike(
    peak: int | None, reserved: int | None, context: int, oom: bool
) -> None:
    """`estimate --budget`, tune (with no margin learned yet) and the searches' predictions: one rule."""
    limit = 100
    est = _estimate(peak=peak, reserved=reserved, context=context, oom=oom, budget=limit)
    tune = predicted_fit(est, limit_bytes=limit, margin=Margin(1.0, "none yet"))
    assert est.fits is tune.fits
    if est.fits is not None and not oom:
        assert est.needed_bytes == tune.judged_bytes


def test_a_cap_leaves_the_context_out_of_a_prediction() -> None:
    """memory_cap_gib caps the allocator alone: the estimate judges reserved without the context (tune never
    runs under a cap)."""
    est = _estimate(peak=90, reserved=95, context=10, budget=100, cap=True)
    # On a CUDA card the reserved figure is judged on its upper bound (results/fit.py), still without the context.
    assert est.needed_bytes == reserved_upper_bound(95, layout="all", batch_size=2) == 96 and est.fits is True
    assert predicted_fit(est, limit_bytes=100, margin=Margin(1.0, "")).fits is False
