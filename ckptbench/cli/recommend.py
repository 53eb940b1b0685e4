"""`ckptbench recommend` and `ckptbench report`: the fastest point that fits a budget; report.md and plots."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated

import typer

from ckptbench.cli.common import BudgetOpt, Format, HeadroomOpt, RunArg, SeqLenOpt, err, fail, out, path_option, warn
from ckptbench.errors import CkptbenchError, ConfigError, RunFailure
from ckptbench.estimator.collector import gc_paused
from ckptbench.results.fit import DEFAULT_HEADROOM

if TYPE_CHECKING:  # the estimator imports torch; the CLI stays fast to start
    from ckptbench.analysis.recommend import Recommendation
    from ckptbench.estimator.record import Estimate
    from ckptbench.results.store import Run

# Required: a missing --budget is refused by the command itself (one line, exit 2), so typer must not.
RequiredBudgetOpt = Annotated[
    str | None,
    typer.Option("--budget", metavar="SIZE", show_default=False,
                 help="\\[required] Memory budget: GiB (80) or with a binary unit (80GiB, 512MiB); GB is refused as "
                      "ambiguous."),
]
MeasuredAllowOpt = Annotated[
    str | None,
    typer.Option("--allow", metavar="NAMES",
                 help="Also recommend points that train something else: lora, 8bit, factored, offload_optimizer, "
                      "optimizer (another optimizer than the run's)."),
]
ReportOutOpt = Annotated[
    str | None,  # not Path: typer turns '' into '.', and '' must be refused (cli/common.py path_option)
    typer.Option("--out", metavar="DIR", help="Folder for report.md and the PNGs (default RUN/report)."),
]


def recommend_cmd(
    run: RunArg,
    budget: RequiredBudgetOpt = None,
    seq_len: SeqLenOpt = None,
    headroom: HeadroomOpt = DEFAULT_HEADROOM,
    fmt_text: Annotated[
        str, typer.Option("--format", metavar="table|markdown|json", help="table (default), markdown or json.")
    ] = Format.table.value,
    allow: MeasuredAllowOpt = None,
) -> None:
    """The fastest measured point whose needed memory (peak reserved + CUDA context) fits the budget, and the
    Pareto front; points that train something other than full fine-tuning only with --allow."""

    from ckptbench.render.recommend import markdown_pareto, markdown_recommendation, rich_recommendation
    from ckptbench.results.store import load_run

    try:
        fmt = _format(fmt_text)
        if budget is None:
            raise ConfigError("--budget is required, e.g. --budget 80 (GiB) or --budget 80GiB")
        rec = _recommendation(load_run(run), budget=budget, headroom=headroom, seq_len=seq_len, allow=allow)
    except CkptbenchError as exc:
        raise fail(exc) from None
    if fmt is Format.json:
        typer.echo(json.dumps(rec.to_json(), sort_keys=True, indent=2))
    elif fmt is Format.markdown:
        typer.echo(markdown_recommendation(rec) + "\n" + markdown_pareto(rec.pareto, limit_bytes=rec.limit_bytes,
                                                                      size=rec.size), nl=False)
    else:
        out.print(rich_recommendation(rec))


def _format(text: str) -> Format:
    """One of the shared formats that a recommendation has (no CSV: it is two tables and a sentence)."""
    allowed = (Format.table, Format.markdown, Format.json)
    if text not in {f.value for f in allowed}:
        raise ConfigError(f"--format: {text!r} is not one of {', '.join(f.value for f in allowed)}")
    return Format(text)


def _recommendation(
    run: Run, *, budget: str, headroom: str, seq_len: int | None, allow: str | None = None
) -> Recommendation:
    from ckptbench.analysis.recommend import recommend
    from ckptbench.analysis.tune_space import MEASURED_ALLOWABLE, parse_allow
    from ckptbench.units import parse_headroom, parse_size

    allowed = parse_allow(allow, allowable=MEASURED_ALLOWABLE)
    budget_bytes = parse_size(budget)
    headroom_bytes = parse_headroom(headroom, budget_bytes=budget_bytes)
    return recommend(run, allow=allowed, budget_bytes=budget_bytes, headroom_bytes=headroom_bytes, seq_len=seq_len)


EstimateOpt = Annotated[
    bool,
    typer.Option("--estimate/--no-estimate",
                 help="Split the peaks of the memory-breakdown plot with ckptbench estimate (a few CPU traces); "
                      "without it the plot shows measured static memory and the rest."),
]


def report_cmd(
    run: RunArg,
    out_dir: ReportOutOpt = None,
    budget: BudgetOpt = None,
    seq_len: SeqLenOpt = None,
    headroom: HeadroomOpt = DEFAULT_HEADROOM,
    estimate: EstimateOpt = True,
    allow: MeasuredAllowOpt = None,
) -> None:
    """Write report.md (tables, recommendation when --budget is given) and PNG plots of a run."""
    from ckptbench.render.report import default_out_dir, write_report
    from ckptbench.results.paths import check_writable_dir
    from ckptbench.results.store import load_run

    try:
        target = path_option(out_dir, option="--out")
        loaded = load_run(run)
        rec = (_recommendation(loaded, budget=budget, headroom=headroom, seq_len=seq_len, allow=allow)
               if budget else None)
        target = target or default_out_dir(loaded)
        check_writable_dir(target, option="--out")  # before the estimates are traced and the plots drawn
        estimates = _breakdown_estimates(loaded) if estimate else []
        with gc_paused():  # thousands of plot artists: not walked again and again by the cyclic collector
            files = write_report(loaded, out_dir=target, rec=rec, estimates=estimates)
    except CkptbenchError as exc:
        raise fail(exc) from None
    except OSError as exc:  # a full disk: a failure of the disk (exit 1), not bad input; no file is left cut
        where = target or run
        raise fail(RunFailure(f"{where}: cannot write the report ({exc.strerror or exc}); the files written are "
                              "whole, none is cut")) from None
    for plot in files.plots:
        err.print(f"plot: {plot}", markup=False)
    out.print(str(files.markdown), markup=False)


def _breakdown_estimates(run: Run) -> list[Estimate]:
    """ckptbench estimate of the points the breakdown plot shows (one per layout, at one shape), from the
    run's stored config; none when that cannot be made (the plot then shows what was measured)."""
    from ckptbench.cli.progress import EstimateProgressBar
    from ckptbench.config.load import parse_config
    from ckptbench.estimator.estimator import estimate_points, resolve_target
    from ckptbench.plots.breakdown import breakdown_points
    from ckptbench.results.store import RUN_FILE

    measured = [p.point for p in breakdown_points(run) if p.point is not None]
    if not measured:
        return []
    try:
        cfg = parse_config(run.config, source=str(run.path / RUN_FILE))
        # A key that is not a point of this version (edited, or from a newer ckptbench), or not one of the run's own
        # config (a value edited by hand: a precision no step has), cannot be estimated.
        own = set(cfg.points_list())
        points = [p for p in measured if p in own]
        if not points:
            return []
        with EstimateProgressBar(err) as bar:
            return estimate_points(cfg, points, target=resolve_target(cfg, None), on_progress=bar.update)
    except CkptbenchError as exc:
        warn(f"memory breakdown: no estimate ({exc}); the plot shows measured static memory and the rest")
        return []
