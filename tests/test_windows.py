"""Every way a sweep can end leaves status, summary and exit code in agreement: SIGTERM before the first
point, SIGINT right after the last one, SIGKILL at any time, two processes racing for one run directory,
a sweep where no point succeeds; and the fault hooks are test-only."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import weakref
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ckptbench.cli.main import app
from ckptbench.cli.runs import Interrupts
from ckptbench.measure import faults
from ckptbench.results.store import POINTS_FILE, RUN_FILE
from tests.conftest import MINI, copy_run, quiet_load

REPO = Path(__file__).resolve().parent.parent
ENV = {k: v for k, v in os.environ.items() if not k.startswith("CKPTBENCH_")}
ENV.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
POINT_DONE = (": peak", ": error", ": oom")


def _start(config: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "ckptbench", "sweep", str(config), *args],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV, cwd=config.parent,
    )


def _status(run: Path) -> str:
    return str(json.loads((run / RUN_FILE).read_text())["status"])


def _agree(run: Path, code: int, stderr: str, *, total: int = 4) -> None:
    """Status, summary and exit code tell one story, and stderr says it without a traceback."""
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr
    assert (run / "summary.md").exists()
    status = _status(run)
    assert (code, status) in ((130, "interrupted"), (143, "interrupted"), (0, "complete")), (code, status, stderr)
    if code in (130, 143):
        done = len(quiet_load(run).points)
        assert f"interrupted: {done} of {total} points are on disk" in stderr and f"--resume {run}" in stderr


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "mini.yaml"
    path.write_text(json.dumps(MINI))
    return path


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_sigterm_once_the_run_directory_exists_but_before_the_first_point(config: Path, sig: int) -> None:
    """SIGHUP (a closed terminal) as SIGTERM: exit 143, the run marked interrupted (it was 129, silent, and
    run.json said 'running'; issue 35)."""
    run = config.parent / "run"
    proc = _start(config, "--out", str(run))  # with predictions: a second or more before the first point
    while not (run / RUN_FILE).exists():
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.005)
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=120)
    _agree(run, proc.returncode, stderr)
    assert proc.returncode == 143 and "0 of 4 points are on disk" in stderr
    assert json.loads((run / RUN_FILE).read_text())["finished_points"] == 0
    if sig == signal.SIGHUP:
        return  # resuming it is the same for either signal
    resumed = CliRunner().invoke(app, ["sweep", str(config), "--resume", str(run), "--no-predict"])
    assert resumed.exit_code == 0, resumed.stderr
    assert _status(run) == "complete" and len(quiet_load(run).points) == 4


@pytest.mark.parametrize("delay_s", [0.0, 1.5])
def test_sigint_right_after_the_last_point(config: Path, delay_s: float) -> None:
    run = config.parent / "run"
    proc = _start(config, "--out", str(run), "--no-predict")
    assert proc.stderr is not None
    finished = 0
    for line in proc.stderr:
        finished += any(mark in line for mark in POINT_DONE)
        if finished == 4:
            break
    time.sleep(delay_s)  # 0: while the runner cleans up; 1.5 s: while summaries are written or at exit
    proc.send_signal(signal.SIGINT)
    _, rest = proc.communicate(timeout=120)
    _agree(run, proc.returncode, rest)
    assert len(quiet_load(run).points) == 4


def test_sigkill_leaves_a_run_that_reads_as_interrupted(config: Path) -> None:
    run = config.parent / "run"
    proc = _start(config, "--out", str(run), "--no-predict")
    assert proc.stderr is not None
    for line in proc.stderr:
        if any(mark in line for mark in POINT_DONE):
            break
    proc.kill()
    proc.wait(timeout=60)
    assert _status(run) == "running"  # what the killed writer left on disk
    loaded = quiet_load(run)
    assert loaded.meta.status == "interrupted"
    assert any("no ckptbench process holds the run: it was interrupted" in w for w in loaded.warnings)
    compared = CliRunner().invoke(app, ["compare", str(run), str(run)])
    assert compared.exit_code == 0 and "is interrupted" in compared.stderr, compared.stderr
    assert _status(run) == "running"  # readers never write
    resumed = CliRunner().invoke(app, ["sweep", str(config), "--resume", str(run), "--no-predict"])
    assert resumed.exit_code == 0 and _status(run) == "complete", resumed.stderr


def test_two_processes_racing_for_one_run_directory(config: Path) -> None:
    run = config.parent / "run"
    procs = [_start(config, "--out", str(run), "--no-predict") for _ in range(2)]
    results = sorted((p.wait(timeout=300), p.communicate()[1]) for p in procs)
    (won, _), (lost, why) = results
    assert (won, lost) == (0, 2), results
    assert len(why.strip().splitlines()) == 1, why
    assert "in use by another ckptbench process" in why or "already holds a run" in why, why
    lines = (run / POINTS_FILE).read_text().splitlines()
    assert _status(run) == "complete" and len(lines) == 4
    assert len({json.dumps(json.loads(line)["key"], sort_keys=True) for line in lines}) == 4


def test_an_interrupt_dropped_inside_a_finalizer_is_delivered_again(capfd: pytest.CaptureFixture[str]) -> None:
    class Thing:
        pass

    def finalizer() -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(100):
            time.sleep(0.01)  # the handler raises here, where Python can only drop the exception

    with Interrupts() as interrupts:
        thing = Thing()
        weakref.finalize(thing, finalizer)
        with pytest.raises(KeyboardInterrupt):
            del thing  # runs the finalizer, which drops the KeyboardInterrupt
            time.sleep(5)  # ... and the interrupt arrives again here, in ordinary code
        assert interrupts.fired
    assert "Exception ignored" not in capfd.readouterr().err


def test_a_signal_after_the_final_status_is_only_noted() -> None:
    with Interrupts() as interrupts:
        interrupts.finishing = True
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
        except KeyboardInterrupt:
            pytest.fail("a signal after the final status raised KeyboardInterrupt")
        assert interrupts.late and not interrupts.fired
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # a test's process gets it back


def test_a_sweep_where_no_point_succeeds_fails_saying_why(
    config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(faults.ENABLE_VAR, "1")
    monkeypatch.setenv("CKPTBENCH_TEST_ERROR", "precision=fp32")  # every point
    run = config.parent / "run"
    result = CliRunner().invoke(app, ["sweep", str(config), "--out", str(run), "--no-predict"])
    assert result.exit_code == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[0] == (f"warning: test hook CKPTBENCH_TEST_ERROR=precision=fp32 is active ({faults.ENABLE_VAR}=1):"
                        " points it selects fail on purpose")
    assert lines[-1].startswith(
        "error: no point succeeded (4 error); the first error: RuntimeError: injected failure (CKPTBENCH_TEST_ERROR)"
    ) and f"--resume {run}" in lines[-1], lines[-1]
    meta = json.loads((run / RUN_FILE).read_text())
    assert meta["status"] == "failed" and meta["failure"].startswith("no point succeeded (4 error)")
    assert meta["environment"]["test_hooks"] == {"CKPTBENCH_TEST_ERROR": "precision=fp32"}
    assert (run / "summary.md").exists() and "ckptbench: " in result.stdout  # the summary table is still shown
    monkeypatch.delenv("CKPTBENCH_TEST_ERROR")
    resumed = CliRunner().invoke(app, ["sweep", str(config), "--resume", str(run), "--no-predict"])
    assert resumed.exit_code == 0, resumed.stderr
    meta = json.loads((run / RUN_FILE).read_text())
    assert meta["status"] == "complete" and "failure" not in meta


def test_fault_hooks_are_off_without_the_test_only_switch(
    mini_run: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(faults.ENABLE_VAR, raising=False)
    monkeypatch.setenv("CKPTBENCH_TEST_ERROR", "precision=fp32")
    assert faults.active() == {} and faults.ignored() == ["CKPTBENCH_TEST_ERROR"]
    config, pristine = mini_run
    run = copy_run(pristine, tmp_path / "run")
    (run / POINTS_FILE).write_text("\n".join((run / POINTS_FILE).read_text().splitlines()[:3]) + "\n")
    result = CliRunner().invoke(app, ["sweep", str(config), "--resume", str(run), "--no-predict"])
    assert result.exit_code == 0, result.stderr
    assert result.stderr.splitlines()[0] == (
        f"warning: CKPTBENCH_TEST_ERROR is set but ignored: test hooks are off (they need {faults.ENABLE_VAR}=1)"
    )
    assert [p.status for p in quiet_load(run).points] == ["ok"] * 4  # the hook did nothing
    for value in ("0", "true", "yes", ""):  # only exactly '1' switches them on
        monkeypatch.setenv(faults.ENABLE_VAR, value)
        assert faults.active() == {}
    monkeypatch.setenv(faults.ENABLE_VAR, "1")
    assert faults.active() == {"CKPTBENCH_TEST_ERROR": "precision=fp32"} and faults.ignored() == []
