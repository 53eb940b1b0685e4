"""Failures inside a sweep: errors, fatal device errors, leaks; results integrity; resume bookkeeping."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from ckptbench.cli.main import app
from ckptbench.cli.runs import Interrupts
from ckptbench.config.grid import KEY_FILLS, key_id
from ckptbench.config.schema import SweepConfig
from ckptbench.errors import ConfigError, ResultsError
from ckptbench.measure import faults
from ckptbench.measure.device import is_fatal_device_error, make_probe, resolve_device
from ckptbench.measure.runner import Runner
from ckptbench.results.meta import RunEnvironment, RunMeta
from ckptbench.results.record import PointRecord, Scalar
from ckptbench.results.store import (
    POINTS_FILE,
    RUN_FILE,
    SCHEMA_VERSION,
    Run,
    RunWriter,
    create_run_dir,
    load_run,
    write_json_atomic,
)
from ckptbench.sweep.resume import check_resumable, done_records, first_difference
from ckptbench.sweep.sweep import run_sweep
from tests._known import known
from tests.conftest import tiny_config

AXES = {"layout": ["none", "all", "every:2"], "batch_size": [1], "seq_len": [64], "precision": ["fp32"]}



def small(**overrides: Any) -> SweepConfig:
    # two layers: enough for 'every:2', and every claim here holds at any size
    model = {"preset": "tiny", "overrides": {"num_hidden_layers": 2}}
    return tiny_config(**{"measured_steps": 1, "optimizer": "adamw_foreach", "sweep": AXES, "model": model,
                          **overrides})


def by_layout(records: list[PointRecord]) -> dict[Scalar, PointRecord]:
    return {r.key["layout"]: r for r in records}


# ---------------------------------------------------------------- leaks, errors, fatal errors


def test_leaking_point_is_flagged_and_the_next_point_starts_clean(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CKPTBENCH_ENABLE_TEST_HOOKS", "1")  # the hooks are test-only
    monkeypatch.setenv("CKPTBENCH_TEST_LEAK", "layout=all")
    cfg = small()
    device = resolve_device(cfg)
    runner = Runner(cfg, device, make_probe(cfg, device))
    recs = by_layout([runner.run_point(p) for p in cfg.points_list()])
    runner.close()
    none, leaky, after = recs["none"].memory, recs["all"].memory, recs["every:2"].memory
    assert [recs[k].status for k in ("none", "all", "every:2")] == ["ok", "ok", "ok"]
    assert (none.leaked, leaky.leaked, after.leaked) == (False, True, False)
    assert leaky.leaked_bytes == faults.LEAK_BYTES and recs["all"].model_rebuilt is True
    assert recs["every:2"].model_build_s is not None  # the model was rebuilt after the leak
    # Without the rebuild the leaked 4 MiB would still be attached to the model here.
    assert after.baseline_allocated_bytes == none.baseline_allocated_bytes
    for field in ("params_bytes", "grads_bytes", "optimizer_state_bytes", "window_start_allocated_bytes"):
        assert getattr(after, field) == getattr(none, field), field


def test_an_error_in_one_point_is_recorded_and_the_sweep_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CKPTBENCH_ENABLE_TEST_HOOKS", "1")  # the hooks are test-only
    monkeypatch.setenv("CKPTBENCH_TEST_ERROR", "layout=all")
    outcome = run_sweep(small(), out=tmp_path / "run", predict=False)
    recs = by_layout(outcome.records)
    assert [r.status for r in outcome.records] == ["ok", "error", "ok"]
    assert recs["all"].reason == "RuntimeError: injected failure (CKPTBENCH_TEST_ERROR)"
    assert known(recs["every:2"].loss_check).match is True
    assert load_run(tmp_path / "run").meta.status == "complete"


def test_a_fatal_device_error_stops_the_sweep_and_keeps_the_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CKPTBENCH_ENABLE_TEST_HOOKS", "1")  # the hooks are test-only
    monkeypatch.setenv("CKPTBENCH_TEST_CUDA_ERROR", "layout=all")
    (tmp_path / "c.yaml").write_text(json.dumps(small().model_dump(mode="json")))  # JSON is YAML
    args = ["sweep", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "run"), "--no-predict"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1, result.output
    line = result.stderr.strip().splitlines()[-1]
    assert "device-side assert triggered" in line and "stopped the sweep" in line and "--resume" in line
    run = load_run(tmp_path / "run")
    assert run.meta.status == "failed" and run.meta.finished_points == 2
    assert [(p.key["layout"], p.status, p.fatal) for p in run.points] == [
        ("none", "ok", False),
        ("all", "error", True),
    ]


@pytest.mark.parametrize(
    ("message", "fatal"),
    [
        ("CUDA error: an illegal memory access was encountered", True),
        ("CUDA error: device-side assert triggered", True),
        ("CUDA out of memory. Tried to allocate 2.00 GiB", False),
        ("CUDA error: out of memory", False),
        ("mat1 and mat2 shapes cannot be multiplied", False),
    ],
)
def test_fatal_device_errors_are_told_apart(message: str, fatal: bool) -> None:
    assert is_fatal_device_error(RuntimeError(message)) is fatal


def test_test_hooks_match_all_fields_of_the_key() -> None:
    key = {"layout": "layers:0,5", "batch_size": 2}
    assert faults.matches("layout=layers:0,5", key)
    assert faults.matches("layout=layers:0,5;batch_size=2", key)
    assert not faults.matches("layout=layers:0,5;batch_size=4", key)
    assert not faults.matches("", key) and not faults.matches(None, key)


# ---------------------------------------------------------------- results integrity


def _fake_run(path: Path, records: list[dict[str, Any]], **meta: Any) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path / RUN_FILE, {"schema_version": SCHEMA_VERSION, "status": "complete", **meta})
    lines = [json.dumps(r, sort_keys=True) + "\n" for r in records]
    (path / POINTS_FILE).write_text("".join(lines))
    return path


def _rec(layout: str, status: str = "ok", **extra: Any) -> dict[str, Any]:
    return {"key": {"layout": layout, "batch_size": 1}, "status": status, **extra}


def test_truncated_last_line_is_ignored_with_a_warning(tmp_path: Path) -> None:
    run_dir = _fake_run(tmp_path / "r", [_rec("none"), _rec("all")])
    with open(run_dir / POINTS_FILE, "a") as fh:
        fh.write('{"key": {"layout": "every:2", "batch')  # the process died mid-write
    with pytest.warns(UserWarning, match="truncated last line"):
        run = load_run(run_dir)
    assert [p.key["layout"] for p in run.points] == ["none", "all"]
    assert len(run.warnings) == 1 and "line 3" in run.warnings[0]


def test_a_corrupt_middle_line_is_skipped_with_its_line_number(tmp_path: Path) -> None:
    run_dir = _fake_run(tmp_path / "r", [_rec("none")])
    with open(run_dir / POINTS_FILE, "a") as fh:
        fh.write("garbage\n" + json.dumps(_rec("all", peak_allocated_bytes="lots")) + "\n")
        fh.write(json.dumps(_rec("every:2")) + "\n")
    with pytest.warns(UserWarning, match="line 2"):
        run = load_run(run_dir)
    assert [p.key["layout"] for p in run.points] == ["none", "every:2"]
    assert run.warnings == [
        f"{run_dir / POINTS_FILE}: ignored line 2 (not JSON)",
        f"{run_dir / POINTS_FILE}: ignored line 3 (not a valid point record: peak_allocated_bytes: "
        "Input should be a valid integer, unable to parse string as an integer)",
    ]


def test_resume_cuts_a_truncated_last_line_before_appending(tmp_path: Path) -> None:
    run_dir = _fake_run(tmp_path / "r", [_rec("none")])
    with open(run_dir / POINTS_FILE, "a") as fh:
        fh.write('{"key": {"lay')
    writer = RunWriter.reopen(run_dir)
    writer.append(PointRecord.model_validate(_rec("all")))
    writer.close()
    assert [p.key["layout"] for p in load_run(run_dir).points] == ["none", "all"]  # no warning now


@pytest.mark.parametrize(
    ("version", "word"), [(SCHEMA_VERSION + 1, "a newer"), (0, "an older"), ("x", "an older")]
)
def test_other_schema_versions_are_named(tmp_path: Path, version: Any, word: str) -> None:
    run_dir = _fake_run(tmp_path / "r", [], ckptbench_version="9.9.9")
    write_json_atomic(run_dir / RUN_FILE, {"schema_version": version, "ckptbench_version": "9.9.9"})
    with pytest.raises(ResultsError, match=f"written by {word} ckptbench .*use ckptbench 9.9.9"):
        load_run(run_dir)


def test_atomic_json_write_leaves_the_old_file_when_interrupted(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    write_json_atomic(path, {"status": "running"})

    class Boom:
        pass

    with pytest.raises(TypeError):
        write_json_atomic(path, {"status": Boom()})  # fails mid-serialisation
    assert json.loads(path.read_text()) == {"status": "running"}
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]  # no temporary file left behind


def test_concurrent_sweeps_never_share_a_run_directory(tmp_path: Path) -> None:
    made: list[Path] = []
    barrier = threading.Barrier(8)

    def make() -> None:
        barrier.wait()
        made.append(create_run_dir(tmp_path, "same", "20260101-000000"))

    threads = [threading.Thread(target=make) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 8 and len(set(made)) == 8
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in made)


def test_a_run_directory_in_use_cannot_be_written_by_a_second_sweep(tmp_path: Path) -> None:
    first = RunWriter(tmp_path, RunMeta(schema_version=1, name="a"))
    with pytest.raises(ResultsError, match="in use by another ckptbench process"):
        RunWriter.reopen(tmp_path)
    with pytest.raises(ResultsError, match="in use by another ckptbench process"):
        RunWriter(tmp_path, RunMeta(schema_version=1, name="b"))
    first.close()
    with pytest.raises(ResultsError, match="already holds a run"):
        RunWriter(tmp_path, RunMeta(schema_version=1, name="b"))
    assert json.loads((tmp_path / RUN_FILE).read_text())["name"] == "a"


def test_a_retried_point_supersedes_its_error_record(tmp_path: Path) -> None:
    run_dir = _fake_run(tmp_path / "r", [_rec("none"), _rec("all", "error"), _rec("every:2"), _rec("all")])
    assert [(p.key["layout"], p.status) for p in load_run(run_dir).points] == [
        ("none", "ok"),
        ("every:2", "ok"),
        ("all", "ok"),
    ]


# ---------------------------------------------------------------- resume bookkeeping


def test_done_records_count_ok_oom_skipped_but_not_errors(tmp_path: Path) -> None:
    def full(layout: str, status: str) -> dict[str, Any]:  # a key naming the point's fields (not the axes)
        return {"key": {"model": "tiny", "layout": layout, "batch_size": 1, "seq_len": 64, "precision": "fp32"},
                "status": status}

    records = [full("none", "ok"), full("all", "oom"), full("every:2", "skipped"), full("first:2", "error")]
    run = load_run(_fake_run(tmp_path / "r", records))
    base = {"model": "tiny", "batch_size": 1, "seq_len": 64, "precision": "fp32"}
    assert sorted(done_records(run)) == [  # keys are completed with the default of every axis
        key_id({**KEY_FILLS, **base, "layout": layout}) for layout in ("all", "every:2", "none")
    ]


def test_first_difference_names_the_path_and_ignores_the_name() -> None:
    old = {"name": "a", "sweep": {"batch_size": [1, 2]}, "seed": 0}
    assert first_difference(old, {**old, "name": "b"}) is None
    assert first_difference(old, {**old, "sweep": {"batch_size": [1, 4]}}) == (
        "sweep.batch_size",
        [1, 2],
        [1, 4],
    )
    missing = first_difference(old, {"name": "a", "sweep": {"batch_size": [1, 2]}})
    assert missing is not None and missing[0] == "seed"


def test_resume_refuses_another_config_or_machine(tmp_path: Path) -> None:
    cfg = small()
    env = {"device_type": "cpu", "gpu_name": None, "torch": torch.__version__, "transformers": "5"}
    run = load_run(_fake_run(tmp_path / "r", [], config=cfg.model_dump(mode="json"), environment=env))
    here = RunEnvironment.model_validate(env)
    check_resumable(small(name="renamed"), run, here)  # the name does not change any number
    with pytest.raises(ConfigError, match=r"no longer matches the run at measured_steps \(run: 1, now: 3\)"):
        check_resumable(small(measured_steps=3), run, here)
    with pytest.raises(ConfigError, match="measured with gpu_name None, this machine has 'H100'"):
        check_resumable(cfg, run, here.model_copy(update={"gpu_name": "H100"}))


def test_resume_runs_only_missing_and_failed_points(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CKPTBENCH_ENABLE_TEST_HOOKS", "1")  # the hooks are test-only
    monkeypatch.setenv("CKPTBENCH_TEST_ERROR", "layout=all")
    first = run_sweep(small(), out=tmp_path / "run", predict=False)
    assert [r.status for r in first.records] == ["ok", "error", "ok"]
    monkeypatch.delenv("CKPTBENCH_TEST_ERROR")
    again = run_sweep(small(), resume=tmp_path / "run", predict=False)
    assert [r.key["layout"] for r in again.records] == ["all"] and again.already_done == 2
    assert again.records[0].status == "ok" and known(again.records[0].loss_check).match is True
    run = load_run(tmp_path / "run")
    assert {p.key["layout"]: p.status for p in run.points} == {
        "none": "ok",
        "every:2": "ok",
        "all": "ok",
    }
    assert run.meta.status == "complete" and run.meta.finished_points == 3
    assert len(run.meta.resumes) == 1
    assert len((tmp_path / "run" / POINTS_FILE).read_text().splitlines()) == 4  # appended, nothing rewritten


def test_signals_raise_keyboard_interrupt_once_then_are_ignored() -> None:
    with Interrupts() as interrupts:
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler runs here at the latest
        os.kill(os.getpid(), signal.SIGINT)  # while the run is being marked: ignored
        time.sleep(0.05)
        assert interrupts.fired
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_resume_accepts_a_run_written_before_a_config_field_existed(tmp_path: Path) -> None:
    """A field added since the run was written takes its default; only a real change is refused."""
    cfg = tiny_config()
    stored = cfg.model_dump(mode="json")
    del stored["cpu_threads"]  # as a run written before the field existed stores it
    run = Run(path=tmp_path, meta=RunMeta(schema_version=1, config=stored), points=[])
    check_resumable(cfg, run, RunEnvironment())
    changed = {**stored, "seed": 7}
    with pytest.raises(ConfigError, match="at seed"):
        check_resumable(cfg, Run(path=tmp_path, meta=RunMeta(schema_version=1, config=changed), points=[]),
                        RunEnvironment())
