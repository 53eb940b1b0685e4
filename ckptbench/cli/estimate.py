"""`ckptbench estimate`: predicted peak memory of a config's points, or of a run's next to its measurements."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ckptbench.cli.common import BudgetOpt, Format, FormatOpt, err, fail, out, reading, warn
from ckptbench.cli.progress import EstimateProgressBar
from ckptbench.errors import CkptbenchError, ConfigError, RunFailure

if TYPE_CHECKING:  # the estimator imports torch: the CLI stays fast to start
    from ckptbench.config.schema import SweepConfig
    from ckptbench.estimator.gpus import GpuModel

TargetOpt = Annotated[
    str | None,
    typer.Option("--target", metavar="cuda|cpu", help="cuda (default) or cpu (what the live-tensor tracker measures)."),
]
SourceArg = Annotated[
    Path,
    typer.Argument(
        metavar="CONFIG|RUN",
        help="A sweep config (YAML), or a run directory: its points, next to what the run measured.",
        show_default=False,
    ),
]
GpuOpt = Annotated[
    str | None,
    typer.Option(
        "--gpu", metavar="CARD",
        help="The CUDA card to predict for (implies --target cuda): h200 (default; a run's own GPU), h100-80gb, "
             "a100-80gb, a100-40gb, l40s. Without --budget, its memory is the budget.",
    ),
]


def estimate(
    source: SourceArg,
    fmt: FormatOpt = Format.table,
    budget: BudgetOpt = None,
    target: TargetOpt = None,
    full: Annotated[bool, typer.Option("--full", help="Trace the whole model for every point (slow).")] = False,
    parallel: Annotated[
        str | None,
        typer.Option("--parallel", metavar="SPEC", help="Estimate every point spread this way instead: ddp:N, fsdp2:N, "
                     "fsdp2:N:noreshard (per rank, on the fake process group; rank 0 holds the largest shard)."),
    ] = None,
    gpu: GpuOpt = None,
    times_from: Annotated[
        list[str] | None,
        typer.Option("--times-from", metavar="RUN", help="Add step times from these runs' measured points (repeat "
                     "for several runs): fitted inside their measured cells, modelled from each point's ops in "
                     "others, transferred to another card; predicted step time, tokens/s, their source and "
                     "error bound."),
    ] = None,
    snapshot: Annotated[
        Path | None,
        typer.Option("--snapshot", metavar="FILE",
                     help="Also write each point's predicted allocator timeline as a torch.cuda.memory._snapshot() "
                          "pickle (one file per point): open it at https://pytorch.org/memory_viz."),
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option("--workers", metavar="N", min=1,
                     help="Processes the traces and points are spread over (default: one per core this process may "
                          "use; 1: this process alone). The estimates do not depend on it."),
    ] = None,
) -> None:
    """Predict, without a GPU, each point's peak allocated and reserved memory and what it is made of.

    Given a run directory, estimate its points and show what the run measured next to them.
    """
    from ckptbench.analysis.step_time import StepTimeModel
    from ckptbench.config.load import with_parallel
    from ckptbench.estimator import tracer
    from ckptbench.estimator.estimator import estimate_config, points_op_costs, resolve_target, run_op_costs
    from ckptbench.estimator.gpus import gpu_for_name, gpu_model
    from ckptbench.render.estimate import RENDERERS, estimate_table
    from ckptbench.results.inputs import load_input, measured_gpu, measured_reserved
    from ckptbench.results.store import load_run
    from ckptbench.units import parse_size

    try:
        with reading(source):  # 99,999 explicit points take a minute to read and expand, before any trace
            cfg, measured = load_input(source)
        if parallel is not None:
            cfg = with_parallel(cfg, parallel)
        reserved = measured_reserved(source)
        measured_on = measured_gpu(source)
        card = gpu_model(gpu) if gpu is not None else gpu_for_name(measured_on)
        if gpu is not None:  # a card is a CUDA device model: predicting for it on the CPU would ignore it
            if target == "cpu":
                raise ConfigError(f"--gpu {gpu} predicts for a CUDA card; --target cpu contradicts it")
            target = "cuda"
        if card is not None and gpu is not None and (measured or reserved) and gpu_for_name(measured_on) is not card:
            # Predictions for one card beside another card's measurements: no error between them.
            warn(f"predicting for {card.name}; the run was measured on {measured_on or 'another device'}: its "
                 "measurements and the error columns are left out")
            measured, reserved = {}, {}
        budget_bytes = parse_size(budget) if budget is not None else None
        if snapshot is not None:  # checked before the estimate: where each file goes, and that it can be made
            _check_snapshots(_snapshot_config(cfg, gpu), snapshot, target=target)
        with EstimateProgressBar(err) as bar:
            estimates = estimate_config(
                cfg, target=target, budget_bytes=budget_bytes, method="full" if full else "fast",
                gpu=card if gpu is not None else None, default_gpu=card, on_progress=bar.update, workers=workers,
            )
        tracer.answered()  # its traces are on disk: the next estimate of it starts no tracer
        times = None
        if times_from:
            # Fitted inside the runs' measured cells; elsewhere modelled (or transferred) from each point's op costs.
            runs = [load_run(ref) for ref in times_from]
            model = StepTimeModel.from_runs(runs, ops=run_op_costs(runs))
            ops = points_op_costs(cfg, [e.point for e in estimates], target=resolve_target(cfg, target),
                                  gpu=card)
            times = {e.point.key_id: model.predict(e.point, gpu=gpu_model(e.reserved.gpu) if e.reserved else None,
                                                   ops=ops.get(e.point.key_id)) for e in estimates}
        if snapshot is not None:
            _write_snapshots(_snapshot_config(cfg, gpu), snapshot, card=card, full=full)
    except CkptbenchError as exc:
        raise fail(exc) from None
    if fmt is Format.table:
        out.print(estimate_table(estimates, name=cfg.name, measured=measured, reserved=reserved, times=times))
    else:
        sys.stdout.write(RENDERERS[fmt.value](estimates, name=cfg.name, measured=measured, reserved=reserved,
                                              times=times))


def _snapshot_config(cfg: SweepConfig, gpu: str | None) -> SweepConfig:
    """As the estimate: a card given by --gpu is the limit, not the config's emulation cap."""
    return cfg.model_copy(update={"memory_cap_gib": None}) if gpu is not None else cfg


def _check_snapshots(cfg: SweepConfig, path: Path, *, target: str | None) -> None:
    """--snapshot, before any trace: a CUDA target, and a file each point's timeline can be written to (not a run's
    own file, through a link either; not a FIFO, which blocked the write forever; in a folder that can be made)."""
    from ckptbench.estimator.estimator import resolve_target
    from ckptbench.estimator.snapshot import snapshot_paths
    from ckptbench.results.paths import check_not_run_file, check_output_file

    if resolve_target(cfg, target) != "cuda":
        raise ConfigError("--snapshot: a CUDA allocator timeline needs a CUDA target (--gpu CARD or --target cuda)")
    check_not_run_file(path, option="--snapshot")  # the name given, also when each point's file has its own
    for out_path in snapshot_paths(path, cfg.points_list()):
        check_output_file(out_path, option="--snapshot")


def _write_snapshots(cfg: SweepConfig, path: Path, *, card: GpuModel | None, full: bool) -> None:
    """--snapshot: the predicted allocator timelines (estimator/snapshot.py), one pickle per point, each written
    whole or not at all; a full disk is a failure of the disk (exit 1), not bad input."""
    from ckptbench.estimator.gpus import DEFAULT_GPU, gpu_model
    from ckptbench.estimator.snapshot import point_snapshots, snapshot_paths, write_snapshot

    points = cfg.points_list()
    paths = snapshot_paths(path, points)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        for out_path, snap in zip(paths, point_snapshots(cfg, points, gpu=card or gpu_model(DEFAULT_GPU),
                                                          method="full" if full else "fast"), strict=True):
            err.print(f"snapshot: {write_snapshot(snap, out_path)}", markup=False)
    except OSError as exc:
        raise RunFailure(f"--snapshot: cannot write {path} ({exc.strerror or exc}); no snapshot file is left cut"
                         ) from None
    err.print("open a snapshot at https://pytorch.org/memory_viz (every address and size in it is predicted)",
              markup=False)
