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
from ckptbench.results.store import load_run
from ckptbench.sweep.sweep import run_sweep
from tests.conftest import tiny_config

REPO = Path(__file__).resolve().parent.parent
AXES = {"layout": ["none", "all", "every:2"], "batch_size": [1], "seq_len": [64], "precision": ["fp32"]}
CONFIG = {"measured_steps": 1, "optimizer": "adamw_foreach", "sweep": AXES}
# One intra-op thread everywhere: fast on a busy 2-core machine, and the same losses in every process.
ENV = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "ckptbench", "sweep", *args]


def _summary(records: list[dict[str, Any]]) -> dict[str, tuple[str, list[float]]]:
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
    assert recs["all"].reason.startswith("the point process was killed by SIGKILL; stderr: ")
    assert "CKPTBENCH_TEST_CRASH" in recs["all"].stderr_tail
    assert recs["every:2"].reason.startswith("timed out after 5 s (--point-timeout) and was killed")
    assert "CKPTBENCH_TEST_HANG" in recs["every:2"].reason
    assert recs["none"].isolated and recs["none"].loss_check.match is True
    run = load_run(tmp_path / "run")
    assert run.meta.status == "complete" and run.meta.options.to_json() == {
        "isolate": True,
        "point_timeout_s": 5,
    }
    assert [p.status for p in run.points] == ["ok", "error", "error"]
    assert time.monotonic() - started < 240
