"""The host while a sweep measures (intra-op threads, busy and spread warnings), the tool's own time,
predictions made in the background, and the per-point overhead cuts (frozen objects, one weight reset
and one loss recomputation where one is enough)."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import ckptbench.measure.window as window_module
from ckptbench.estimator.estimator import estimate_points, iter_predictions
from ckptbench.measure.environment import available_cpus, spread_warning
from ckptbench.render.summary import summary_rows
from ckptbench.results.meta import RunMeta
from ckptbench.results.record import PointRecord, Prediction
from ckptbench.results.store import Run, load_run
from ckptbench.sweep import predictions
from ckptbench.sweep.predictions import BackgroundPredictions
from ckptbench.sweep.sweep import run_sweep
from ckptbench.train.step import Trainer
from tests._known import known
from tests.conftest import MINI, tiny_config

REPO = Path(__file__).resolve().parent.parent
AXES = {"layout": ["none", "all"], "batch_size": [1], "seq_len": [64], "precision": ["fp32"]}


def _spy_steps(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Record (intra-op threads, frozen objects) at every training step."""
    seen: list[tuple[int, int]] = []
    step = Trainer.step

    def spy(self: Trainer, ids: torch.Tensor) -> torch.Tensor:
        seen.append((torch.get_num_threads(), gc.get_freeze_count()))
        return step(self, ids)

    monkeypatch.setattr(Trainer, "step", spy)
    return seen


@pytest.mark.parametrize(("threads", "before"), [(1, 2), (2, 1)])
def test_cpu_threads_hold_during_the_steps_and_are_restored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, threads: int, before: int
) -> None:
    seen = _spy_steps(monkeypatch)
    torch.set_num_threads(before)  # the conftest fixture restores one thread afterwards
    # One point, one measured step of MINI's one-layer model: two threads on a busy machine are slow (the
    # reason for the default), in proportion to the work.
    cfg = tiny_config(cpu_threads=threads, measured_steps=1, model=MINI["model"], sweep={**AXES, "layout": ["all"]})
    run_sweep(cfg, out=tmp_path / "r", predict=False)
    assert {t for t, _ in seen} == {threads} and len(seen) == 2  # 1 warm-up + 1 measured step
    assert torch.get_num_threads() == before
    env = load_run(tmp_path / "r").environment
    assert env.torch_num_threads == threads and (env.cpus_available or 0) >= 1
    assert isinstance(env.load_average_1m, float)


def test_long_lived_objects_are_frozen_while_points_run_and_released_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = _spy_steps(monkeypatch)
    outcome = run_sweep(tiny_config(sweep=AXES), out=tmp_path / "r", predict=False)
    # Frozen: the collection after each point skips the imports' ~370k objects.
    assert min(f for _, f in seen) > 100_000
    assert gc.get_freeze_count() == 0  # nothing stays frozen after the sweep
    none, all_ = (r.overhead_parts_s for r in outcome.records)
    # 'none' recomputes the first loss (which resets the weights): its window does not reset them again.
    assert set(none) == {"loss_recompute", "cleanup"} and set(all_) == {"weights_reset", "cleanup"}
    assert all(known(r.loss_check).match for r in outcome.records)
    assert all(r.overhead_s is not None and 0 <= r.overhead_s < known(r.wall_s) for r in outcome.records)


def test_one_loss_recomputation_serves_every_layout_of_a_cell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    recompute = window_module.recompute_first_loss

    def counted(*args: Any, **kw: Any) -> Any:
        calls.append(args[1].key_id)
        return recompute(*args, **kw)

    monkeypatch.setattr(window_module, "recompute_first_loss", counted)
    axes = {**AXES, "layout": ["all", "first:4", "last:4"]}  # no 'none': every layout needs the reference
    outcome = run_sweep(tiny_config(sweep=axes), out=tmp_path / "r", predict=False)
    assert len(calls) == 1
    checks = [known(r.loss_check) for r in outcome.records]
    assert [c.reference for c in checks] == ["recomputed"] * 3 and all(c.match for c in checks)
    assert len({tuple(c.reference_losses) for c in checks}) == 1


@pytest.mark.host_warnings
def test_a_busy_machine_is_warned_about_and_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("ckptbench.measure.environment.load_average", lambda: 99.0)
    monkeypatch.setattr("ckptbench.measure.environment.spread_warning", lambda step_times_s: None)
    outcome = run_sweep(tiny_config(sweep=AXES), out=tmp_path / "r", predict=False)
    cpus = available_cpus()
    busy = f"busy: load average 99.0 above the {cpus} CPUs available; step times may be inflated"
    assert [r.warnings for r in outcome.records] == [[busy], [busy]]
    assert [r.load_average_1m for r in outcome.records] == [99.0, 99.0]
    assert outcome.warnings == [f"the machine was {busy} (at the start; each point records its own)"]
    assert [row["status"] for row in summary_rows(load_run(tmp_path / "r"))] == ["ok (busy)", "ok (busy)"]
    monkeypatch.setattr("ckptbench.measure.environment.load_average", lambda: 0.5)
    quiet = run_sweep(tiny_config(sweep=AXES), out=tmp_path / "q", predict=False)
    assert [r.warnings for r in quiet.records] == [[], []]


@pytest.mark.host_warnings
def test_points_in_their_own_processes_are_judged_where_those_ran(isolated_busy_run: Any) -> None:
    """--isolate (and sharded points, fanned-out jobs): the process that started the point's processes
    judges the host as they end (processes/launch.py), not the point's own process.

    conftest's isolated_busy_run: two points run with --isolate while the load average reads 99.0 in the
    sweep's process (the point processes read the real one), shared with tests/test_loss_check.py."""
    outcome = isolated_busy_run
    assert [r.load_average_1m for r in outcome.records] == [99.0, 99.0]
    assert all(r.isolated and [w[:26] for w in r.warnings] == ["busy: load average 99.0 ab"] for r in outcome.records)


@pytest.mark.host_warnings
def test_unsteady_steps_are_warned_about(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("ckptbench.measure.environment.busy_warning", lambda load, cpus: None)
    step, count = Trainer.step, [0]

    def hiccup(self: Trainer, ids: torch.Tensor) -> torch.Tensor:
        count[0] += 1
        if count[0] % 4 == 0:  # the last of each point's 1 warm-up + 3 measured steps
            time.sleep(0.5)  # IQR 0.25 s: above 10% of any median step time below 2.5 s
        return step(self, ids)

    monkeypatch.setattr(Trainer, "step", hiccup)
    outcome = run_sweep(tiny_config(measured_steps=3, sweep=AXES), out=tmp_path / "r", predict=False)
    for rec in outcome.records:
        assert rec.warning_kinds == ["spread"], rec.warnings
        assert rec.warnings[0].startswith("spread: step times' inter-quartile range is ")


def test_spread_threshold() -> None:
    assert spread_warning([1.0, 1.02, 1.04]) is None  # 2% of the median
    assert spread_warning([1.0, 1.0, 1.3]) == (
        "spread: step times' inter-quartile range is 15% of the median (above 10%); the median is unsteady"
    )
    assert spread_warning([1.0]) is None  # one step has no spread


def test_warnings_show_in_the_summary_status() -> None:
    key = {"layout": "all", "batch_size": 1, "seq_len": 8, "precision": "fp32"}
    base = {"key": key, "status": "ok", "loss_check": {"match": True}}
    busy, spread = "busy: load average 3.0 above the 2 CPUs available", "spread: ... 15% of the median"
    recs = [
        PointRecord.model_validate({**base, "warnings": [busy, spread]}),
        PointRecord.model_validate({**base, "warnings": [busy], "loss_check": {"match": False}}),
        PointRecord.model_validate(base),
    ]
    rows = summary_rows(Run(path=Path("r"), meta=RunMeta(schema_version=1), points=recs))
    assert [r["status"] for r in rows] == ["ok (busy, spread)", "ok (loss mismatch; busy)", "ok"]


# ---------------------------------------------------------------- predictions in the background


def test_predictions_stream_in_the_points_order_and_equal_the_estimates() -> None:
    cfg = tiny_config(sweep={**AXES, "batch_size": [1, 2]})
    points = cfg.points_list()
    streamed = list(iter_predictions(cfg, points, target="cpu"))
    # Each as soon as its shape is traced: the first point's comes first, before the second shape's trace.
    assert [k for k, _ in streamed] == [points[i].key_id for i in (0, 2, 1, 3)]  # none b=1, all b=1, b=2...
    peaks = {k: prediction.predicted_peak_allocated_bytes for k, prediction in streamed}
    assert peaks == {e.point.key_id: e.peak_bytes for e in estimate_points(cfg, points, target="cpu")}


def test_background_predictions_are_recorded_like_in_process_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(predictions, "MAX_WAIT_S", 600.0)  # the process is niced: slow on a busy machine
    started: list[BackgroundPredictions] = []
    start = BackgroundPredictions.start

    def recorded_start(cls: type[BackgroundPredictions]) -> BackgroundPredictions:
        started.append(start())
        return started[-1]

    monkeypatch.setattr(BackgroundPredictions, "start", classmethod(recorded_start))
    cfg = tiny_config(sweep={**AXES, "batch_size": [1, 2]})
    outcome = run_sweep(cfg, out=tmp_path / "r", predict_in_background=True)
    predicted = iter_predictions(cfg, cfg.points_list(), target="cpu")
    expected = {key: prediction.predicted_peak_allocated_bytes for key, prediction in predicted}
    assert {r.key_id: r.predicted_peak_allocated_bytes for r in outcome.records} == expected
    assert all(v for v in expected.values()) and outcome.warnings == []
    timing = load_run(tmp_path / "r").meta.timing
    assert timing is not None
    entry = timing.invocations[0]
    assert entry.predictions_mode == "background" and (entry.predictions_background_s or 0) > 0
    assert (entry.predictions_s or 0) < 1.0  # nothing is predicted in the sweep's own process
    assert started[0].proc.poll() is not None  # the process has ended


def _stub(script: str) -> BackgroundPredictions:
    """A BackgroundPredictions fed by a stand-in process that prints what ``script`` prints."""
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    return BackgroundPredictions(proc)


def test_a_point_waits_for_its_prediction_so_it_is_made_before_the_point() -> None:
    cfg = tiny_config(sweep={**AXES, "batch_size": [1, 2]})
    points = cfg.points_list()
    first = points[0].key_id
    bg = _stub(
        "import json, sys, time; sys.stdin.readline(); time.sleep(0.5); "
        f"print(json.dumps({{'key_id': {first!r}, 'fields': {{'predicted_peak_allocated_bytes': 123}}}}), "
        "flush=True); time.sleep(30)"
    )
    try:
        bg.request(cfg, points, target="cpu")
        assert bg.get("not asked for") is None and bg.wait_s == 0  # a search probe: no wait
        assert bg.get(first) == Prediction(predicted_peak_allocated_bytes=123) and 0.3 < bg.wait_s < 10
    finally:
        bg.close()
    assert bg.proc.poll() is not None


def test_predictions_that_do_not_come_cost_at_most_the_wait_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(predictions, "MAX_WAIT_S", 0.3)
    cfg = tiny_config(sweep={**AXES, "batch_size": [1, 2]})
    points = cfg.points_list()
    bg = _stub("import sys, time; sys.stdin.readline(); time.sleep(30)")
    try:
        bg.request(cfg, points, target="cpu")
        assert [bg.get(p.key_id) for p in points] == [None] * 4
    finally:
        bg.close()
    assert bg.wait_s < 1.0 and bg.missing == 4
    assert bg.notes()[-1] == "4 point(s) ran without a prediction: it was not ready after 0.3 s"


# ---------------------------------------------------------------- the command's own time


def test_the_process_start_is_when_the_interpreter_started() -> None:
    code = (
        "import time; time.sleep(1.0); from ckptbench.sweep.timing import process_start_monotonic; "
        "print(time.monotonic() - process_start_monotonic())"
    )
    age = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                               cwd=REPO).stdout)
    assert 1.0 <= age < 30  # the sleep before the import is counted


def test_the_parts_of_a_sweep_add_up(tmp_path: Path) -> None:
    outcome = run_sweep(tiny_config(sweep=AXES), out=tmp_path / "r", predict=False)
    meta = load_run(tmp_path / "r").meta
    assert meta.timing is not None
    t = meta.timing.to_json()  # as run.json holds it
    entry = t["invocations"][0]
    assert entry["status"] == "complete" and entry["points"] == 2 and entry["predictions_mode"] == "off"
    steps = sum(sum(r.warmup_times_s) + sum(r.step_times_s) for r in outcome.records)
    assert t["steps_s"] == pytest.approx(steps)
    assert t["steps_s"] + t["point_overhead_s"] + t["between_points_s"] == pytest.approx(t["points_s"])
    assert meta.sweep_wall_s == t["points_s"] and t["points_s"] > t["steps_s"]
    assert "command_wall_s" not in entry  # only the CLI knows when the command ends
    json.dumps(t)  # plain JSON
