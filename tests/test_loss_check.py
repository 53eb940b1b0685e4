"""The loss check: a reference for every ok point (the 'none' layout, or the first step recomputed
without checkpointing), a tolerance from the precision, and a wrong loss flagged."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

import ckptbench.measure.window as window_module
from ckptbench.config.grid import key_id
from ckptbench.errors import ConfigError
from ckptbench.measure.loss_check import RTOL_BY_PRECISION, compare, loss_rtol
from ckptbench.render.summary import summary_rows
from ckptbench.results.meta import RunMeta
from ckptbench.results.record import PointRecord
from ckptbench.results.store import Run, load_run
from ckptbench.sweep.sweep import run_sweep
from ckptbench.train.step import Trainer
from tests.conftest import tiny_config

SMALL = {"preset": "tiny", "overrides": {"num_hidden_layers": 2}}


def sweep(tmp_path: Path, name: str, *, isolate: bool = False, **overrides: Any) -> dict[str, dict[str, Any]]:
    """Run a small sweep; its records by layout (each layout appears once)."""
    axes = {"layout": ["none", "all"], "batch_size": [2], "seq_len": [64], "precision": ["fp32"]}
    data: dict[str, Any] = {"model": SMALL, "measured_steps": 1, "sweep": axes, **overrides}
    # predict=False: predictions play no part in the loss check
    records = run_sweep(tiny_config(**data), out=tmp_path / name, isolate=isolate, predict=False).records
    by_layout = {str(r.key["layout"]): r.to_json() for r in records}  # as written to points.jsonl
    assert len(by_layout) == len(records)
    return by_layout


def first_loss(rec: dict[str, Any]) -> float:
    return float(rec["warmup_losses"][0])


# ---------------------------------------------------------------- the pure comparison


def test_tolerance_comes_from_the_precision_unless_configured() -> None:
    assert loss_rtol("fp32", None) == 1e-5
    assert loss_rtol("bf16", None) == loss_rtol("amp_bf16", None) == 2**-8
    assert loss_rtol("fp16", None) == loss_rtol("amp_fp16", None) == 2**-10
    assert loss_rtol("bf16", 0.05) == 0.05
    # Coarser formats get looser tolerances, and every one is tighter than the old fixed 1e-2.
    assert RTOL_BY_PRECISION["fp32"] < RTOL_BY_PRECISION["fp16"] < RTOL_BY_PRECISION["bf16"] < 1e-2


def test_compare_measures_the_largest_relative_difference() -> None:
    losses, reference = [10.0, 9.0018, 8.0], [10.0, 9.0, 8.0]
    check = compare(losses, reference, rtol=1e-4, kind="none", reference_point="k")
    assert check.max_rel_diff == pytest.approx(2e-4) and check.match is False
    assert check.steps == 3 and check.reference_losses == reference
    assert compare(losses, reference, rtol=3e-4, kind="none", reference_point="k").match is True


def test_compare_uses_the_steps_both_have_and_flags_non_finite_losses() -> None:
    one = compare([5.0, 4.0, 3.0], [5.0], rtol=1e-5, kind="recomputed", reference_point="r")
    assert (one.steps, one.max_rel_diff, one.match) == (1, 0.0, True)
    # A NaN in a later step is a mismatch even when only the first step has a reference.
    bad = compare([5.0, math.nan], [5.0], rtol=1e-5, kind="recomputed", reference_point="r")
    assert bad.max_rel_diff is None and bad.match is False


@pytest.mark.parametrize("value", [0, -1e-3, "inf", "nan"])
def test_loss_rtol_must_be_finite_and_positive(value: Any) -> None:
    with pytest.raises(ConfigError, match="loss_rtol"):
        tiny_config(loss_rtol=value)


def test_loss_rtol_defaults_to_null() -> None:
    assert tiny_config().loss_rtol is None


# ---------------------------------------------------------------- a reference for every ok point


def test_without_a_none_layout_the_first_step_is_recomputed(tmp_path: Path) -> None:
    with_none = sweep(tmp_path, "with")
    alone = sweep(tmp_path, "alone", sweep={"layout": ["all"], "batch_size": [2], "seq_len": [64],
                                            "precision": ["fp32"]})
    check = alone["all"]["loss_check"]
    assert check["reference"] == "recomputed" and check["steps"] == 1 and check["rtol"] == 1e-5
    assert "2 of 2 sequences per pass" in check["reference_point"] and check["match"] is True
    # The recomputed loss is what training without checkpointing gives at its first step.
    assert check["reference_losses"] == [pytest.approx(first_loss(with_none["none"]), rel=1e-6)]
    # With 'none' in the grid, every step is compared with it; 'none' itself with the recomputed loss.
    full = with_none["all"]["loss_check"]
    assert full["reference"] == "none" and full["reference_point"] == key_id(with_none["none"]["key"])
    steps = with_none["none"]["warmup_losses"] + with_none["none"]["losses"]
    assert full["steps"] == len(steps) == 2 and full["reference_losses"] == steps and full["match"] is True
    own = with_none["none"]["loss_check"]
    assert own["reference"] == "recomputed" and own["match"] is True
    assert own["reference_losses"] == check["reference_losses"]


def test_when_none_runs_out_of_memory_the_others_are_still_checked(tmp_path: Path) -> None:
    # 34 MiB, enforced by the CPU tracker: 'none' at batch 2, seq 128 runs out, 'all' fits.
    recs = sweep(tmp_path, "capped", memory_cap_gib=34 / 1024, model={"preset": "tiny"},
                 sweep={"layout": ["none", "all", "first:6"], "batch_size": [2], "seq_len": [128],
                        "precision": ["fp32"]})
    assert recs["none"]["status"] == "oom"
    assert "loss_check" not in recs["none"]
    for layout in ("all", "first:6"):
        assert recs[layout]["status"] == "ok", recs[layout]["reason"]
        check = recs[layout]["loss_check"]
        assert check["reference"] == "recomputed" and check["match"] is True, check
        assert check["max_rel_diff"] <= 1e-6
    assert recs["all"]["loss_check"]["reference_losses"] == recs["first:6"]["loss_check"]["reference_losses"]


def test_isolated_points_get_their_reference_from_the_parent(isolated_busy_run: Any) -> None:
    # conftest's ISOLATED_BUSY: this file's small sweep of 'none' and 'all', run with --isolate, shared
    recs = {str(r.key["layout"]): r.to_json() for r in isolated_busy_run.records}  # as written to points.jsonl
    assert len(recs) == len(isolated_busy_run.records) == 2
    assert recs["none"]["isolated"] and recs["all"]["isolated"]
    check = recs["all"]["loss_check"]
    assert check["reference"] == "none" and check["reference_point"] == key_id(recs["none"]["key"])
    assert check["reference_losses"] == recs["none"]["warmup_losses"] + recs["none"]["losses"]
    assert check["match"] is True and recs["none"]["loss_check"]["reference"] == "recomputed"


# ---------------------------------------------------------------- a wrong loss is flagged


def _perturb_checkpointed(monkeypatch: pytest.MonkeyPatch, factor: float) -> None:
    """Make every checkpointed layout's first loss wrong by ``factor`` (relative)."""
    measure = window_module.measure_point

    def wrong(model: Any, point: Any, plan: Any, base: PointRecord, **kw: Any) -> PointRecord:
        result = measure(model, point, plan, base, **kw)
        if point.layout != "none" and result.ok:
            first, *rest = result.warmup_losses
            return result.updated(warmup_losses=[first * (1 + factor), *rest])
        return result

    monkeypatch.setattr(window_module, "measure_point", wrong)


@pytest.mark.parametrize("layouts", [["none", "all"], ["all"]], ids=["against-none", "against-recomputed"])
def test_a_wrong_loss_is_a_mismatch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layouts: list[str]) -> None:
    _perturb_checkpointed(monkeypatch, 1e-4)  # ten times the fp32 tolerance
    axes = {"layout": layouts, "batch_size": [2], "seq_len": [64], "precision": ["fp32"]}
    recs = sweep(tmp_path, "wrong", sweep=axes)
    check = recs["all"]["loss_check"]
    assert check["reference"] == layouts[0].replace("all", "recomputed")
    assert check["max_rel_diff"] == pytest.approx(1e-4, rel=1e-2) and check["match"] is False
    rows = {row["layout"]: row["status"] for row in summary_rows(load_run(tmp_path / "wrong"))}
    assert rows["all"] == "ok (loss mismatch)"
    if "none" in recs:
        assert recs["none"]["loss_check"]["match"] is True and rows["none"] == "ok"


def test_a_configured_tolerance_replaces_the_precision_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _perturb_checkpointed(monkeypatch, 1e-4)
    check = sweep(tmp_path, "loose", loss_rtol=1e-3)["all"]["loss_check"]
    assert check["rtol"] == 1e-3 and check["match"] is True


def test_a_wrong_none_layout_is_caught_by_the_recomputed_loss(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    step = Trainer.step
    monkeypatch.setattr(Trainer, "step", lambda self, ids: step(self, ids) * (1 + 1e-4))  # every layout
    recs = sweep(tmp_path, "skewed")
    assert recs["none"]["loss_check"]["reference"] == "recomputed"
    assert recs["none"]["loss_check"]["match"] is False
    # 'all' agrees with 'none' (both skewed alike): the cell's reference is still 'none'.
    assert recs["all"]["loss_check"]["reference"] == "none" and recs["all"]["loss_check"]["match"] is True


def test_old_records_stay_readable(tmp_path: Path) -> None:
    """Older runs stored {reference, max_rel_diff, match}, or null where 'none' did not run."""

    def rec(layout: str, loss_check: Any) -> dict[str, Any]:
        key = {"model": "m", "layout": layout, "batch_size": 2, "seq_len": 64, "precision": "bf16",
               "optimizer": "adamw_fused"}
        return {"key": key, "status": "ok", "step_times_s": [0.5], "tokens_per_step": 128, "loss_check": loss_check}

    old = {"reference": "none", "max_rel_diff": 0.0, "match": True}
    points = [rec("none", old), rec("all", None), rec("first:2", {**old, "match": False})]
    run = Run(path=tmp_path, meta=RunMeta(schema_version=1), points=[PointRecord.model_validate(p) for p in points])
    assert [r["status"] for r in summary_rows(run)] == ["ok", "ok (loss unchecked)", "ok (loss mismatch)"]
