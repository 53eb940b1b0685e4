"""The function a fanned-out sweep submits through submitit: one point, run on the job's node.

Kept free of torch at import: the job only starts the point's processes (processes/launch.py), which
import torch themselves, and returns what they wrote.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from ckptbench.measure import faults
from ckptbench.processes.launch import run_child
from ckptbench.processes.outcome import JobResult
from ckptbench.processes.request import PointRequest
from ckptbench.processes.workdirs import remove_workdirs_of, workdir


def run_point_job(request: PointRequest, timeout_s: float | None, watch_pid: int | None = None) -> JobResult:
    """Run one point in fresh processes on this node (its GPUs are the job's); its record, or why
    it has none; either way with the submitit job id.

    ``watch_pid`` (local jobs: the sweep's process): when that process is gone (killed without a chance
    to cancel its jobs), this job ends, and with it the point's processes.
    """
    faults.fire_job(request.key)
    if watch_pid is not None:
        _end_with(watch_pid)
    job_id = _job_id()
    with workdir("job") as tmp:
        # The point's processes end themselves when this job's process is gone (processes/point_process.py).
        here = request.model_copy(update={"parent_pid": os.getpid()})
        return JobResult(run_child(here, workdir=Path(tmp), timeout_s=timeout_s), job_id)


def _job_id() -> str | None:
    try:
        import submitit

        return str(submitit.JobEnvironment().job_id)
    except RuntimeError:  # not inside a submitit job (submitit's debug executor runs jobs in-process)
        return None


def _end_with(pid: int) -> None:
    def watch() -> None:
        while True:
            time.sleep(1.0)
            try:
                os.kill(pid, 0)  # signal 0: only asks whether the process exists
            except ProcessLookupError:
                _end()
            except PermissionError:
                pass  # it exists (owned by someone else: not ours to judge)
            if _ended(pid):  # exited, not yet reaped by its parent (a zombie answers signal 0)
                _end()

    def _end() -> None:
        # The sweep's folders and this job's own go too; the point's processes follow: they watch this one.
        remove_workdirs_of(pid)
        remove_workdirs_of(os.getpid(), check_alive=False)
        os._exit(3)

    threading.Thread(target=watch, daemon=True, name="ckptbench-sweep-watch").start()


def _ended(pid: int) -> bool:
    """Whether ``pid`` has exited and waits only to be reaped (state Z in /proc; False where there is none)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[:1] == ["Z"]
