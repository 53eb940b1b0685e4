"""batch_size: max and layout: fit: correct boundaries from measured points, every probe recorded."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from ckptbench.config.grid import Point
from ckptbench.results.record import PointRecord
from ckptbench.search.searches import BatchMaxSearch, LayoutFitSearch
from ckptbench.sweep.sweep import run_sweep
from tests.conftest import tiny_config

TEMPLATE = Point(precision="fp32", lora="none", layout="none", seq_len=64, batch_size=1, model="m", optimizer="sgd")


def drive(search: Any, oracle: Any, budget: int | None = None) -> list[Any]:
    probes = []
    while (point := search.next_point(budget)) is not None:
        probes.append(point)
        search.observe(point, PointRecord.model_validate({"key": point.key, **oracle(point)}), budget)
    return probes


@pytest.mark.parametrize(("boundary", "expected_probes"), [
    (13, [1, 2, 4, 8, 16, 12, 14, 13]),
    (1, [1, 2]),
    (16, [1, 2, 4, 8, 16, 32, 24, 20, 18, 17]),
    (0, [1]),
])
def test_batch_max_doubles_then_bisects(boundary: int, expected_probes: list[int]) -> None:
    search = BatchMaxSearch(TEMPLATE, limit=1024)
    probes = drive(search, lambda p: {"status": "ok" if p.batch_size <= boundary else "oom"})
    assert [p.batch_size for p in probes] == expected_probes
    assert search.result().batch_size == (boundary or None)
    assert search.result().probes == tuple(expected_probes)


def test_batch_max_stops_at_the_limit() -> None:
    search = BatchMaxSearch(TEMPLATE, limit=8)
    probes = drive(search, lambda p: {"status": "ok"})
    assert [p.batch_size for p in probes] == [1, 2, 4, 8]
    assert search.result().batch_size == 8 and search.result().first_failing_batch_size is None
    # As run.json keeps it (under ``searches``).
    cell = {k: v for k, v in TEMPLATE.key.items() if k != "batch_size"}
    assert search.outcome() == {
        "kind": "batch_max", "group": "none s=64 fp32 optimizer=sgd", "key": cell, "predicted": None,
        "answer": {"batch_size": 8, "first_failing_batch_size": None}, "probes": [1, 2, 4, 8],
    }


def _peaks(k: int) -> int:
    # 32 layers, each checkpointed early layer saves 10 units, late ones 8 (position effect).
    return 1000 - sum(10 if i < 16 else 8 for i in range(k))


@pytest.mark.parametrize("budget", [1000, 999, 900, 841, 840, 705, 600])
def test_layout_fit_finds_the_fewest_layers(budget: int) -> None:
    search = LayoutFitSearch(TEMPLATE, num_layers=32)

    def oracle(p: Point) -> dict[str, Any]:
        k = 0 if p.layout == "none" else 32 if p.layout == "all" else int(p.layout.split(":")[1])
        return {"status": "ok", "peak_reserved_bytes": _peaks(k)}

    probes = drive(search, oracle, budget)
    expected = next((k for k in range(33) if _peaks(k) <= budget), None)
    assert search.result().num_checkpointed == expected
    assert len(probes) <= 8  # the measured per-layer cost proposes k: few probes, not 32
    layouts = [p.layout for p in probes]
    assert len(set(layouts)) == len(layouts)


def test_layout_fit_ends_when_not_even_all_fits() -> None:
    """'all' out of memory is the answer 'nothing fits', not a probe to measure again (it was asked forever)."""
    search = LayoutFitSearch(TEMPLATE, num_layers=32)
    probes = drive(search, lambda p: {"status": "oom"})
    assert [p.layout for p in probes] == ["none", "all"]
    assert search.result().layout is None and search.result().num_checkpointed is None
    assert search.outcome()["answer"] == {"layout": None, "num_checkpointed": None, "layers": None}
    predicted = LayoutFitSearch(TEMPLATE, num_layers=32, predict=lambda p: False)
    assert [p.layout for p in drive(predicted, lambda p: {"status": "oom"})] == ["all"]
    assert predicted.outcome()["predicted"] == {"num_checkpointed": 33}  # none predicted to fit


def _records(run_dir: Path) -> list[PointRecord]:
    return [PointRecord.model_validate_json(x) for x in (run_dir / "points.jsonl").read_text().splitlines()]


def test_batch_max_on_cpu_under_a_tracker_cap(tmp_path: Path) -> None:
    cfg = tiny_config(
        memory_cap_gib=40 / 1024,  # 40 MiB: enforced by the CPU live-tensor tracker
        measured_steps=1,
        sweep={"layout": ["none", "all"], "batch_size": "max", "seq_len": [128], "precision": ["fp32"]},
    )
    outcome = run_sweep(cfg, out=tmp_path / "run")
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    answers = {s["key"]["layout"]: s for s in meta["searches"]}
    records = _records(tmp_path / "run")
    assert len(records) == sum(len(s["probes"]) for s in meta["searches"]) == len(outcome.records)
    for layout, search in answers.items():
        best = search["answer"]["batch_size"]
        by_batch = {r.key["batch_size"]: r for r in records if r.key["layout"] == layout}
        assert by_batch[best].status == "ok"
        assert by_batch[best + 1].status == "oom"  # the boundary was probed on both sides
        assert all(r.search for r in by_batch.values())
    assert answers["all"]["answer"]["batch_size"] > answers["none"]["answer"]["batch_size"]
    # Every probe carries the estimator's prediction, made just before it ran (exact on CPU for ok probes).
    assert all(r.predicted_peak_allocated_bytes for r in records)
    assert all(r.predicted_peak_allocated_bytes == r.peak_allocated_bytes for r in records if r.ok)


def test_layout_fit_on_cpu_under_a_tracker_cap(tmp_path: Path) -> None:
    cfg = tiny_config(
        memory_cap_gib=34 / 1024,
        measured_steps=1,
        sweep={"layout": ["fit"], "batch_size": [2], "seq_len": [128], "precision": ["fp32"]},
    )
    run_sweep(cfg, out=tmp_path / "run")
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    (search,) = meta["searches"]
    k = search["answer"]["num_checkpointed"]
    assert 0 < k < 8, search
    status = {r.key["layout"]: r.status for r in _records(tmp_path / "run")}
    assert set(status) == set(search["probes"])
    assert status[search["answer"]["layout"]] == "ok"
    fewer = "none" if k == 1 else f"first:{k - 1}"
    assert status[fewer] == "oom"


# -- searches that start from predictions (estimates): GPU time goes to the boundary ------------------------


@pytest.mark.parametrize(("predicted", "boundary", "expected_probes"), [
    (13, 13, [13, 14]),  # right: the boundary's two sides, nothing else
    (14, 13, [14, 13]),  # one too high: one less confirms
    (12, 13, [12, 13, 26, 19, 16, 14]),  # too low: measure on from the prediction (doubling, then bisection)
    (0, 0, [1]),  # nothing predicted to fit: batch 1 confirms it
])
def test_batch_max_starts_from_the_predicted_boundary(
    predicted: int, boundary: int, expected_probes: list[int],
) -> None:
    asked: list[int] = []

    def predict(p: Point) -> bool:
        asked.append(p.batch_size)
        return p.batch_size <= predicted

    search = BatchMaxSearch(TEMPLATE, limit=1024, predict=predict)
    probes = drive(search, lambda p: {"status": "ok" if p.batch_size <= boundary else "oom"})
    assert [p.batch_size for p in probes] == expected_probes
    assert search.result().batch_size == (boundary or None) and search.result().predicted == predicted
    assert search.outcome()["predicted"] == {"batch_size": predicted}
    assert len(asked) <= 2 * 11  # predictions double then bisect up to the limit: no GPU time
    assert search.fresh(replace(TEMPLATE, batch_size=predicted + 1))
    assert not search.fresh(replace(TEMPLATE, batch_size=40))


@pytest.mark.parametrize(("predicted_k", "true_k", "expected"), [
    (17, 17, ["first:17", "first:16"]),  # right: the boundary's two sides
    (17, 18, ["first:17", "first:18"]),  # one too few: one more confirms
    (0, 0, ["none"]),
])
def test_layout_fit_starts_from_the_predicted_layer_count(predicted_k: int, true_k: int, expected: list[str]) -> None:
    def k_of(layout: str) -> int:
        return 0 if layout == "none" else 32 if layout == "all" else int(layout.split(":")[1])

    search = LayoutFitSearch(TEMPLATE, num_layers=32, predict=lambda p: k_of(p.layout) >= predicted_k)
    probes = drive(search, lambda p: {"status": "ok" if k_of(p.layout) >= true_k else "oom"})
    assert [p.layout for p in probes] == expected
    assert search.outcome()["answer"] == {"layout": f"first:{true_k}" if true_k else "none", "num_checkpointed": true_k,
                                          "layers": list(range(true_k))}
    assert search.fresh(probes[0])


def test_a_probe_fits_only_with_the_memory_outside_the_allocator_counted() -> None:
    def fits(record: PointRecord, budget: int | None) -> bool:
        return BatchMaxSearch(TEMPLATE).observe(TEMPLATE, record, budget)

    key = TEMPLATE.key
    assert fits(PointRecord.model_validate({"key": key, "status": "ok", "peak_reserved_bytes": 90}), 100)
    ok_with_context = {"key": key, "status": "ok", "peak_reserved_bytes": 90, "context_bytes": 10}
    assert fits(PointRecord.model_validate(ok_with_context), 100)
    too_much = {**ok_with_context, "context_bytes": 11}  # 90 reserved + 11 outside the allocator > 100
    assert not fits(PointRecord.model_validate(too_much), 100)
    assert fits(PointRecord.model_validate(too_much), None)  # no budget: it ran, it fits
