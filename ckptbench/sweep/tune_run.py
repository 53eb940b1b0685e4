"""A tune run: every candidate of the space estimated, then a sweep of the run directory driven by tune's search."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ckptbench.analysis.tune_planner import TunePlanner
from ckptbench.analysis.tune_record import SpaceRecord, TuneRecord
from ckptbench.analysis.tune_space import TuneSpace, tune_space
from ckptbench.config.schema import SweepConfig
from ckptbench.estimator.estimator import prediction_of
from ckptbench.estimator.record import EstimateProgress
from ckptbench.measure.device import current_gpu_model, resolve_device
from ckptbench.measure.progress import Progress
from ckptbench.results.record import Prediction
from ckptbench.results.store import load_run
from ckptbench.search.tune_search import TuneOptions, TuneSearch, estimate_candidates
from ckptbench.sweep.resume import check_command
from ckptbench.sweep.run_dir import check_paths
from ckptbench.sweep.sweep import SweepOutcome, SweepPlan, run_sweep


@dataclass
class TuneOutcome:
    """The sweep outcome of the search's run directory and the search's own answer."""

    sweep: SweepOutcome
    search: TuneRecord  # as run.json keeps it, with what was searched (``space``) added
    space: TuneSpace
    notes: list[str] = field(default_factory=list)


def check_tune_paths(*, out: Path | None, resume: Path | None, results_root: Path) -> None:
    """Where the run goes, and that a run to resume is a tune run: checked before the estimates (17 s on a
    CPU), so that a bad --out or --resume is refused at once."""
    resolved = check_paths(out=out, resume=resume, results_root=results_root)
    if resolved is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the sweep reads the run again and reports its notes
            check_command(load_run(resolved), "tune")


def run_tune(
    cfg: SweepConfig,
    options: TuneOptions,
    *,
    out: Path | None = None,
    results_root: Path = Path("results"),
    resume: Path | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    on_estimate: Callable[[EstimateProgress], None] | None = None,
) -> TuneOutcome:
    """Search the space of ``cfg`` for the fastest point under the options' limit; measure as it goes."""
    check_tune_paths(out=out, resume=resume, results_root=results_root)
    device = resolve_device(cfg)
    space = tune_space(cfg, device_type=device.type, seq_len=options.seq_len, allow=options.allow)
    # On a GPU the estimator replays the caching allocator on this card: the fit check judges the predicted
    # peak reserved plus this card's CUDA context (analysis/tune_planner.py: predicted_fit).
    gpu = current_gpu_model(device) if device.type == "cuda" else None
    candidates, notes = estimate_candidates(cfg, space, limit_bytes=options.limit_bytes,
                                            target="cuda" if device.type == "cuda" else "cpu",
                                            on_estimate=on_estimate, gpu=gpu)
    planner = TunePlanner(candidates, limit_bytes=options.limit_bytes, max_points=options.max_points,
                          time_budget_s=options.time_budget_s)
    search = TuneSearch(planner)
    predictions: dict[str, Prediction | None] = {c.point.key_id: prediction_of(c.estimate) for c in candidates}
    plan = SweepPlan(points=[], searches=[search], predictions=predictions,
                     meta={"tune": options.to_json(), "command": "tune"})
    sweep = run_sweep(cfg, out=out, results_root=results_root, on_progress=on_progress, resume=resume, plan=plan)
    searched = SpaceRecord(candidates=len(candidates), notes=notes, layouts=list(space.layouts),
                           batch_sizes=list(space.batch_sizes),
                           techniques={k: list(v) for k, v in space.techniques.items()})
    return TuneOutcome(sweep, planner.outcome().model_copy(update={"space": searched}), space, notes)
