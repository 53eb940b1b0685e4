"""`ckptbench tune`: the fastest measured setup whose peak reserved memory fits a budget."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ckptbench.cli.common import (
    ConfigArg,
    HeadroomOpt,
    OutDirOpt,
    ResultsRootOpt,
    SeqLenOpt,
    err,
    fail,
    finite,
    out,
)
from ckptbench.cli.progress import EstimateProgressBar, SweepProgress
from ckptbench.cli.recommend import RequiredBudgetOpt
from ckptbench.cli.runs import Interrupts, interrupted, run_paths, summarize_run
from ckptbench.errors import CkptbenchError, ConfigError, RunFailure
from ckptbench.results.fit import DEFAULT_HEADROOM

if TYPE_CHECKING:  # the search and the sweep import torch; the CLI stays fast to start
    from ckptbench.results.store import Run
    from ckptbench.search.tune_search import TuneOptions

MaxPointsOpt = Annotated[
    int | None, typer.Option("--max-points", metavar="N", help="Measure at most this many points.")
]
TimeBudgetOpt = Annotated[
    float | None,
    typer.Option(
        "--time-budget", help="Stop proposing points after this many minutes.", metavar="MIN", callback=finite
    ),
]
AllowOpt = Annotated[
    str | None,
    typer.Option(
        "--allow", metavar="NAMES",
        help="Also search techniques that change training: lora, 8bit, factored, offload_optimizer.",
    ),
]


def tune(
    config: ConfigArg,
    budget: RequiredBudgetOpt = None,
    seq_len: SeqLenOpt = None,
    headroom: HeadroomOpt = DEFAULT_HEADROOM,
    max_points: MaxPointsOpt = None,
    time_budget: TimeBudgetOpt = None,
    allow: AllowOpt = None,
    out_dir: OutDirOpt = None,
    results_root: ResultsRootOpt = "results",
    resume: Annotated[
        str | None, typer.Option("--resume", help="Continue the search of RUN_DIR (same config).", metavar="RUN_DIR")
    ] = None,
    fmt: Annotated[str, typer.Option("--format", metavar="table|json", help="table or json.")] = "table",
) -> None:
    """Search layouts x batch sizes x techniques for the fastest setup that fits --budget, by measurement."""
    from ckptbench.config.load import load_config

    with Interrupts() as interrupts:
        try:
            out_path, results, resume_dir = run_paths(out_dir, results_root, resume)
            cfg = load_config(config)
            options = _options(budget, headroom, seq_len, max_points, time_budget, allow, fmt)
            from ckptbench.sweep.tune_run import check_tune_paths, run_tune

            check_tune_paths(out=out_path, resume=resume_dir, results_root=results)  # before the bars and estimates
            with EstimateProgressBar(err) as estimating, SweepProgress(0) as progress:
                outcome = run_tune(cfg, options, out=out_path, results_root=results, resume=resume_dir,
                                   on_progress=progress.update, on_estimate=estimating.update)
            interrupts.finishing = True  # the final status is on disk: a signal from now on is a note
        except CkptbenchError as exc:
            raise fail(exc) from None
        except KeyboardInterrupt as exc:
            raise interrupted(exc, config, again=_again(config, budget, headroom, seq_len, allow),
                              signum=interrupts.signum) from None
        try:
            run = summarize_run(outcome.sweep.run_dir)
        except (CkptbenchError, OSError) as exc:  # the records are on disk; only the summary is missing
            why = (exc.strerror or str(exc)) if isinstance(exc, OSError) else str(exc)
            raise fail(RunFailure(f"{outcome.sweep.run_dir}: cannot write the summary ({why})")) from None
    _show(run, options, fmt)
    err.print(f"results: {outcome.sweep.run_dir}", markup=False)


def _again(config: Path, budget: str | None, headroom: str, seq_len: int | None, allow: str | None) -> str:
    """The tune command that continues this search (its options; --resume RUN follows)."""
    args = ["ckptbench", "tune", str(config), "--budget", str(budget), "--headroom", headroom]
    args += [*(["--seq-len", str(seq_len)] if seq_len is not None else []), *(["--allow", allow] if allow else [])]
    return shlex.join(args)


def _options(budget: str | None, headroom: str, seq_len: int | None, max_points: int | None,
             time_budget: float | None, allow: str | None, fmt: str) -> TuneOptions:
    from ckptbench.analysis.tune_space import parse_allow
    from ckptbench.search.tune_search import TuneOptions
    from ckptbench.units import parse_headroom, parse_size

    if fmt not in ("table", "json"):
        raise ConfigError(f"--format: {fmt!r} is not one of table, json")
    if budget is None:
        raise ConfigError("--budget is required, e.g. --budget 80 (GiB) or --budget 80GiB")
    if max_points is not None and max_points < 1:
        raise ConfigError(f"--max-points must be at least 1, got {max_points}")
    if time_budget is not None and not time_budget > 0:
        raise ConfigError(f"--time-budget must be a positive number of minutes, got {time_budget:g}")
    budget_bytes = parse_size(budget)
    return TuneOptions(
        budget_bytes=budget_bytes, headroom_bytes=parse_headroom(headroom, budget_bytes=budget_bytes),
        seq_len=seq_len, allow=parse_allow(allow), max_points=max_points,
        time_budget_s=None if time_budget is None else time_budget * 60,
    )


def _show(run: Run, options: TuneOptions, fmt: str) -> None:
    from ckptbench.analysis.recommend import recommend
    from ckptbench.render.tune import rich_tune, tune_search

    search = tune_search(run)
    if search is None:
        raise fail(ConfigError(f"{run.path}: the run holds no tune search"))
    if fmt == "json":
        typer.echo(json.dumps(search.to_json(), sort_keys=True, indent=2))
        return
    rec = recommend(run, budget_bytes=options.budget_bytes, headroom_bytes=options.headroom_bytes,
                    allow=options.allow)
    out.print(rich_tune(search, rec, run=run))
