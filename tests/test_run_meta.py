"""run.json typed (results/meta.py): every run written before reads and writes back as it was; a newer run's
fields are kept and named; a damaged fact of the environment costs only itself; the command's timing adds up."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest

from ckptbench.results.meta import SUMMED, RunEnvironment, RunMeta, RunTiming, TimingEntry, checked_meta
from ckptbench.results.store import RUN_FILE, load_run
from ckptbench.sweep.timing import accumulate

REPO = Path(__file__).resolve().parent.parent
# Every run committed under results/ and tests/fixtures, written by earlier versions of ckptbench.
RUNS = sorted(p.parent for root in ("results", "tests/fixtures") for p in (REPO / root).glob(f"**/{RUN_FILE}"))


def _load(run_dir: Path) -> tuple[RunMeta, list[str]]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = load_run(run_dir)
    return run.meta, run.warnings


def test_there_are_runs_to_check() -> None:
    assert len(RUNS) >= 20


@pytest.mark.parametrize("run_dir", RUNS, ids=lambda p: str(p.relative_to(REPO)))
def test_a_committed_run_json_reads_and_writes_back_as_it_was(run_dir: Path) -> None:
    written = json.loads((run_dir / RUN_FILE).read_text(encoding="utf-8"))
    meta, notes = _load(run_dir)
    assert not [n for n in notes if RUN_FILE in n]  # nothing of run.json dropped or unknown
    assert meta.unknown_fields() == [] and meta.environment.unknown_fields() == []
    assert json.dumps(meta.to_json(), sort_keys=True) == json.dumps(written, sort_keys=True)
    # The typed environment says what the dict said.
    env = written.get("environment", {})
    assert (meta.environment.gpu_name, meta.environment.device_type) == (env.get("gpu_name"), env.get("device_type"))
    assert meta.environment.torch == env.get("torch") and meta.status == written.get("status")


def _write(run_dir: Path, **changes: object) -> Path:
    shutil.copytree(REPO / "tests/fixtures/runs/base", run_dir)
    meta = json.loads((run_dir / RUN_FILE).read_text(encoding="utf-8"))
    for name, value in changes.items():
        meta[name] = value
    (run_dir / RUN_FILE).write_text(json.dumps(meta), encoding="utf-8")
    return run_dir


def test_a_newer_runs_fields_are_kept_as_they_are_and_named(tmp_path: Path) -> None:
    base = json.loads((REPO / "tests/fixtures/runs/base" / RUN_FILE).read_text(encoding="utf-8"))
    env = {**base["environment"], "nvlink": {"links": 18}}
    meta, notes = _load(_write(tmp_path / "r", environment=env, zz_new=[1, 2]))
    assert notes == []
    assert meta.unknown_fields() == ["zz_new"] and meta.environment.unknown_fields() == ["nvlink"]
    assert meta.to_json()["zz_new"] == [1, 2] and meta.to_json()["environment"]["nvlink"] == {"links": 18}


def test_a_damaged_fact_of_the_environment_is_dropped_alone(tmp_path: Path) -> None:
    base = json.loads((REPO / "tests/fixtures/runs/base" / RUN_FILE).read_text(encoding="utf-8"))
    env = {**base["environment"], "gpu_name": 5, "cpu_count": "many"}
    run_dir = _write(tmp_path / "r", environment=env)
    meta, notes = _load(run_dir)
    assert sorted(n.split(": ", 1)[1].split(" (")[0] for n in notes) == [
        "ignored field 'environment.cpu_count'", "ignored field 'environment.gpu_name'"
    ]
    assert meta.environment.gpu_name is None and meta.environment.cpu_count is None
    assert meta.environment.torch == base["environment"]["torch"]  # the rest of the environment stays


def test_fields_only_another_part_knows_are_kept_and_the_missing_ones_are_none() -> None:
    """run.json's fields are attributes; what only tune knows stays in the stored JSON, and what run.json does not
    hold reads as None."""
    meta, _ = checked_meta({"schema_version": 1, "environment": {"gpu_name": "NVIDIA H200"},
                            "searches": [{"kind": "tune", "answer": {"label": "all b=4", "tokens_per_s": 7.0}}]},
                           source="run.json")
    assert meta.environment.gpu_name == "NVIDIA H200"
    assert meta.searches[0].to_json()["answer"]["label"] == "all b=4"
    assert meta.status is None and meta.environment.torch is None


def _entry(id: str, status: str, **parts: float | None) -> TimingEntry:
    return TimingEntry.model_validate({"id": id, "status": status, "points": 1, **parts})


def test_each_invocation_adds_its_entry_and_the_totals_are_summed() -> None:
    first = accumulate(None, _entry("a", "interrupted", steps_s=2.0, startup_s=1.0), earlier_points=0)
    assert [e.id for e in first.invocations] == ["a"] and first.steps_s == 2.0 and first.finish_s == 0.0
    assert set(first.to_json()) == {*SUMMED, "invocations"}  # every sum, none of the untimed points
    second = accumulate(first, _entry("b", "complete", steps_s=3.0, startup_s=None), earlier_points=0)
    assert [e.id for e in second.invocations] == ["a", "b"]
    assert (second.steps_s, second.startup_s) == (5.0, 1.0)
    # The same invocation, finished by the CLI: its entry is completed, not added.
    done = accumulate(second, second.invocations[-1].updated(command_wall_s=4.0), earlier_points=0)
    assert [e.id for e in done.invocations] == ["a", "b"] and done.command_wall_s == 4.0
    assert done.invocations[-1].to_json() == {"id": "b", "status": "complete", "points": 1, "steps_s": 3.0,
                                              "startup_s": None, "command_wall_s": 4.0}


def test_points_of_a_run_written_before_timing_existed_are_said_untimed() -> None:
    resumed = accumulate(None, _entry("a", "complete"), earlier_points=3)
    assert resumed.untimed_earlier_points == 3
    again = accumulate(RunTiming.model_validate(resumed.to_json()), _entry("b", "complete"), earlier_points=0)
    assert again.untimed_earlier_points == 3
    assert accumulate(None, _entry("a", "complete"), earlier_points=0).untimed_earlier_points is None


def test_the_environment_is_written_with_every_fact_it_was_given() -> None:
    env = RunEnvironment(gpu_name=None, device_type="cpu")
    assert env.to_json() == {"gpu_name": None, "device_type": "cpu"}  # null where given, nothing else
    assert env.model_copy(update={"probe": "cpu-tracker"}).to_json()["probe"] == "cpu-tracker"
