"""Real processes: Ctrl-C during a sweep, --resume, and --isolate with a crashing and a hanging point."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ckptbench.config.grid import key_id
from ckptbench.results.record import PointRecord
from ckptbench.results.store import load_run
from ckptbench.sweep.sweep import run_sweep
from tests._known import known
from tests.conftest import tiny_config

REPO = Path(__file__).resolve().parent.parent
AXES = {"layout": ["none", "all", "every:2"], "batch_size": [1], "seq_len": [64], "precision": ["fp32"]}
CONFIG = {"measured_steps": 1, "optimizer": "adamw_foreach", "sweep": AXES}
# One intra-op thread everywhere: fast on a busy 2-core machine, and the same losses in every process.
ENV = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "ckptbench", "sweep", *args]


def _summary(records: list[PointRecord]) -> dict[str, tuple[str, list[float]]]:
    return {
        key_id(r.key): (r.status, [*r.warmup_losses, *r.losses]) for r in records
    }


@pytest.mark.slow
def test_ctrl_c_keeps_finished_points_and_resume_completes_them(tmp_path: Path) -> None:
    config = tmp_path / "tiny.yaml"
    config.write_text(json.dumps(tiny_config(**CONFIG).model_dump(mode="json")))  # JSON is YAML
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        _cli(str(config), "--out", str(run_dir), "--no-predict"),  # predictions play no part in what is tested
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        env=ENV,
        text=True,
        cwd=tmp_path,
    )
    assert proc.stderr is not None
    for line in proc.stderr:  # the first finished point prints "  none b=1 s=64 fp32 optimizer=...: peak ..."
        if "b=1 s=64 fp32" in line and ": peak" in line:
            proc.send_signal(signal.SIGINT)
            break
    rest = proc.stderr.read()
    assert proc.wait(timeout=120) == 130, rest
    assert "interrupted:" in rest and f"--resume {run_dir}" in rest and "Traceback" not in rest
    interrupted = load_run(run_dir)
    assert interrupted.meta.status == "interrupted"
    assert 1 <= len(interrupted.points) < 3 and interrupted.meta.finished_points == len(interrupted.points)
    assert (run_dir / "summary.md").exists()

    t0 = time.monotonic()
    resumed = subprocess.run(
        _cli(str(config), "--resume", str(run_dir), "--no-predict"),
        capture_output=True,
        text=True,
        env=ENV,
        cwd=tmp_path,
        timeout=300,
    )
    resumed_wall = time.monotonic() - t0
    assert resumed.returncode == 0, resumed.stderr
    finished = load_run(run_dir)
    assert finished.meta.status == "complete" and len(finished.meta.resumes) == 1
    lines = (run_dir / "points.jsonl").read_text().splitlines()
    written = [json.loads(x) for x in lines[: len(interrupted.points)]]
    assert len(lines) == 3 and written == [p.to_json() for p in interrupted.points]
    _check_timing_accumulates(finished, before=len(interrupted.points), resumed_wall=resumed_wall,
                              stderr=resumed.stderr)

    reference = run_sweep(tiny_config(**CONFIG), out=tmp_path / "uninterrupted", predict=False)
    assert _summary(finished.points) == _summary(reference.records)  # same keys, statuses and losses


def _check_timing_accumulates(run: Any, *, before: int, resumed_wall: float, stderr: str) -> None:
    """run.json's timing covers both invocations, each from its process's start to its end."""
    assert run.meta.timing is not None
    timing = run.meta.timing.to_json()  # as run.json holds it
    first, second = timing["invocations"]
    assert [(e["status"], e["resumed"]) for e in (first, second)] == [("interrupted", False), ("complete", True)]
    for entry in (first, second):
        assert entry["startup_s"] > 0.2  # from the process's start: the interpreter and torch's import count
        parts = entry["startup_s"] + entry["environment_s"] + entry["points_s"] + entry["finish_s"]
        assert parts <= entry["command_wall_s"] + 1e-6
    assert second["command_wall_s"] <= resumed_wall + 0.05  # /proc's start time has 10 ms ticks
    steps = sum(sum(p.warmup_times_s) + sum(p.step_times_s) for p in run.points)
    assert timing["steps_s"] == pytest.approx(steps)
    assert timing["command_wall_s"] == pytest.approx(first["command_wall_s"] + second["command_wall_s"])
    # Before, sweep_wall_s counted the resumed part only and came out below the steps (0.83x).
    assert run.meta.sweep_wall_s == timing["points_s"] > steps
    assert "time: " in stderr and "x the steps)" in stderr
    summary = subprocess.run([sys.executable, "scripts/gpu_summary.py", str(run.path)], capture_output=True,
                             text=True, cwd=REPO, env=ENV, check=True).stdout
    assert f"2 invocations: interrupted ({before} points), complete ({3 - before} points)" in summary
    assert "start-up (interpreter, imports, config)" in summary


@pytest.mark.slow
def test_isolate_records_a_crashed_and_a_hung_point_and_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("CKPTBENCH_ENABLE_TEST_HOOKS", "1")  # the hooks are test-only
    monkeypatch.setenv("CKPTBENCH_TEST_CRASH", "layout=all")
    monkeypatch.setenv("CKPTBENCH_TEST_HANG", "layout=every:2")
    started = time.monotonic()
    # A two-layer model: the ok point takes well under a second after its process is ready (the timeout
    # starts then), so 5 s leaves room on a busy machine and the hung point costs 5 s, not 8.
    cfg = tiny_config(**CONFIG, model={"preset": "tiny", "overrides": {"num_hidden_layers": 2}})
    outcome = run_sweep(cfg, out=tmp_path / "run", isolate=True, point_timeout_s=5, predict=False)
    recs = {r.key["layout"]: r for r in outcome.records}
    assert [r.status for r in outcome.records] == ["ok", "error", "error"]
    assert known(recs["all"].reason).startswith("the point process was killed by SIGKILL; stderr: ")
    assert "CKPTBENCH_TEST_CRASH" in known(recs["all"].stderr_tail)
    assert known(recs["every:2"].reason).startswith("timed out after 5 s (--point-timeout) and was killed")
    assert "CKPTBENCH_TEST_HANG" in known(recs["every:2"].reason)
    assert recs["none"].isolated and known(recs["none"].loss_check).match is True
    run = load_run(tmp_path / "run")
    assert run.meta.status == "complete" and run.meta.options.to_json() == {
        "isolate": True,
        "point_timeout_s": 5,
    }
    assert [p.status for p in run.points] == ["ok", "error", "error"]
    assert time.monotonic() - started < 240


# --- issue 35: a Ctrl-C while a local job is submitted is acted on, never lost ----------------------------------


class _StartedJob:
    """What LocalPool.submit returns for a job: the executor's job object (only held here)."""

    job_id = "1"


def test_a_signal_while_a_local_job_starts_is_acted_on_once_it_has_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`sweep --executor local`: SIGINT was set to ignored around each submit, so a Ctrl-C then was dropped (the
    sweep ran to 'complete', exit 0). Now it is held and raised once the job has started; the job itself, started
    meanwhile, still never gets a terminal's Ctrl-C."""
    from ckptbench.processes.executors import LocalPool, Request
    from ckptbench.processes.request import PointRequest

    monkeypatch.setenv("CKPTBENCH_FORKSERVER", "0")  # no fork server to start for the job's points
    pool = LocalPool(tmp_path / "jobs", gpus=[], cpu_slots=1)
    started: list[subprocess.Popen[bytes]] = []
    seen_inside: list[bool] = []

    class Executor:
        def update_parameters(self, **_: Any) -> None:
            pass

        def submit(self, *_: Any) -> _StartedJob:
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C in the middle of the submit
            started.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1)"]))
            time.sleep(0.3)  # long enough for the signal to be handled, were it not held
            seen_inside.append(True)
            return _StartedJob()

    pool.executor = Executor()  # type: ignore[assignment]
    request = PointRequest(config={}, key={"layout": "none"}, parent_pid=os.getpid())
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            pool.submit(lambda: None, [Request(request)], None)  # type: ignore[arg-type, return-value]
    finally:
        signal.signal(signal.SIGINT, previous)
    assert seen_inside == [True] and len(started) == 1  # the submit ran to its end, then the interrupt came
    job = started[0]
    job.send_signal(signal.SIGINT)  # a terminal's Ctrl-C reaches the job too: it is not stopped by it
    assert job.wait(timeout=30) == 0
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, set())  # this process takes signals again


# --- issue 35: every command stopped by a signal says so in one line, with 130 or 143, and leaves no worker ------


@pytest.mark.parametrize(("sig", "code", "said"), [
    (signal.SIGINT, 130, "Ctrl-C (SIGINT)"), (signal.SIGTERM, 143, "SIGTERM"), (signal.SIGHUP, 143, "SIGHUP"),
], ids=["INT", "TERM", "HUP"])
def test_a_command_stopped_by_a_signal_says_so_in_one_line(
    monkeypatch: pytest.MonkeyPatch, sig: int, code: int, said: str
) -> None:
    from typer.testing import CliRunner

    from ckptbench.analysis import compare
    from ckptbench.cli.main import app

    def stopped_midway(*_: Any, **__: Any) -> None:
        os.kill(os.getpid(), sig)
        time.sleep(10)  # the signal ends the command here
        pytest.fail("the signal did not stop the command")

    monkeypatch.setattr(compare, "compare_refs", stopped_midway)
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    result = CliRunner().invoke(app, ["compare", "a", "b"])
    assert (result.exit_code, result.stderr) == (
        code, f"interrupted: ckptbench compare stopped by {said}; no file was left half-written\n")
    assert {s: signal.getsignal(s) for s in before} == before  # the handlers are the caller's again


def test_an_error_raised_while_a_stop_unwinds_the_command_is_the_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    """A signal raised in the middle of a library's own bookkeeping (torch's stack of dispatch modes, left half
    popped) made the unwinding fail ("trying to pop from empty mode stack"): a traceback and exit 1 for a SIGTERM.
    An error whose context is the stop is the stop: one line, 143."""
    from typer.testing import CliRunner

    from ckptbench.analysis import compare
    from ckptbench.cli.main import app

    def broken_by_the_stop(*_: Any, **__: Any) -> None:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(10)
        finally:
            raise RuntimeError("trying to pop from empty mode stack")

    monkeypatch.setattr(compare, "compare_refs", broken_by_the_stop)
    result = CliRunner().invoke(app, ["compare", "a", "b"])
    assert (result.exit_code, result.stderr) == (
        143, "interrupted: ckptbench compare stopped by SIGTERM; no file was left half-written\n")


_STOP_IN_A_WEAKREF_CALLBACK = """
import os, signal, time, weakref
from ckptbench.cli.common import CommandSignals, Stopped
class Thing:
    pass
def callback(_):
    os.kill(os.getpid(), signal.SIGTERM)
    for _ in range(10000):  # the handler runs here, inside the callback, where Python drops what it raises
        pass
said = "went on"
try:
    with CommandSignals():
        thing = Thing()
        ref = weakref.ref(thing, callback)
        del thing
        time.sleep(2)  # the signal comes again a moment later, in ordinary code
except Stopped as exc:
    said = f"stopped by {exc}"
print(said)
"""


def test_a_stop_signal_dropped_inside_a_weakref_callback_comes_again() -> None:
    """A SIGTERM handled while a fake storage's weak-reference callback ran raised ``Stopped`` where Python can only
    print and drop it: the estimate went on to its end, exit 0, with an "Exception ignored" traceback (CI, once). The
    command's unraisable hook sends the signal again, to land in ordinary code (as a sweep's did already)."""
    found = subprocess.run([sys.executable, "-c", _STOP_IN_A_WEAKREF_CALLBACK], capture_output=True, text=True,
                           cwd=REPO, env=ENV, timeout=60)
    assert (found.stdout, found.stderr) == ("stopped by SIGTERM\n", "")


_STOP_WHILE_TRACING = """
import os, signal
from ckptbench.cli.common import CommandSignals, Stopped
from ckptbench.estimator.workers import held_while_tracing
said = []
try:
    with CommandSignals():
        with held_while_tracing():
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(100000):  # without the hold, the handler raises here, in the middle of the trace
                pass
            said.append("the trace ended")
        said.append("went on")
except Stopped as exc:
    said.append(f"stopped by {exc}")
print("; ".join(said))
"""


def test_a_stop_signal_waits_for_the_trace_and_every_trace_job_holds_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Raised inside a trace, ``Stopped`` aborted the process (pybind11 terminate, -6) or left torch's dispatch
    modes broken (3 of 142 SIGTERMs to a cold estimate under load): a signal inside ``held_while_tracing`` is raised
    at its end; the Estimator runs each trace under it."""
    found = subprocess.run([sys.executable, "-c", _STOP_WHILE_TRACING], capture_output=True, text=True, cwd=REPO,
                           env=ENV, timeout=60)
    assert found.stdout == "the trace ended; stopped by SIGTERM\n", found.stderr

    from ckptbench.estimator import workers
    from ckptbench.estimator.estimator import Estimator

    seen = []
    original = Estimator._trace_short

    def noted(self: Estimator, point: Any) -> None:
        seen.append(workers.building())
        original(self, point)

    monkeypatch.setattr(Estimator, "_trace_short", noted)
    cfg = tiny_config(device="cuda", sweep={"layout": ["none"], "batch_size": [1], "seq_len": [32]})
    Estimator(cfg, cache=None).run_traces(cfg.points_list(), workers=1)
    assert seen == [True] and not workers.building()


_WORKER_OF_A_PARENT_THAT_ENDS = """
import os, sys, time
from ckptbench.estimator.workers import Background
def task():
    with open(sys.argv[1] + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(sys.argv[1] + ".tmp", sys.argv[1])
    time.sleep(60)
aside = Background(task, workers=2)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.01)
os._exit(0)  # ended without stopping it (as a command's process ends: no interpreter teardown)
"""


def test_a_forked_worker_ends_with_the_process_that_forked_it(tmp_path: Path) -> None:
    """A worker blocked sending a result larger than a pipe's buffer outlived a command that ended without stopping
    it, and held the command's stderr open: a caller reading it to its end waited with no end (CI, once). A forked
    worker asks the kernel to kill it when its parent ends."""
    pid_file = tmp_path / "worker.pid"
    subprocess.run([sys.executable, "-c", _WORKER_OF_A_PARENT_THAT_ENDS, str(pid_file)], cwd=REPO, env=ENV,
                   timeout=60, check=True)
    worker = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while _running(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(worker)


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(x) for x in text.split()]


@pytest.mark.slow
def test_sigterm_stops_an_estimate_and_its_workers_at_once(tmp_path: Path) -> None:
    """It exited 143 silently and its workers ran on for seconds, printing BrokenPipeError tracebacks."""
    config = tmp_path / "grid.yaml"
    config.write_text(json.dumps(tiny_config(sweep={"layout": ["none", "all"], "batch_size": [1, 2, 3, 4],
                                                    "seq_len": [64, 128, 256], "precision": ["fp32", "bf16"]},
                                             model={"preset": "tiny", "overrides": {"num_hidden_layers": 4}},
                                             ).model_dump(mode="json")))
    proc = subprocess.Popen([sys.executable, "-m", "ckptbench", "estimate", str(config), "--workers", "2"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**ENV, "CKPTBENCH_WORKERS": "2"})
    deadline = time.monotonic() + 120
    while len(workers := _children(proc.pid)) < 1:  # a forked process is at work (a trace's, then the pool's)
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert (proc.returncode, stderr) == (143, "interrupted: ckptbench estimate stopped by SIGTERM; no file was "
                                              "left half-written\n")
    time.sleep(0.2)
    assert [pid for pid in workers if Path(f"/proc/{pid}").exists()
            and Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z"] == []


_SIGNAL_WHILE_WORKERS_ARE_FORKED = """
import multiprocessing, multiprocessing.context, os, signal, time
from ckptbench.cli.common import CommandSignals, Stopped
from ckptbench.estimator.workers import map_pieces, share_pieces
real = multiprocessing.context.ForkProcess.start
def start(self):
    real(self)  # forked, not yet kept to be stopped
    os.kill(os.getpid(), signal.SIGTERM)
multiprocessing.context.ForkProcess.start = start
try:
    with CommandSignals():
        for _ in {pieces}:
            pass
except Stopped:
    print("stopped", len(multiprocessing.active_children()), flush=True)
"""


@pytest.mark.parametrize("pieces", [
    "map_pieces(lambda i: time.sleep(5), 4, workers=3)",
    "share_pieces(lambda q, i: time.sleep(5), [2, 2], here=(1, 0), there=(0, 1), workers=3)",
])
def test_a_stop_signal_while_workers_are_forked_stops_every_one(pieces: str) -> None:
    """A SIGTERM while an estimate's workers are forked (after the first started, before the second) is held until
    they are all kept, then stops the command: every worker is stopped at once, none is left. Raised where it came
    (inside multiprocessing.Pool's constructor, when the workers were a pool), it left the workers running, and a pool
    thread that forked new ones as fast as they were stopped, which the exit waited on with no end (seen once in CI);
    a pool stopped right after it was built once waited with no end to be terminated (in CI)."""
    done = subprocess.run([sys.executable, "-c", _SIGNAL_WHILE_WORKERS_ARE_FORKED.format(pieces=pieces)],
                          capture_output=True, text=True, env=ENV, timeout=60)
    assert done.stdout == "stopped 0\n", (done.stdout, done.stderr)


def test_an_error_found_after_the_progress_bar_started_is_the_only_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """It followed an empty bar line ('estimate 0/? 0:00:00' and a blank line off a terminal)."""
    from typer.testing import CliRunner

    from ckptbench.cli.main import app
    from ckptbench.errors import ConfigError
    from ckptbench.estimator import estimator
    from ckptbench.estimator.record import EstimateProgress

    def fails_after_starting(*_: Any, on_progress: Any = None, **__: Any) -> None:
        on_progress(EstimateProgress(done=0, total=4, label="none b=1 s=64"))
        raise ConfigError("sweep: found wrong half-way")

    monkeypatch.setattr(estimator, "estimate_config", fails_after_starting)
    result = CliRunner().invoke(app, ["estimate", str(REPO / "configs" / "tiny.yaml")])
    assert (result.exit_code, result.stderr) == (2, "error: sweep: found wrong half-way\n")
