"""``python -m ckptbench.processes.point_process REQUEST.json``: a point's own process (``--isolate``, a
sharded point's ranks, a search's boundary, a point with its own allocator settings): a crash, a CUDA
error or a hang fails that point only.

The sweep's process keeps the sweep's bookkeeping (skips after OOM, loss references). This process
rebuilds the same config, picks the point by its key, measures it and writes its record to a JSON
file; the launcher (processes/launch.py) records a process that dies, exits without a record or
outlives ``--point-timeout`` as a failed point (``status: error``) with the tail of its stderr.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import torch

from ckptbench.config.grid import Point
from ckptbench.config.load import parse_config
from ckptbench.config.schema import SweepConfig
from ckptbench.measure.device import make_probe, resolve_device
from ckptbench.measure.environment import intra_op_threads, placement
from ckptbench.measure.runner import Runner
from ckptbench.processes.alloc_trace import start_recording, write_trace
from ckptbench.processes.launch import result_path
from ckptbench.processes.request import PointRequest
from ckptbench.processes.workdirs import alive, remove_workdirs_of
from ckptbench.results.store import write_json_atomic
from ckptbench.train.parallel import RankInfo, init_process_group


def _exit_with_parent(parent_pid: int) -> None:
    """End this process when the process that launched it (the sweep, or a fanned-out job) is gone (it was
    killed): never hold the GPU orphaned. That process is not this one's parent when the point was forked
    from the fork server (processes/fresh.py), so it is asked for by its id."""

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if not alive(parent_pid):
                remove_workdirs_of(parent_pid)  # its folders (this point's among them): no cleanup ran in it
                os._exit(3)

    threading.Thread(target=watch, daemon=True, name="ckptbench-parent-watch").start()


def child_main(request_path: str) -> int:
    """Run the point of the request at ``request_path`` in this process and write its record.

    Launched as a rank of a sharded point (RANK, WORLD_SIZE... set), it joins the process group on
    its own GPU (cuda:LOCAL_RANK) or the CPU, measures its part of the point and writes its record
    to its own file; the launcher merges the ranks' records (processes/ranks.py).
    """
    request = PointRequest.load(request_path)
    _exit_with_parent(request.parent_pid)
    trace_path = request.allocator_trace
    if trace_path:  # before anything touches the GPU: the trace starts from an empty allocator
        start_recording()
    cfg = parse_config(request.config, source="isolated point config")
    rank = RankInfo.from_env()
    device = _device(cfg, rank)
    if rank is not None:
        init_process_group(rank, device)
    # The GPU this process runs on names the peak for MFU (a fanned-out job's may differ from the sweep's).
    gpu_name = placement(device).gpu_name or request.gpu_name
    # No place: this process measures the point itself (a sharded point's rank, its part of it).
    runner = Runner(cfg, device, make_probe(cfg, device), gpu_name=gpu_name)
    for done in request.done:  # an earlier run's records (--resume) come from disk: read as such
        if done.point is not None:
            runner.remember(done.point, done)
    point = Point.from_key(request.key)  # a grid point or a search probe
    assert request.ready is not None and request.result is not None  # the launcher names both (run_child)
    Path(request.ready).touch()  # from here on, --point-timeout applies
    try:
        # The parent already decided this point runs (OOM skips are its call), so never skip here.
        with intra_op_threads(device.type, cfg.cpu_threads):  # as a sweep in one process runs its points
            record = runner.run_point(point, allow_skip=False)
        if trace_path:
            fraction = getattr(runner.probe, "fraction", None)  # what the probe set (older torch cannot read it)
            write_trace(trace_path, extra={"key": point.key, "status": record.status, "fraction": fraction})
    finally:
        runner.close()
        if rank is not None:
            torch.distributed.destroy_process_group()
    write_json_atomic(result_path(request.result, rank.rank if rank else None), record.to_json())
    return 0


def _device(cfg: SweepConfig, rank: RankInfo | None) -> torch.device:
    """The point's device; a rank on GPUs takes the one of its local rank."""
    if rank is not None and cfg.device != "cpu" and torch.cuda.is_available():
        if rank.local_rank >= torch.cuda.device_count():
            raise RuntimeError(f"rank {rank.rank}: needs GPU {rank.local_rank}, {torch.cuda.device_count()} visible")
        torch.cuda.set_device(rank.local_rank)
    return resolve_device(cfg)


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1]))
