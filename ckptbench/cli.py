"""The ckptbench command line: parse, call one core function, render, map errors to exit codes."""

from __future__ import annotations

import contextlib
import signal
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from ckptbench import __version__
from ckptbench.errors import EXIT_BAD_INPUT, EXIT_REGRESSION, CkptbenchError, ConfigError, ResultsError
from ckptbench.grid import setup_label
from ckptbench.recommend import DEFAULT_HEADROOM
from ckptbench.units import fmt_bytes

app = typer.Typer(
    name="ckptbench",
    help="Measure what activation checkpointing costs and saves when training LLaMA-class models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
# Tables go to stdout; when it is a pipe or a file, do not squeeze them into 80 columns.
out = Console(highlight=False, soft_wrap=False, width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, highlight=False)


def fail(exc: CkptbenchError) -> typer.Exit:
    """Print one red line to stderr and turn the error into its exit code."""
    # The message may quote user input: escape markup, no emoji codes, never wrap it.
    err.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True, markup=True, emoji=False)
    return typer.Exit(exc.exit_code)


def _version(value: bool) -> None:
    if value:
        out.print(f"ckptbench {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Measure what activation checkpointing costs and saves when training LLaMA-class models."""


ConfigArg = Annotated[Path, typer.Argument(help="Sweep config (YAML), e.g. configs/llama7b.yaml.")]


class _Interrupts:
    """Ctrl-C and SIGTERM raise KeyboardInterrupt once; later ones are ignored while the run is marked."""

    def __enter__(self) -> _Interrupts:
        self.fired = False
        self.previous = {sig: signal.signal(sig, self._handle) for sig in (signal.SIGINT, signal.SIGTERM)}
        return self

    def _handle(self, *_: Any) -> None:
        if not self.fired:
            self.fired = True
            raise KeyboardInterrupt

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


@app.command()
def sweep(
    config: ConfigArg,
    out_dir: Annotated[
        Path | None, typer.Option("--out", help="Run directory (default results/<name>-<timestamp>).")
    ] = None,
    results_root: Annotated[Path, typer.Option("--results", help="Folder for new run directories.")] = Path(
        "results"
    ),
    resume: Annotated[
        Path | None,
        typer.Option("--resume", help="Finish an interrupted or failed run in RUN_DIR (same config).",
                     metavar="RUN_DIR"),
    ] = None,
    isolate: Annotated[
        bool, typer.Option("--isolate", help="Run each point in a fresh process: a crash fails one point.")
    ] = False,
    point_timeout: Annotated[
        float | None,
        typer.Option("--point-timeout", help="With --isolate: kill a point running longer than this.",
                     metavar="SECONDS"),
    ] = None,
    predict: Annotated[
        bool,
        typer.Option("--predict/--no-predict", help="Record each point's estimated peak next to the measured one."),
    ] = True,
) -> None:
    """Run a sweep: real training steps for every point of CONFIG; writes run.json and points.jsonl."""
    from ckptbench.config_load import load_config

    with _Interrupts():
        try:
            cfg = load_config(config)  # before torch is imported: a bad config fails in a blink
            from ckptbench.sweep import run_sweep

            with _SweepProgress(len(cfg.points_list())) as progress:
                outcome = run_sweep(
                    cfg, out=out_dir, results_root=results_root, on_progress=progress.update,
                    resume=resume, isolate=isolate, point_timeout_s=point_timeout, predict=predict,
                )
        except CkptbenchError as exc:
            raise fail(exc) from None
        except KeyboardInterrupt as exc:
            raise _interrupted(exc, config) from None
        for note in outcome.warnings:
            err.print(f"[yellow]warning:[/yellow] {escape(note)}", soft_wrap=True)
        run = _write_summaries(outcome.run_dir)
    _report(run, outcome, config)


def _report(run: Any, outcome: Any, config: Path) -> None:
    """After a sweep: failures and resume notes on stderr, the summary table on stdout."""
    from ckptbench.report import run_header, search_table, summary_table

    again = f"ckptbench sweep {escape(str(config))} --resume {escape(str(outcome.run_dir))}"
    failed = sum(1 for r in outcome.records if r.get("status") == "error")
    if failed:
        err.print(f"[yellow]warning:[/yellow] {failed} point(s) failed (status error); retry: {again}")
    if outcome.already_done:
        err.print(f"resumed: {outcome.already_done} points were already done; {len(outcome.records)} ran now")
    err.print(run_header(run), markup=False)
    out.print(summary_table(run))
    if run.meta.get("searches"):
        out.print(search_table(run))
    err.print(f"results: {escape(str(outcome.run_dir))}")


def _interrupted(exc: KeyboardInterrupt, config: Path) -> typer.Exit:
    """Say what is on disk after Ctrl-C/SIGTERM (and write the partial summaries); exit code 130."""
    # A SweepInterrupted once the run directory exists: it says where and how far.
    run_dir, finished, total = (getattr(exc, name, None) for name in ("run_dir", "finished", "total"))
    if run_dir is None:
        err.print("[yellow]interrupted:[/yellow] before the sweep started; no point was run")
        return typer.Exit(130)
    with contextlib.suppress(CkptbenchError, OSError):  # the points themselves are safe already
        _write_summaries(run_dir)
    err.print(
        f"[yellow]interrupted:[/yellow] {finished} of {total} points are on disk in "
        f"{escape(str(run_dir))}; finish with: ckptbench sweep {escape(str(config))} "
        f"--resume {escape(str(run_dir))}",
        soft_wrap=True,
    )
    return typer.Exit(130)


def _write_summaries(run_dir: Path) -> Any:
    """Write summary.csv/summary.md of what is on disk; returns the loaded run."""
    import warnings

    from ckptbench.report import write_summaries
    from ckptbench.results import load_run

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a truncated last line was already reported by the sweep
        run = load_run(run_dir)
    write_summaries(run)
    return run


class _SweepProgress:
    """A rich progress bar over points on stderr, with a line per finished point."""

    def __init__(self, total: int) -> None:
        self.progress = Progress(
            TextColumn("[bold]sweep"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            TextColumn("{task.description}"),
            console=err,
            transient=False,
        )
        self.task = self.progress.add_task("", total=total)

    def __enter__(self) -> _SweepProgress:
        self.started = False  # shown from the first point on: an early error stays a single line
        return self

    def __exit__(self, *exc: object) -> None:
        if self.started:
            self.progress.__exit__(*exc)

    def update(self, event: Any) -> None:
        from ckptbench.results import point_stats

        if not self.started:
            self.progress.__enter__()
            self.started = True
        p = event.point
        label = " ".join(filter(None, [f"{p.layout} b={p.batch_size} s={p.seq_len} {p.precision}",
                                       setup_label(p.key)]))
        if event.record is None:
            self.progress.update(self.task, description=escape(label), total=event.total)
            return
        rec = event.record
        stats = point_stats(rec)
        if rec["status"] == "ok":
            detail = (
                f"peak {fmt_bytes(rec['peak_allocated_bytes'])}, "
                f"{stats['median_step_time_s'] * 1e3:.1f} ms/step, {stats['tokens_per_s']:,.0f} tok/s"
            )
        else:
            detail = f"{rec['status']}: {rec.get('reason') or ''}"
        self.progress.console.print(f"  {label}: {detail}", markup=False)
        self.progress.advance(self.task)


@app.command()
def layouts(config: ConfigArg) -> None:
    """Print exactly which decoder layers (and sub-modules) each layout of CONFIG checkpoints."""
    from ckptbench.config_load import load_config
    from ckptbench.layouts import parse_layout
    from ckptbench.report import rich_table

    try:
        cfg = load_config(config)
    except CkptbenchError as exc:
        raise fail(exc) from None
    n = cfg.model.num_layers
    names = list(dict.fromkeys([*cfg.sweep.layout, *(p.layout for p in cfg.points if p.layout)]))
    rows = []
    for name in names:
        plan = parse_layout(name, n)
        wraps = "decoder layer" if plan.granularity == "block" else ", ".join(plan.submodules)
        rows.append(
            {
                "layout": name,
                "layers (0-based)": plan.describe_layers(),
                "count": f"{len(plan.layers)}/{n}",
                "wraps": wraps if plan.layers else "-",
                "modules": _modules_text(plan.targets),
            }
        )
    columns = ["layout", "layers (0-based)", "count", "wraps", "modules"]
    out.print(rich_table(rows, columns, title=f"{cfg.model.name}: {n} decoder layers"))


class Format(str, Enum):
    table = "table"
    markdown = "markdown"
    csv = "csv"
    json = "json"


RunArg = Annotated[str, typer.Argument(help="A run directory, or a run name under --results.")]
FormatOpt = Annotated[Format, typer.Option("--format", help="table (default), markdown, csv or json.")]
OnlyChangedOpt = Annotated[bool, typer.Option("--only-changed", help="Hide unchanged and within-noise rows.")]
FailMemoryOpt = Annotated[
    float | None,
    typer.Option("--fail-memory", min=0, metavar="PCT", help="Exit 3 if peak allocated grows > PCT%."),
]
FailTimeOpt = Annotated[
    float | None,
    typer.Option("--fail-time", min=0, metavar="PCT", help="Exit 3 if step time grows > PCT% (significant)."),
]
FailOomOpt = Annotated[
    bool, typer.Option("--fail-oom", help="Exit 3 on a new OOM (implied by --fail-memory/--fail-time).")
]
MemoryTolOpt = Annotated[
    float,
    typer.Option("--memory-tolerance", min=0, metavar="PCT", help="A memory change up to PCT% is unchanged."),
]
TimeNoiseOpt = Annotated[
    float, typer.Option("--time-noise", min=0, metavar="PCT", help="A step-time change under PCT% is noise.")
]
ResultsOpt = Annotated[Path, typer.Option("--results", help="Where run names are looked up.")]


@app.command()
def compare(
    run_a: RunArg,
    run_b: RunArg,
    fmt: FormatOpt = Format.table,
    only_changed: OnlyChangedOpt = False,
    fail_memory: FailMemoryOpt = None,
    fail_time: FailTimeOpt = None,
    fail_oom: FailOomOpt = False,
    memory_tolerance: MemoryTolOpt = 0.1,
    time_noise: TimeNoiseOpt = 2.0,
    results_root: ResultsOpt = Path("results"),
) -> None:
    """Compare RUN_B against the base RUN_A: memory, speed, OOMs, environment; gates for CI."""
    from ckptbench.compare import Gates, Thresholds, compare_refs

    oom = fail_oom or fail_memory is not None or fail_time is not None
    gates = Gates(memory_pct=fail_memory, time_pct=fail_time, new_oom=oom)
    thresholds = Thresholds(memory_rtol=memory_tolerance / 100, time_rtol=time_noise / 100)
    try:
        comp = compare_refs(run_a, run_b, results_root=results_root, thresholds=thresholds, gates=gates)
    except CkptbenchError as exc:
        raise fail(exc) from None
    _print_comparison(comp, fmt, only_changed=only_changed)
    if comp.gate_failures:
        raise typer.Exit(EXIT_REGRESSION)


def _print_comparison(comp: Any, fmt: Format, *, only_changed: bool) -> None:
    """Tables and machine-readable output to stdout; warnings (table/csv) and gate failures to stderr."""
    from ckptbench.compare_report import RENDERERS, compare_table, warning_lines

    if fmt in (Format.table, Format.csv):  # markdown and json carry the warnings inside
        for line in warning_lines(comp):
            err.print(f"[yellow]warning:[/yellow] {escape(line)}", soft_wrap=True)
    if fmt is Format.table:
        for renderable in compare_table(comp, only_changed=only_changed):
            out.print(renderable, soft_wrap=True)
    else:
        sys.stdout.write(RENDERERS[fmt.value](comp, only_changed=only_changed))
    for line in comp.gate_failures:
        err.print(f"[red]gate failed:[/red] {escape(line)}", soft_wrap=True)


RunArg = Annotated[str, typer.Argument(help="Run directory, or a run name under results/.")]
BudgetOpt = Annotated[
    str | None, typer.Option("--budget", help="Memory budget: GiB (80) or with a unit (80GiB, 512MiB).")
]
HeadroomOpt = Annotated[
    str, typer.Option("--headroom", help="Kept free under the budget: a share of it (5%) or a size (2GiB).")
]
SeqLenOpt = Annotated[
    int | None, typer.Option("--seq-len", help="Only consider points of this sequence length.")
]
ReportOutOpt = Annotated[
    Path | None, typer.Option("--out", help="Folder for report.md and the PNGs (default RUN/report).")
]


@app.command("recommend")
def recommend_cmd(
    run: RunArg,
    budget: BudgetOpt = None,
    seq_len: SeqLenOpt = None,
    headroom: HeadroomOpt = DEFAULT_HEADROOM,
    fmt: Annotated[str, typer.Option("--format", help="table or json.")] = "table",
) -> None:
    """The fastest measured point whose peak reserved memory fits the budget, and the Pareto front."""
    import json

    from ckptbench.recommend_report import rich_recommendation
    from ckptbench.results import load_run

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
    from ckptbench.recommend import recommend
    from ckptbench.units import parse_headroom, parse_size

    budget_bytes = parse_size(budget)
    headroom_bytes = parse_headroom(headroom, budget_bytes=budget_bytes)
    return recommend(run, budget_bytes=budget_bytes, headroom_bytes=headroom_bytes, seq_len=seq_len)


@app.command("report")
def report_cmd(
    run: RunArg,
    out_dir: ReportOutOpt = None,
    budget: BudgetOpt = None,
    seq_len: SeqLenOpt = None,
    headroom: HeadroomOpt = DEFAULT_HEADROOM,
) -> None:
    """Write report.md (tables, recommendation when --budget is given) and PNG plots of a run."""
    from ckptbench.results import load_run
    from ckptbench.run_report import default_out_dir, write_report

    try:
        loaded = load_run(run)
        rec = _recommendation(loaded, budget=budget, headroom=headroom, seq_len=seq_len) if budget else None
        files = write_report(loaded, out_dir=out_dir or default_out_dir(loaded), rec=rec)
    except CkptbenchError as exc:
        raise fail(exc) from None
    except OSError as exc:
        raise fail(ResultsError(f"cannot write the report: {exc}")) from None
    for plot in files.plots:
        err.print(f"plot: {plot}", markup=False)
    out.print(str(files.markdown), markup=False)


TargetOpt = Annotated[
    str | None, typer.Option("--target", help="cuda (default) or cpu (what the live-tensor tracker measures).")
]


@app.command()
def estimate(
    config: Annotated[Path, typer.Argument(help="Sweep config (YAML), or a run directory to set against.")],
    fmt: FormatOpt = Format.table,
    budget: BudgetOpt = None,
    target: TargetOpt = None,
    full: Annotated[bool, typer.Option("--full", help="Trace the whole model for every point (slow).")] = False,
) -> None:
    """Predict, without a GPU, each point's peak allocated memory and what it is made of.

    Given a run directory, estimate its points and show what the run measured next to them.
    """
    from ckptbench.estimate import estimate_config, load_input
    from ckptbench.estimate_report import RENDERERS, EstimateProgressBar, estimate_table
    from ckptbench.units import parse_size

    try:
        cfg, measured = load_input(config)
        budget_bytes = parse_size(budget) if budget is not None else None
        with EstimateProgressBar(err) as bar:
            method = "full" if full else "fast"
            estimates = estimate_config(
                cfg, target=target, budget_bytes=budget_bytes, method=method, on_progress=bar.update
            )
    except CkptbenchError as exc:
        raise fail(exc) from None
    if fmt is Format.table:
        out.print(estimate_table(estimates, name=cfg.name, measured=measured))
    else:
        sys.stdout.write(RENDERERS[fmt.value](estimates, name=cfg.name, measured=measured))


def _modules_text(targets: tuple[str, ...]) -> str:
    if not targets:
        return "-"
    shown = [f"model.layers.{t}" for t in targets[:3]]
    more = f" (+{len(targets) - 3} more)" if len(targets) > 3 else ""
    return ", ".join(shown) + more


def main() -> None:
    """Entry point for ``python -m ckptbench``."""
    try:
        app()
    except CkptbenchError as exc:  # safety net: commands convert their own errors
        err.print(f"[red]error:[/red] {exc}")
        sys.exit(exc.exit_code)


__all__ = ["EXIT_BAD_INPUT", "app", "main"]
