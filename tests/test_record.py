"""The point record is strict when ckptbench writes one and lenient when it reads one back from disk."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from ckptbench.config.grid import KEY_FILLS
from ckptbench.processes.launch import PARENT_FIELDS
from ckptbench.results.record import PREDICTION_FIELDS, PointMemory, PointRecord, PredictedOom, Prediction, Scalar
from ckptbench.results.store import POINTS_FILE, load_run
from tests._known import known

REPO = Path(__file__).resolve().parent.parent
# The H200 runs committed under results/, written by earlier versions of ckptbench.
COMMITTED_RUNS = sorted(p.parent for p in (REPO / "results").glob(f"*/*/{POINTS_FILE}"))
KEY: dict[str, Scalar] = {"model": "tiny", "layout": "all", "batch_size": 2, "seq_len": 64, "precision": "fp32"}


def _errors(data: dict[str, Any]) -> list[tuple[tuple[Any, ...], str]]:
    with pytest.raises(ValidationError) as caught:
        PointRecord.model_validate(data)
    return [(tuple(e["loc"]), e["type"]) for e in caught.value.errors()]


def test_a_misspelled_field_is_an_error_when_writing() -> None:
    assert _errors({"key": KEY, "status": "ok", "peak_alocated_bytes": 123}) == [
        (("peak_alocated_bytes",), "extra_forbidden")
    ]
    with pytest.raises(ValidationError, match="peak_alocated_bytes"):
        PointRecord(key=KEY, status="ok", peak_alocated_bytes=123)  # type: ignore[call-arg]


def test_a_misspelled_field_of_a_nested_record_is_an_error_where_it_is() -> None:
    assert _errors({"key": KEY, "status": "ok", "memory": {"leakd": True}}) == [
        (("memory", "leakd"), "extra_forbidden")
    ]
    assert _errors({"key": KEY, "status": "ok", "loss_check": {"mach": False}}) == [
        (("loss_check", "mach"), "extra_forbidden")
    ]
    ranks = [{"rank": 0, "status": "ok"}, {"rank": 1, "status": "ok", "hots": "n1"}]
    assert _errors({"key": KEY, "status": "ok", "ranks": ranks}) == [(("ranks", 1, "hots"), "extra_forbidden")]


def test_reading_keeps_unknown_fields_and_names_them() -> None:
    data = {"key": KEY, "status": "ok", "peak_allocated_bytes": 7, "new_field": [1, 2],
            "memory": {"params_bytes": 3, "new_part": 4}, "ranks": [{"rank": 0, "status": "ok", "new_rank": "x"}]}
    rec = PointRecord.read(data)
    assert rec.peak_allocated_bytes == 7 and rec.memory.params_bytes == 3
    assert rec.unknown_fields() == ["memory.new_part", "new_field", "ranks.new_rank"]
    assert rec.to_json() == {**data, "key": {**KEY_FILLS, **KEY}}  # written back as they were read


def test_reading_still_checks_the_declared_fields() -> None:
    with pytest.raises(ValidationError, match="peak_allocated_bytes"):
        PointRecord.read({"key": KEY, "status": "ok", "peak_allocated_bytes": -1, "new_field": 1})


@pytest.mark.parametrize("run_dir", COMMITTED_RUNS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_committed_h200_run_loads_unchanged(run_dir: Path) -> None:
    lines = [json.loads(line) for line in (run_dir / POINTS_FILE).read_text(encoding="utf-8").splitlines()]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no load note at all: nothing unknown, nothing skipped
        run = load_run(run_dir)
    assert not run.warnings
    assert [p.unknown_fields() for p in run.points] == [[] for _ in run.points]
    by_key = {json.dumps(p.key, sort_keys=True): p for p in run.points}
    assert len(by_key) == len(run.points) == len(lines)
    for line in lines:
        # The one change a load makes: an axis added after the run was written takes its default.
        written = {**line, "key": {**KEY_FILLS, **line["key"]}}
        rec = by_key[json.dumps(written["key"], sort_keys=True)]
        assert json.dumps(rec.to_json(), sort_keys=True) == json.dumps(written, sort_keys=True)


def test_there_are_committed_runs_to_check() -> None:
    assert len(COMMITTED_RUNS) >= 3


def test_unknown_fields_of_a_newer_run_are_kept_and_named_once(tmp_path: Path) -> None:
    run_dir = tmp_path / "newer"
    shutil.copytree(COMMITTED_RUNS[0], run_dir, ignore=shutil.ignore_patterns("report", "*.md", "*.csv"))
    lines = (run_dir / POINTS_FILE).read_text(encoding="utf-8").splitlines()
    newer = [{**json.loads(line), "gpu_clock_mhz": 1980 + i} for i, line in enumerate(lines)]
    newer[0]["memory"] = {**newer[0]["memory"], "cuda_graph_bytes": 0}
    (run_dir / POINTS_FILE).write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in newer), encoding="utf-8")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = load_run(run_dir)
    expected = f"{run_dir / POINTS_FILE}: kept fields this ckptbench does not know as they are (another version " \
               "wrote them): gpu_clock_mhz, memory.cuda_graph_bytes"
    assert run.warnings == [expected]
    assert [str(w.message) for w in caught] == [expected]
    assert len(run.points) == len(lines)
    assert [known(p.model_extra)["gpu_clock_mhz"] for p in run.points] == [1980 + i for i in range(len(lines))]
    assert run.points[0].to_json()["memory"]["cuda_graph_bytes"] == 0


def test_a_copy_with_another_key_has_its_own_key_id() -> None:
    """key_id is computed once per record: a copy with other fields computes its own, not its original's."""
    rec = PointRecord(key=KEY, status="ok", step_times_s=[1.0, 2.0, 3.0])
    assert rec.key_id.count("batch_size=2") == 1
    copy = rec.model_copy(update={"key": {**KEY, "batch_size": 4}})
    assert "batch_size=4" in copy.key_id and "batch_size=2" in rec.key_id
    assert rec.model_copy().key_id == rec.key_id


def test_the_prediction_is_declared_once_and_written_flat_as_before() -> None:
    assert PREDICTION_FIELDS == ("predicted_peak_allocated_bytes", "predicted_peak_reserved_bytes", "predicted_oom")
    assert (*PREDICTION_FIELDS, "search") == PARENT_FIELDS  # what a child's record takes from the sweep's
    oom = {"phase": "warm-up step 1", "segment": "logits@0", "where": "the logits", "request_bytes": 8,
           "allocated_bytes": 9, "reserved_bytes": 10}
    prediction = Prediction(predicted_peak_allocated_bytes=5, predicted_peak_reserved_bytes=None,
                            predicted_oom=PredictedOom.model_validate(oom))
    rec = PointRecord(key=KEY, status="oom", **prediction.given())
    assert rec.to_json() == {"key": {**KEY_FILLS, **KEY}, "status": "oom", "predicted_peak_allocated_bytes": 5,
                             "predicted_peak_reserved_bytes": None, "predicted_oom": oom}
    assert rec.prediction == prediction and rec.predicted_oom is not None and rec.predicted_oom.segment == "logits@0"
    assert PointRecord(key=KEY, status="ok").prediction is None  # a sweep run without predictions
    assert _errors({"key": KEY, "status": "oom", "predicted_oom": {**oom, "segmnet": "x"}}) == [
        (("predicted_oom", "segmnet"), "extra_forbidden")
    ]


def test_a_records_point_is_made_once_and_none_for_a_key_of_another_version() -> None:
    rec = PointRecord(key=KEY, status="ok")
    assert rec.point is not None and rec.point is rec.point and rec.point.key_id == rec.key_id
    assert rec.point.batch_size == 2 and rec.point.optimizer == KEY_FILLS["optimizer"]
    newer = PointRecord.read({"key": {**KEY, "new_axis": 1}, "status": "ok"})
    assert newer.point is None
    other = rec.updated(key={**KEY, "batch_size": 4})  # a copy makes its own point
    assert other.point is not None and other.point.batch_size == 4 and rec.point.batch_size == 2


def test_an_updated_record_is_checked_as_written_and_without_forgets_a_field() -> None:
    rec = PointRecord(key=KEY, status="error", reason=None)
    done = rec.updated(status="ok", fatal=True, memory=PointMemory(params_bytes=3))
    assert done.to_json() == {"key": {**KEY_FILLS, **KEY}, "status": "ok", "reason": None, "fatal": True,
                              "memory": {"params_bytes": 3}}
    assert "fatal" not in done.without("fatal").to_json() and done.without("fatal").fatal is False
    with pytest.raises(ValidationError, match="peak_alocated_bytes"):
        rec.updated(peak_alocated_bytes=1)
    with pytest.raises(ValidationError, match="step_times_s"):
        rec.updated(step_times_s=[0.0])  # a step shorter than any clock's resolution
    assert rec.status == "error"  # records are frozen: an update is a new record
