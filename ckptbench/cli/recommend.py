"""`ckptbench recommend` and `ckptbench report`: the fastest point that fits a budget; report.md and plots."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from ckptbench.analysis.recommend import DEFAULT_HEADROOM
from ckptbench.cli.common import BudgetOpt, HeadroomOpt, RunArg, SeqLenOpt, err, fail, out, path_option
from ckptbench.errors import CkptbenchError, ConfigError, ResultsError

ReportOutOpt = Annotated[
    str | None, typer.Option("--out", help="Folder for report.md and the PNGs (default RUN/report).")
]


def recommend_cmd(
    run: RunArg,
    budget: BudgetOpt = None,
    seq_len: SeqLenOpt = None,
    headroom: HeadroomOpt = DEFAULT_HEADROOM,
    fmt: Annotated[str, typer.Option("--format", help="table or json.")] = "table",
) -> None:
    """The fastest measured point whose peak reserved memory fits the budget, and the Pareto front."""

    from ckptbench.render.recommend import rich_recommendation
    from ckptbench.results.store import load_run

    try:
        if fmt not in ("table", "json"):
            raise ConfigError(f"--format: {fmt!r} is not one of table, json")
        if budget is None:
            raise ConfigError("--budget is required, e.g. --budget 80 (GiB) or --budget 80GiB")
        rec = _recommendation(load_run(run), budget=budget, headroom=headroom, seq_len=seq_len)
    except CkptbenchError as exc:
        raise fail(exc) from None
    if fmt == "json":
        typer.echo(json.dumps(rec.to_json(), sort_keys=True, indent=2))
    else:
        out.print(rich_recommendation(rec))


def _recommendation(run: Any, *, budget: str, headroom: str, seq_len: int | None) -> Any:
    from ckptbench.analysis.recommend import recommend
    from ckptbench.units import parse_headroom, parse_size

    budget_bytes = parse_size(budget)
    headroom_bytes = parse_headroom(headroom, budget_bytes=budget_bytes)
    return recommend(run, budget_bytes=budget_bytes, headroom_bytes=headroom_bytes, seq_len=seq_len)


def report_cmd(
    run: RunArg,
    out_dir: ReportOutOpt = None,
    budget: BudgetOpt = None,
    seq_len: SeqLenOpt = None,
    headroom: HeadroomOpt = DEFAULT_HEADROOM,
) -> None:
    """Write report.md (tables, recommendation when --budget is given) and PNG plots of a run."""
    from ckptbench.render.report import default_out_dir, write_report
    from ckptbench.results.paths import check_writable_dir
    from ckptbench.results.store import load_run

    try:
        target = path_option(out_dir, option="--out")
        loaded = load_run(run)
        rec = _recommendation(loaded, budget=budget, headroom=headroom, seq_len=seq_len) if budget else None
        target = target or default_out_dir(loaded)
        check_writable_dir(target, option="--out")  # before the plots are drawn
        files = write_report(loaded, out_dir=target, rec=rec)
    except CkptbenchError as exc:
        raise fail(exc) from None
    except OSError as exc:
        raise fail(ResultsError(f"cannot write the report: {exc}")) from None
    for plot in files.plots:
        err.print(f"plot: {plot}", markup=False)
    out.print(str(files.markdown), markup=False)
