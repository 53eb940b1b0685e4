"""Measured (CPU live-tensor tracker) memory orderings, loss equality, OOM as a result."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from ckptbench.bench.device import make_probe, resolve_device
from ckptbench.bench.runner import Progress, Runner
from ckptbench.config.schema import SweepConfig
from tests.conftest import tiny_config

LAYOUTS = ["none", "all", "first:4", "last:4", "all@attn", "all@mlp"]


def run_points(cfg: SweepConfig) -> dict[tuple[str, int], dict[str, Any]]:
    device = resolve_device(cfg)
    records: dict[tuple[str, int], dict[str, Any]] = {}

    def collect(event: Progress) -> None:
        if event.record is not None:
            records[(event.point.layout, event.point.batch_size)] = event.record

    Runner(cfg, device, make_probe(cfg, device)).run(cfg.points_list(), collect)
    return records


@pytest.fixture(scope="module")
def measured() -> dict[tuple[str, int], dict[str, Any]]:
    cfg = tiny_config(sweep={"layout": LAYOUTS, "batch_size": [2], "seq_len": [128], "precision": ["fp32"]})
    return run_points(cfg)


def peak(records: dict[tuple[str, int], dict[str, Any]], layout: str) -> int:
    rec = records[(layout, 2)]
    assert rec.status == "ok", rec.reason
    return rec.peak_allocated_bytes


def test_full_checkpointing_lowers_the_peak(measured: dict) -> None:
    assert peak(measured, "all") < peak(measured, "first:4") < peak(measured, "none")


def test_which_layers_are_checkpointed_changes_the_peak(measured: dict) -> None:
    # Unchecked late layers are freed early in the backward pass; checkpointed late layers are
    # recomputed while every early layer's activations are still held.
    assert peak(measured, "first:4") < peak(measured, "last:4")


def test_granularity_changes_the_peak(measured: dict) -> None:
    assert peak(measured, "all@attn") != peak(measured, "all@mlp")
    assert peak(measured, "all") < peak(measured, "all@mlp") < peak(measured, "none")


def test_static_memory_is_exact_and_identical_across_layouts(measured: dict) -> None:
    model_params = 1_673_344  # tiny preset: 8 x (4*128*128 + 3*128*352 + 2*128) + 2*256*128 + 128
    mems = [rec.memory for rec in measured.values()]
    for mem in mems:
        assert mem.params_bytes == model_params * 4
        assert mem.grads_bytes == model_params * 4
        assert mem.optimizer_state_bytes >= 2 * model_params * 4  # exp_avg + exp_avg_sq (+ step scalars)
        assert not mem.leaked
    assert len({(m.params_bytes, m.optimizer_state_bytes) for m in mems}) == 1


def test_losses_match_the_unchecked_layout(measured: dict) -> None:
    ref = measured[("none", 2)].losses
    for (layout, _), rec in measured.items():
        assert rec.loss_check.match is True, layout
        assert rec.losses == pytest.approx(ref, rel=1e-5)
        assert len(rec.step_times_s) == 2 and all(t > 0 for t in rec.step_times_s)


def test_out_of_memory_is_a_row_and_larger_batches_are_skipped(measured: dict) -> None:
    # Cap between the 'all' and 'none' peaks: 'none' runs out, 'all' fits.
    cap = (peak(measured, "all") + peak(measured, "none")) / 2
    cfg = tiny_config(
        memory_cap_gib=cap / 2**30,
        sweep={"layout": ["none", "all"], "batch_size": [2, 4], "seq_len": [128], "precision": ["fp32"]},
    )
    records = run_points(cfg)
    assert records[("none", 2)].status == "oom"
    assert "tried to allocate" in records[("none", 2)].reason
    assert records[("none", 4)].status == "skipped"
    assert records[("all", 2)].status == "ok"
    assert records[("all", 2)].peak_allocated_bytes == peak(measured, "all")
    # After the OOM the memory is back at its baseline: nothing leaked into the next point.
    assert records[("none", 2)].memory.leaked is False
    assert records[("all", 2)].memory.baseline_allocated_bytes == (
        records[("none", 2)].memory.baseline_allocated_bytes
    )


def test_bf16_and_amp_run_and_store_state_in_the_right_dtype() -> None:
    cfg = tiny_config(sweep={"layout": ["none", "all"], "batch_size": [1], "seq_len": [64],
                             "precision": ["bf16", "amp_bf16"]})
    records = run_points(cfg)
    assert len(records) == 2  # keyed by (layout, batch): the last precision wins; check both ran
    for rec in records.values():
        assert rec.status == "ok"
    amp = records[("all", 1)]
    assert amp.key["precision"] == "amp_bf16"
    assert amp.memory.params_bytes == 1_673_344 * 4  # fp32 master weights under autocast


def test_cuda_requested_without_gpu_is_a_clear_error() -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    from ckptbench.errors import EnvironmentError_

    with pytest.raises(EnvironmentError_, match="ckptbench estimate"):
        resolve_device(tiny_config(device="cuda"))
