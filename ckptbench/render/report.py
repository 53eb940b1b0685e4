"""report.md of a run: header, recommendation, Pareto front, plots and the summary table."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ckptbench.analysis.recommend import Recommendation, candidates, pareto_front
from ckptbench.errors import ResultsError
from ckptbench.estimator.record import Estimate
from ckptbench.plots.breakdown import plot_breakdown
from ckptbench.plots.peaks_speed import plot_peak_memory, plot_speed
from ckptbench.plots.tradeoff import plot_tradeoff
from ckptbench.render.layer_report import layer_section
from ckptbench.render.recommend import markdown_pareto, markdown_recommendation
from ckptbench.render.summary import run_header, size_unit, summary_markdown
from ckptbench.render.tune import markdown_tune, tune_search
from ckptbench.results.store import Run, write_text_atomic
from ckptbench.units import SizeUnit

REPORT_FILE = "report.md"
PLOT_TITLES = {
    "peak_memory.png": "Peak reserved memory per layout and batch size",
    "speed.png": "Speed relative to no checkpointing",
    "tradeoff.png": "Memory against throughput, with the Pareto front",
    "memory_breakdown.png": "Memory at the peak per layout",
}
PLOT_CAPTIONS = {
    "peak_memory.png": "Bars: peak reserved memory of each point; OOM/SKIPPED mark points that did not run.",
    "speed.png": (
        "Tokens/s of each point over the tokens/s of `none` at the same batch size (where `none` did not run: "
        "the fastest point of that batch, named in the legend); error bar: the inter-quartile range of the "
        "point's measured steps. The tables below give the absolute step times."
    ),
    "tradeoff.png": (
        "Every ok point, one colour and marker per layout, larger markers for larger batches; the black "
        "staircase is the Pareto front (no point uses less memory and runs faster). With a budget: the budget "
        "line, the headroom band and the recommended point."
    ),
    "memory_breakdown.png": (
        "At the batch and sequence length where the most layouts ran. Coloured parts: ckptbench estimate's "
        "breakdown at its predicted peak (a fake-tensor trace of the same step: an estimate, not a measurement); "
        "without an estimate, the measured parameters + optimizer state and the rest of the measured peak. "
        "Measured: the black tick (peak allocated), the hatched part (reserved, not allocated) and the number "
        "(peak reserved)."
    ),
}


@dataclass
class ReportFiles:
    """What ``write_report`` wrote."""

    markdown: Path
    plots: list[Path]


def default_out_dir(run: Run) -> Path:
    return run.path / "report"


def write_report(
    run: Run, *, out_dir: Path, rec: Recommendation | None = None, estimates: Sequence[Estimate] = ()
) -> ReportFiles:
    """Write the PNG plots and report.md (which links them by relative path) into ``out_dir``;
    ``estimates`` (of ``breakdown_plot.breakdown_points``) split the peaks in the breakdown plot."""
    if not run.points:
        raise ResultsError(f"{run.path}: the run has no finished points yet; nothing to report")
    size = rec.size if rec is not None else size_unit(run)  # one unit for every size of the report
    plots = write_plots(run, out_dir, rec=rec, size=size, estimates=estimates)
    sections = [_header(run, size)]
    if rec is not None:
        sections.append(markdown_recommendation(rec))
        sections.append(markdown_pareto(rec.pareto, limit_bytes=rec.limit_bytes, size=size))
    else:
        sections.append(markdown_pareto(pareto_front(candidates(run)), size=size))
    search = tune_search(run)
    if search is not None:  # a `ckptbench tune` run: how the answer was found
        sections.append(markdown_tune(search, run=run, size=size))
    sections.append(_plots_section(plots))
    sections.append("## All points\n\n" + summary_markdown(run, size=size))
    if run.environment.device_type == "cpu":
        sections.append(
            "Memory on CPU is measured by ckptbench's live-tensor tracker (reserved = allocated); "
            "CPU step times include the tracker's overhead.\n"
        )
    limit = rec.limit_bytes if rec is not None else None
    # saving and cost per checkpointed layer
    layers_md, layers_plot = layer_section(run, out_dir, limit_bytes=limit, size=size)
    sections.append(layers_md)
    if layers_plot is not None:
        plots.append(layers_plot)
    path = out_dir / REPORT_FILE
    write_text_atomic(path, "\n".join(sections))
    return ReportFiles(markdown=path, plots=plots)


def write_plots(
    run: Run, out_dir: Path, *, rec: Recommendation | None = None, size: SizeUnit | None = None,
    estimates: Sequence[Estimate] = (),
) -> list[Path]:
    """All four PNGs into ``out_dir``; returns their paths in report order."""
    out_dir.mkdir(parents=True, exist_ok=True)
    budget = rec.budget_bytes if rec is not None else None
    return [
        plot_peak_memory(run, out_dir / "peak_memory.png", budget_bytes=budget, size=size),
        plot_speed(run, out_dir / "speed.png", size=size),
        plot_tradeoff(run, out_dir / "tradeoff.png", rec=rec, size=size),
        plot_breakdown(run, out_dir / "memory_breakdown.png", budget_bytes=budget, size=size, estimates=estimates),
    ]


def _header(run: Run, size: SizeUnit) -> str:
    """Title, run line and facts; sizes in the report's one unit."""
    cfg = run.config
    total = run.environment.gpu_total_memory_bytes
    lines = [f"# ckptbench report: {run.title}\n", f"{run_header(run)}\n"]
    if run.meta.note:
        lines.append(f"> **Note:** {run.meta.note}\n")
    facts = [
        ("GPU memory", size(total) if total else None),
        ("model", (cfg.get("model") or {}).get("preset")),
        ("optimizer", cfg.get("optimizer")),
        ("steps", f"{cfg.get('warmup_steps')} warm-up + {cfg.get('measured_steps')} measured"
         if cfg.get("measured_steps") is not None else None),
        ("memory cap", size(cfg["memory_cap_gib"] * 2**30) if cfg.get("memory_cap_gib") else None),
        ("created", run.meta.created_at),
        ("git", run.meta.git_sha),
    ]
    shown = [f"{name}: {value}" for name, value in facts if value]
    if shown:
        lines.append(" · ".join(shown) + "\n")
    return "\n".join(lines)


def _plots_section(plots: list[Path]) -> str:
    parts = ["## Plots\n"]
    for p in plots:
        title = PLOT_TITLES.get(p.name, p.stem)
        parts.append(f"### {title}\n\n![{title}]({p.name})\n\n{PLOT_CAPTIONS.get(p.name, '')}\n")
    return "\n".join(parts)
