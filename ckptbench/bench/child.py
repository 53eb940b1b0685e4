"""Run one point in a child process and collect its record (used by --isolate, by search boundaries and by
points with their own allocator settings). The child is ``python -m ckptbench.bench.point_process``.

A child that dies, exits without a record or outlives its timeout becomes a failed point
(``status: error``) with the tail of its stderr.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import ckptbench
from ckptbench.results.store import write_json_atomic

# Allowance for a point process to start (imports, CUDA context) before --point-timeout applies.
START_TIMEOUT_S = 300.0
STDERR_TAIL_CHARS = 4000
_POLL_S = 0.1
ALLOC_CONF_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


def run_child(
    request: dict[str, Any], *, workdir: Path, timeout_s: float | None, alloc_conf: str | None = None
) -> dict[str, Any] | None:
    """Run one point in a child process; its record, or {'reason', 'stderr_tail'} when it failed.

    ``alloc_conf`` sets the caching allocator's options in the child: torch reads them once, when CUDA
    starts, so they can only be set for a new process (torch 2.9+ reads PYTORCH_ALLOC_CONF first, older
    ones PYTORCH_CUDA_ALLOC_CONF: both are set).
    """
    paths = {name: workdir / name for name in ("request.json", "result.json", "ready", "stderr.txt")}
    files = {"result": str(paths["result.json"]), "ready": str(paths["ready"])}
    write_json_atomic(paths["request.json"], {**request, **files})
    env = dict(os.environ)
    if alloc_conf:
        env.update(dict.fromkeys(ALLOC_CONF_VARS, alloc_conf))
    package_root = str(Path(ckptbench.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    with open(paths["stderr.txt"], "wb") as err:
        # A new session: a terminal's Ctrl-C reaches the parent only, which then ends the child.
        proc = subprocess.Popen(
            [sys.executable, "-m", "ckptbench.bench.point_process", str(paths["request.json"])],
            stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=env, start_new_session=True,
        )
        try:
            problem = _wait(proc, ready=paths["ready"], timeout_s=timeout_s)
        finally:
            _kill(proc)
    if paths["result.json"].exists():  # written atomically: complete whenever it exists
        return json.loads(paths["result.json"].read_text(encoding="utf-8"))
    tail = _tail(paths["stderr.txt"])
    what = problem or _exit_text(proc.returncode)
    last = " | ".join(line.strip() for line in tail.splitlines()[-3:] if line.strip())
    reason = f"{what}; stderr: {last[-300:]}" if last else f"{what}; no stderr output"
    return {"reason": reason, "stderr_tail": tail, "exit_code": proc.returncode}


def _wait(proc: subprocess.Popen[bytes], *, ready: Path, timeout_s: float | None) -> str | None:
    """Wait for the child; a text saying why it was stopped, or None when it exited by itself."""
    start_deadline = time.monotonic() + START_TIMEOUT_S
    deadline: float | None = None
    while True:
        try:
            proc.wait(timeout=_POLL_S)
            return None
        except subprocess.TimeoutExpired:
            pass
        now = time.monotonic()
        if deadline is None and ready.exists():
            deadline = now + timeout_s if timeout_s is not None else float("inf")
        if deadline is None and now > start_deadline:
            return f"the point process did not start within {START_TIMEOUT_S:g} s and was killed"
        if deadline is not None and now > deadline:
            return f"timed out after {timeout_s:g} s (--point-timeout) and was killed"


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: also ends anything it started
    proc.wait()


def _exit_text(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"the point process was killed by {name}"
    if code == 0:
        return "the point process exited without writing a result"
    return f"the point process exited with code {code}"


def _tail(path: Path) -> str:
    try:
        data = path.read_bytes()[-STDERR_TAIL_CHARS:]
    except OSError:
        return ""
    return data.decode("utf-8", errors="replace").strip()
