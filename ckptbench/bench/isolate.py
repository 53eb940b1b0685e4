"""Run each point in a fresh process (``--isolate``): a crash, a CUDA error or a hang fails one point only.

The parent keeps the sweep's bookkeeping (skips after OOM, loss references) and never builds a
model. Each point runs in ``python -m ckptbench.bench.point_process REQUEST.json``, which rebuilds the same
config, re-expands the grid, picks the point by its key and writes its record to a JSON file.
The parent records a process that dies, exits without a record or outlives ``--point-timeout``
as a failed point (``status: error``) with the tail of its stderr.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ckptbench
from ckptbench.bench.device import make_probe, resolve_device
from ckptbench.bench.runner import Runner
from ckptbench.config.grid import Point
from ckptbench.config.layouts import LayoutPlan
from ckptbench.config.load import parse_config
from ckptbench.results.record import PointRecord
from ckptbench.results.store import write_json_atomic

# Allowance for a point process to start (imports, CUDA context) before --point-timeout applies.
START_TIMEOUT_S = 300.0
STDERR_TAIL_CHARS = 4000
_POLL_S = 0.1


@dataclass
class IsolatedRunner(Runner):
    """A Runner whose points each run in a child process; the parent holds no model."""

    point_timeout_s: float | None = None
    _history: list[dict[str, Any]] = field(default_factory=list)

    def remember(self, point: Point, record: PointRecord) -> None:
        super().remember(point, record)
        if record.status in ("ok", "oom"):
            self._history.append(record.to_json())  # sent to later children: loss references and OOM skips

    def _measure_safely(self, point: Point, plan: LayoutPlan, base: dict[str, Any]) -> dict[str, Any]:
        request = {
            "config": self.cfg.model_dump(mode="json"),
            "key": point.key,
            "gpu_name": self.gpu_name,
            "done": self._history,
            "parent_pid": os.getpid(),
        }
        with tempfile.TemporaryDirectory(prefix="ckptbench-point-") as tmp:
            record = run_child(request, workdir=Path(tmp), timeout_s=self.point_timeout_s)
        if record is None or "key" not in record:
            record = {**base, **(record or {}), "status": "error"}
        record.pop("fatal", None)  # the next point gets a fresh process and CUDA context
        for name in ("warnings", "load_average_1m"):  # the parent judges the host as the point ends
            record.pop(name, None)
        record["isolated"] = True
        return record


def run_child(request: dict[str, Any], *, workdir: Path, timeout_s: float | None) -> dict[str, Any] | None:
    """Run one point in a child process; its record, or {'reason', 'stderr_tail'} when it failed."""
    paths = {name: workdir / name for name in ("request.json", "result.json", "ready", "stderr.txt")}
    files = {"result": str(paths["result.json"]), "ready": str(paths["ready"])}
    write_json_atomic(paths["request.json"], {**request, **files})
    env = dict(os.environ)
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


# ---------------------------------------------------------------- the child side


def _exit_with_parent(parent_pid: int) -> None:
    """End this process when the parent sweep is gone (it was killed): never hold the GPU orphaned."""

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent_pid:
                os._exit(3)

    threading.Thread(target=watch, daemon=True, name="ckptbench-parent-watch").start()


def child_main(request_path: str) -> int:
    """Entry point of ``python -m ckptbench.bench.point_process``: run one point, write its record."""
    request = json.loads(Path(request_path).read_text(encoding="utf-8"))
    _exit_with_parent(int(request["parent_pid"]))
    cfg = parse_config(request["config"], source="isolated point config")
    device = resolve_device(cfg)
    runner = Runner(cfg, device, make_probe(cfg, device), gpu_name=request.get("gpu_name"))
    for done in request["done"]:
        record = PointRecord.model_validate(done)
        runner.remember(Point.from_key(record.key), record)
    point = Point.from_key(request["key"])  # a grid point or a search probe
    Path(request["ready"]).touch()  # from here on, --point-timeout applies
    try:
        # The parent already decided this point runs (OOM skips are its call), so never skip here.
        record = runner.run_point(point, allow_skip=False)
    finally:
        runner.close()
    write_json_atomic(Path(request["result"]), record.to_json())
    return 0
