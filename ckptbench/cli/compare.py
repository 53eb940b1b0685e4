"""`ckptbench compare`: what changed between two runs, with gates for CI."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from ckptbench.cli.common import Format, FormatOpt, ResultsOpt, err, fail, finite, out, warn
from ckptbench.errors import EXIT_BAD_INPUT, EXIT_REGRESSION, CkptbenchError
from ckptbench.estimator.collector import gc_paused

if TYPE_CHECKING:  # imported when a comparison is made: the CLI stays fast to start
    from ckptbench.analysis.compare import Comparison

OnlyChangedOpt = Annotated[bool, typer.Option("--only-changed", help="Hide unchanged and within-noise rows.")]
FailMemoryOpt = Annotated[
    float | None,
    typer.Option("--fail-memory", min=0, callback=finite, metavar="PCT", help="Exit 3 if peak allocated grows > PCT%."),
]
FailTimeOpt = Annotated[
    float | None,
    typer.Option(
        "--fail-time", min=0, callback=finite, metavar="PCT",
        help="Exit 3 if step time grows > PCT% (and the verdict says worse over all points); exit 2 if too few "
             "or noisy (busy, spread) steps cannot judge it.",
    ),
]
FailOomOpt = Annotated[
    bool, typer.Option("--fail-oom", help="Exit 3 on a new OOM (implied by --fail-memory and by --fail-time).")
]
MemoryTolOpt = Annotated[
    float,
    typer.Option(
        "--memory-tolerance", min=0, callback=finite, metavar="PCT", help="A memory change up to PCT% is unchanged."
    ),
]
TimeNoiseOpt = Annotated[
    float,
    typer.Option(
        "--time-noise", min=0, callback=finite, metavar="PCT", help="A step-time change under PCT% is noise."
    ),
]

AllowDifferentOpt = Annotated[
    bool,
    typer.Option(
        "--allow-different",
        help="Compare runs of different models or devices, or with no point in common (refused otherwise).",
    ),
]
AllowMixedOpt = Annotated[
    bool,
    typer.Option("--allow-mixed-gpus", help="Compare runs whose points ran on different GPU models anyway."),
]


RunA = Annotated[str, typer.Argument(metavar="RUN_A", help="The base run: a directory or a name under --results.")]
RunB = Annotated[str, typer.Argument(metavar="RUN_B", help="The new run, compared against RUN_A.")]


def compare(
    run_a: RunA,
    run_b: RunB,
    fmt: FormatOpt = Format.table,
    only_changed: OnlyChangedOpt = False,
    fail_memory: FailMemoryOpt = None,
    fail_time: FailTimeOpt = None,
    fail_oom: FailOomOpt = False,
    memory_tolerance: MemoryTolOpt = 0.1,
    time_noise: TimeNoiseOpt = 2.0,
    results_root: ResultsOpt = Path("results"),
    allow_mixed_gpus: AllowMixedOpt = False,
    allow_different: AllowDifferentOpt = False,
) -> None:
    """Compare RUN_B against the base RUN_A: memory, speed, OOMs, environment; gates for CI."""
    from ckptbench.analysis.compare import Gates, compare_refs
    from ckptbench.analysis.marks import Thresholds

    oom = fail_oom or fail_memory is not None or fail_time is not None
    gates = Gates(memory_pct=fail_memory, time_pct=fail_time, new_oom=oom)
    thresholds = Thresholds(memory_rtol=memory_tolerance / 100, time_rtol=time_noise / 100)
    with gc_paused():  # two large runs read and compared: linear, not slowed by the cyclic collector
        try:
            comp = compare_refs(run_a, run_b, results_root=results_root, thresholds=thresholds, gates=gates,
                                allow_mixed_gpus=allow_mixed_gpus, allow_different=allow_different)
        except CkptbenchError as exc:
            raise fail(exc) from None
        _print_comparison(comp, fmt, only_changed=only_changed)
    if comp.gate_failures:  # a regression found outranks a gate that could not be judged
        raise typer.Exit(EXIT_REGRESSION)
    if comp.gate_errors:
        raise typer.Exit(EXIT_BAD_INPUT)


def _print_comparison(comp: Comparison, fmt: Format, *, only_changed: bool) -> None:
    """Tables and machine-readable output to stdout; warnings (table/csv) and gate failures to stderr."""
    from ckptbench.render.compare import RENDERERS, compare_table, warning_lines

    if fmt in (Format.table, Format.csv):  # markdown and json carry the warnings inside
        for line in warning_lines(comp):
            warn(line)
    if fmt is Format.table:
        for renderable in compare_table(comp, only_changed=only_changed):
            out.print(renderable, soft_wrap=True)
    else:
        sys.stdout.write(RENDERERS[fmt.value](comp, only_changed=only_changed))
    # One print each: a line per failing point (20,000 of them after a slowdown), not a console call per line.
    if comp.gate_failures:
        err.print("\n".join(f"[red]gate failed:[/red] {escape(line)}" for line in comp.gate_failures), soft_wrap=True)
    if comp.gate_errors:
        err.print("\n".join(f"[red]error:[/red] {escape(line)}" for line in comp.gate_errors), soft_wrap=True)
