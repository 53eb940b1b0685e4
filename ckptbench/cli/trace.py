"""`ckptbench trace-allocator`: record the CUDA caching allocator's own trace of each point (GPU only)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from ckptbench.cli.common import err, fail, out, path_option
from ckptbench.errors import CkptbenchError, ConfigError, MachineError, ResultsError


def trace_allocator(
    config: Annotated[
        Path | None,
        typer.Argument(metavar="[CONFIG]", show_default=False,
                       help="Sweep config (YAML) whose points are traced; not with --snapshot-from."),
    ] = None,
    out_dir: Annotated[
        str | None,  # not Path: typer turns '' into '.', and '' must be refused (cli/common.py path_option)
        typer.Option("--out", metavar="DIR|FILE", show_default=False,
                     help="Folder for one <point>.json.gz trace per point; with --snapshot-from, the snapshot "
                          "file (default: the trace's name with .pickle)."),
    ] = None,
    snapshot_from: Annotated[
        str | None,
        typer.Option("--snapshot-from", metavar="TRACE", show_default=False,
                     help="Convert a trace this command wrote (.json.gz) into a memory-visualizer snapshot "
                          "(pytorch.org/memory_viz), segments at its peak reserved; no GPU needed."),
    ] = None,
) -> None:
    """Run each point of CONFIG in its own process with the allocator's history on; write compact JSON traces.

    The traces are what tests/test_allocator_traces.py replays through ckptbench's allocator model.
    With --snapshot-from TRACE, convert one such trace into the pickle that PyTorch's memory visualizer
    opens, as `ckptbench estimate --snapshot` writes for a predicted one.
    """
    if snapshot_from is not None:
        _snapshot_from(snapshot_from, config=config, out_file=out_dir)
        return
    from ckptbench.config.load import load_config
    from ckptbench.results.paths import check_writable_dir

    try:
        if config is None:
            raise ConfigError("trace-allocator needs a CONFIG to trace (or --snapshot-from TRACE to convert one)")
        if out_dir is None:
            raise ConfigError("trace-allocator needs --out DIR, the folder for the traces")
        folder = path_option(out_dir, option="--out") or Path(".")
        check_writable_dir(folder, option="--out")  # before a point runs: a GPU's minutes are not spent for nothing
        cfg = load_config(config)
        import torch

        if cfg.device == "cpu" or not torch.cuda.is_available():
            raise MachineError("trace-allocator records the CUDA caching allocator: it needs a CUDA GPU")
        from ckptbench.processes.alloc_trace import trace_points

        records = trace_points(cfg, folder, gpu_name=torch.cuda.get_device_name())
    except CkptbenchError as exc:
        raise fail(exc) from None
    # Each point ran in its own process from an empty allocator: its record is a fresh-process measurement.
    (folder / "records.jsonl").write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
    for rec in records:
        err.print(f"{rec.get('trace_file') or 'no trace'}: {rec.get('status', 'error')} {rec.get('reason') or ''}",
                  markup=False)
    out.print(json.dumps([{k: r.get(k) for k in ("key", "status", "trace_file")} for r in records], indent=2),
              markup=False)


def _snapshot_default(trace: Path) -> Path:
    """'point.json.gz' -> 'point.pickle', beside the trace."""
    name = trace.name
    for suffix in (".json.gz", ".json", ".gz"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    return trace.with_name(name + ".pickle")


def _snapshot_from(trace_arg: str, *, config: Path | None, out_file: str | None) -> None:
    """``--snapshot-from TRACE [--out FILE]``: the recorded trace as a ``_snapshot()`` pickle."""
    from ckptbench.estimator.snapshot import read_compact_trace, recorded_snapshot, write_snapshot
    from ckptbench.units import fmt_bytes

    try:
        if config is not None:
            raise ConfigError("--snapshot-from converts a trace: give no CONFIG with it")
        trace_path = path_option(trace_arg, option="--snapshot-from")
        assert trace_path is not None
        target = path_option(out_file, option="--out") or _snapshot_default(trace_path)
        if target.exists() and target.resolve() == trace_path.resolve():
            raise ConfigError(f"--out {target}: that is the trace itself; give another file")
        if target.is_dir():
            raise ConfigError(f"--out {target}: a folder; give the snapshot's file name, e.g. {target}/peak.pickle")
        if not target.parent.is_dir():
            raise ConfigError(f"--out {target}: no such folder {target.parent}")
        try:
            trace = read_compact_trace(trace_path)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        snapshot = recorded_snapshot(trace)
        try:
            write_snapshot(snapshot, target)
        except OSError as exc:
            raise ResultsError(f"--out {target}: cannot write the snapshot ({exc.strerror or exc})") from None
    except CkptbenchError as exc:
        raise fail(exc) from None
    reserved = sum(seg["total_size"] for seg in snapshot["segments"])
    err.print(f"snapshot: {target} (recorded peak reserved {fmt_bytes(reserved)}; open it at "
              "https://pytorch.org/memory_viz)", soft_wrap=True, markup=False)
