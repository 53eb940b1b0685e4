"""Summary table columns follow what the run holds: technique axes and predictions appear when present."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ckptbench.render.summary import COLUMNS, summary_columns, summary_rows
from ckptbench.results.meta import RunMeta
from ckptbench.results.record import PointRecord
from ckptbench.results.store import Run


def _rec(layout: str, **key: Any) -> dict[str, Any]:
    return {
        "key": {"model": "m", "layout": layout, "batch_size": 2, "seq_len": 64, "precision": "bf16",
                "optimizer": "adamw_fused", "micro_batches": 1, "offload": "none", "lora": "none",
                "compile": False, "attn_implementation": "sdpa", **key},
        "status": "ok",
        "step_times_s": [0.5, 0.5, 0.6],
        "tokens_per_step": 128,
        "peak_allocated_bytes": 3 * 2**30,
        "peak_reserved_bytes": 4 * 2**30,
        "memory": {"params_bytes": 2**30, "grads_bytes": 2**30, "optimizer_state_bytes": 0},
    }


def _records(*recs: dict[str, Any]) -> list[PointRecord]:
    return [PointRecord.model_validate(r) for r in recs]


def test_plain_run_has_the_base_columns() -> None:
    run = Run(path=Path("x"), meta=RunMeta(schema_version=1), points=_records(_rec("none"), _rec("all")))
    assert summary_columns(run) == COLUMNS
    assert summary_rows(run)[0]["activation"] == "1.00 GiB"


def test_technique_axes_get_a_setup_column() -> None:
    run = Run(path=Path("x"), meta=RunMeta(schema_version=1),
              points=_records(_rec("none"), _rec("none", optimizer="sgd", offload="all")))
    cols = [c.name for c in summary_columns(run)]
    assert cols[cols.index("precision") + 1] == "setup"
    assert [r["setup"] for r in summary_rows(run)] == ["-", "optimizer=sgd offload=all"]


def test_predictions_are_shown_as_estimates_with_their_error() -> None:
    rec = {**_rec("none"), "predicted_peak_allocated_bytes": int(3.03 * 2**30)}
    run = Run(path=Path("x"), meta=RunMeta(schema_version=1), points=_records(rec))
    assert "predicted" in [c.name for c in summary_columns(run)]
    row = summary_rows(run)[0]
    assert row["predicted"] == "3.03 GiB (est.)" and row["pred. err"] == "+1.00%"


def test_reserved_predictions_are_shown_next_to_reserved_labelled() -> None:
    key = {"model": "m", "layout": "all", "batch_size": 2, "seq_len": 8, "precision": "bf16"}
    ok = PointRecord.model_validate({"key": key, "status": "ok", "peak_allocated_bytes": 100 * 2**30,
                                     "peak_reserved_bytes": 110 * 2**30, "predicted_peak_reserved_bytes": 99 * 2**30,
                                     "step_times_s": [1.0], "tokens_per_step": 16})
    oom = PointRecord.model_validate({"key": {**key, "batch_size": 4}, "status": "oom",
                                      "predicted_oom": {"phase": "warm-up step 1", "segment": "logits@0"}})
    run = Run(path=Path("x"), meta=RunMeta(schema_version=1, name="r"), points=[ok, oom])
    names = [c.name for c in summary_columns(run)]
    assert names[names.index("reserved") + 1 : names.index("reserved") + 3] == ["pred. reserved", "res. err"]
    rows = summary_rows(run)
    assert (rows[0]["pred. reserved"], rows[0]["res. err"]) == ("99.00 GiB (est.)", "-10.00%")
    assert (rows[1]["pred. reserved"], rows[1]["res. err"]) == ("OOM (est.)", "-")
