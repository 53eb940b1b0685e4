"""Point processes forked from the fork server (processes/fresh.py, processes/forkserver.py): each a new process
in its own session, with the launcher's environment at launch, reaped by a server that is started once and
again when it is gone, that also forks the points of a local job; and the plain ``python -m`` start when asked
for."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ckptbench.config.load import parse_config
from ckptbench.processes import fresh
from ckptbench.processes.launch import point_request, run_child
from ckptbench.results.record import PointRecord
from tests.conftest import MINI

REPO = Path(__file__).resolve().parent.parent
CFG = parse_config({**MINI, "sweep": {**MINI["sweep"], "layout": ["none"], "batch_size": [1]}})
(POINT,) = CFG.points_list()
HANG = {"CKPTBENCH_ENABLE_TEST_HOOKS": "1", "CKPTBENCH_TEST_HANG": "layout=none"}


def _request(tmp_path: Path) -> Path:
    path = tmp_path / "request.json"
    request = point_request(CFG, POINT, gpu_name=None, known=[])
    request.model_copy(update={"result": str(tmp_path / "result.json"), "ready": str(tmp_path / "ready")}).write(path)
    return path


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[1])


def _wait_for(what: Any, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not what():
        assert time.monotonic() < deadline, "gave up waiting"
        time.sleep(0.05)


def _server() -> Any:
    """This process's fork server, started if need be."""
    assert fresh.shared_address(dict(os.environ)) is not None
    server = fresh._servers[os.getpid()]
    assert server.link is not None and not server.link.gone
    return server


def test_a_forked_point_is_a_new_process_in_its_own_session_with_the_launchers_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(fresh.FORKSERVER_ENV, raising=False)
    server = _server()
    for name, value in HANG.items():  # set after the server started: only the environment at launch has them
        monkeypatch.setenv(name, value)
    stderr = tmp_path / "stderr.txt"
    child = fresh.start(_request(tmp_path), env=dict(os.environ), stderr_path=stderr)
    try:
        _wait_for(lambda: (stderr.exists() and "CKPTBENCH_TEST_HANG" in stderr.read_text()) or child.poll() is not None)
        assert "CKPTBENCH_TEST_HANG" in stderr.read_text()  # the hook fired: the point hangs
        assert isinstance(child, fresh._Forked) and child.pid not in (os.getpid(), server.proc.pid)
        assert _parent(child.pid) == server.proc.pid  # forked by the server, not started from scratch
        assert os.getsid(child.pid) == child.pid != os.getsid(0)  # its own session: a terminal's Ctrl-C misses it
        assert child.poll() is None and child.returncode is None
    finally:
        os.kill(child.pid, signal.SIGKILL)
    assert child.wait() == -signal.SIGKILL and child.poll() == -signal.SIGKILL  # the server reaped it and told


def test_the_server_is_started_once_and_again_when_it_is_gone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(fresh.FORKSERVER_ENV, raising=False)
    for name in "abc":
        (tmp_path / name).mkdir()
    first = run_child(point_request(CFG, POINT, gpu_name=None, known=[]), workdir=tmp_path / "a", timeout_s=None)
    server = fresh._servers[os.getpid()]
    second = run_child(point_request(CFG, POINT, gpu_name=None, known=[]), workdir=tmp_path / "b", timeout_s=None)
    assert fresh._servers[os.getpid()] is server and server.proc.poll() is None
    assert isinstance(first, PointRecord) and isinstance(second, PointRecord)
    assert first.status == second.status == "ok"
    assert first.peak_allocated_bytes == second.peak_allocated_bytes and first.losses == second.losses
    link = server.link
    assert link is not None  # the server started
    assert list(link.exit_codes.values())[-2:] == [0, 0]  # both reaped by the server, exit status 0

    server.proc.kill()
    _wait_for(lambda: link.gone)
    third = run_child(point_request(CFG, POINT, gpu_name=None, known=[]), workdir=tmp_path / "c", timeout_s=None)
    assert fresh._servers[os.getpid()] is not server and isinstance(third, PointRecord)
    assert (third.status, third.peak_allocated_bytes) == ("ok", first.peak_allocated_bytes)


# A local job (processes/job.py) in miniature: a process without torch that starts a point through the address
# of its sweep's server, and reports the point's parent, whether it imported torch itself, and the exit status.
JOB = """
import os, signal, sys, time
from pathlib import Path
from ckptbench.processes import fresh
child = fresh.start(Path(sys.argv[1]), env=dict(os.environ), stderr_path=Path(sys.argv[2]), via=sys.argv[3])
while "CKPTBENCH_TEST_HANG" not in (Path(sys.argv[2]).read_text() if Path(sys.argv[2]).exists() else ""):
    assert child.poll() is None
    time.sleep(0.05)
parent = Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[-1].split()[1]
os.kill(child.pid, signal.SIGKILL)
print(parent, "torch" in sys.modules, child.wait(), sorted(fresh._servers))
"""


def test_a_local_jobs_point_is_forked_by_its_sweeps_server(tmp_path: Path) -> None:
    server = _server()
    job = subprocess.run([sys.executable, "-c", JOB, str(_request(tmp_path)), str(tmp_path / "stderr.txt"),
                          server.link.address],
                         env={**os.environ, **HANG, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                         timeout=300)
    assert job.returncode == 0, job.stderr
    assert job.stdout.split() == [str(server.proc.pid), "False", str(-signal.SIGKILL), "[]"]


def test_without_the_server_a_point_starts_from_scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(fresh.FORKSERVER_ENV, "0")
    child = fresh.start(_request(tmp_path), env=dict(os.environ), stderr_path=tmp_path / "stderr.txt")
    assert isinstance(child, subprocess.Popen) and child.wait(timeout=300) == 0, (tmp_path / "stderr.txt").read_text()
    assert (tmp_path / "result.json").exists()


class _FakeCuda:
    """torch.cuda as the fork server's probe sees it: NVML's device count, and an init that may fail."""

    def __init__(self, count: int, *, init_fails: bool) -> None:
        self.count, self.init_fails, self.inits = count, init_fails, 0

    def _device_count_nvml(self) -> int:
        return self.count

    def init(self) -> None:
        self.inits += 1
        if self.init_fails:
            raise RuntimeError("CUDA call failed lazily at initialization (a poisoned fork)")


@pytest.mark.parametrize(("count", "init_fails", "serves"), [(0, True, True), (-1, True, True), (2, False, True),
                                                              (2, True, False)])
def test_the_server_serves_only_where_its_forks_can_initialise_cuda(count: int, init_fails: bool,
                                                                    serves: bool) -> None:
    """With GPUs seen by NVML, a probe fork must initialise CUDA, or points start from scratch (an import that
    called the CUDA runtime in the server would leave every forked point unable to)."""
    from types import SimpleNamespace

    from ckptbench.processes.forkserver import _forks_can_use_cuda

    cuda = _FakeCuda(count, init_fails=init_fails)
    assert _forks_can_use_cuda(SimpleNamespace(cuda=cuda)) is serves
    assert cuda.inits == 0  # the probe initialised CUDA in its fork, never in the server
