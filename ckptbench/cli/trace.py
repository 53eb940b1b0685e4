"""`ckptbench trace-allocator`: record the CUDA caching allocator's own trace of each point (GPU only)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from ckptbench.cli.common import ConfigArg, err, fail, out, path_option
from ckptbench.errors import CkptbenchError, MachineError


def trace_allocator(
    config: ConfigArg,
    out_dir: Annotated[
        str,  # not Path: typer turns '' into '.', and '' must be refused (cli/common.py path_option)
        typer.Option("--out", metavar="DIR", help="Folder for one <point>.json.gz trace per point."),
    ],
) -> None:
    """Run each point of CONFIG in its own process with the allocator's history on; write compact JSON traces.

    The traces are what tests/test_allocator_traces.py replays through ckptbench's allocator model.
    """
    from ckptbench.config.load import load_config
    from ckptbench.results.paths import check_writable_dir

    try:
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
