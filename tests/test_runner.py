"""Measured (CPU live-tensor tracker) memory orderings, loss equality, OOM as a result."""

from __future__ import annotations

import pytest
import torch

from ckptbench.config.schema import SweepConfig
from ckptbench.measure.device import make_probe, resolve_device
from ckptbench.measure.progress import Progress
from ckptbench.measure.runner import Runner
from ckptbench.results.record import PointRecord
from tests.conftest import tiny_config

LAYOUTS = ["none", "all", "first:4", "last:4", "all@attn", "all@mlp"]


Records = dict[tuple[str, str, int], PointRecord]  # by (precision, layout, batch size)


def run_points(cfg: SweepConfig) -> Records:
    device = resolve_device(cfg)
    records: Records = {}

    def collect(event: Progress) -> None:
        if event.record is not None:
            key = (event.point.precision, event.point.layout, event.point.batch_size)
            assert key not in records, f"two points share {key}: key the records by the axis that differs"
            records[key] = event.record

    Runner(cfg, device, make_probe(cfg, device)).run(cfg.points_list(), collect)
    return records


@pytest.fixture(scope="module")
def measured() -> Records:
    cfg = tiny_config(sweep={"layout": LAYOUTS, "batch_size": [2], "seq_len": [128], "precision": ["fp32"]})
    return run_points(cfg)


def peak(records: Records, layout: str) -> int:
    rec = records[("fp32", layout, 2)]
    assert rec.status == "ok", rec.reason
    assert rec.peak_allocated_bytes is not None
    return rec.peak_allocated_bytes


def test_full_checkpointing_lowers_the_peak(measured: Records) -> None:
    assert peak(measured, "all") < peak(measured, "first:4") < peak(measured, "none")


def test_which_layers_are_checkpointed_changes_the_peak(measured: Records) -> None:
    # Unchecked late layers are freed early in the backward pass; checkpointed late layers are
    # recomputed while every early layer's activations are still held.
    assert peak(measured, "first:4") < peak(measured, "last:4")


def test_granularity_changes_the_peak(measured: Records) -> None:
    assert peak(measured, "all@attn") != peak(measured, "all@mlp")
    assert peak(measured, "all") < peak(measured, "all@mlp") < peak(measured, "none")


def test_static_memory_is_exact_and_identical_across_layouts(measured: Records) -> None:
    model_params = 1_673_344  # tiny preset: 8 x (4*128*128 + 3*128*352 + 2*128) + 2*256*128 + 128
    mems = [rec.memory for rec in measured.values()]
    for mem in mems:
        assert mem.params_bytes == model_params * 4
        assert mem.grads_bytes == model_params * 4
        assert mem.optimizer_state_bytes is not None
        assert mem.optimizer_state_bytes >= 2 * model_params * 4  # exp_avg + exp_avg_sq (+ step scalars)
        assert not mem.leaked
    assert len({(m.params_bytes, m.optimizer_state_bytes) for m in mems}) == 1


def test_losses_match_the_unchecked_layout(measured: Records) -> None:
    ref = measured[("fp32", "none", 2)].losses
    for (_, layout, _), rec in measured.items():
        assert rec.loss_check is not None and rec.loss_check.match is True, layout
        assert rec.losses == pytest.approx(ref, rel=1e-5)
        assert len(rec.step_times_s) == 2 and all(t > 0 for t in rec.step_times_s)


def test_out_of_memory_is_a_row_and_larger_batches_are_skipped(measured: Records) -> None:
    # Cap between the 'all' and 'none' peaks: 'none' runs out, 'all' fits.
    cap = (peak(measured, "all") + peak(measured, "none")) / 2
    cfg = tiny_config(
        memory_cap_gib=cap / 2**30,
        sweep={"layout": ["none", "all"], "batch_size": [2, 4], "seq_len": [128], "precision": ["fp32"]},
    )
    records = run_points(cfg)
    none, all_ = records[("fp32", "none", 2)], records[("fp32", "all", 2)]
    assert none.status == "oom"
    assert none.reason is not None and "tried to allocate" in none.reason
    assert records[("fp32", "none", 4)].status == "skipped"
    assert all_.status == "ok"
    assert all_.peak_allocated_bytes == peak(measured, "all")
    # After the OOM the memory is back at its baseline: nothing leaked into the next point.
    assert none.memory.leaked is False
    assert all_.memory.baseline_allocated_bytes == none.memory.baseline_allocated_bytes


def test_bf16_and_amp_run_and_store_state_in_the_right_dtype() -> None:
    cfg = tiny_config(sweep={"layout": ["none", "all"], "batch_size": [1], "seq_len": [64],
                             "precision": ["bf16", "amp_bf16"]})
    records = run_points(cfg)
    assert sorted(records) == [(p, lay, 1) for p in ("amp_bf16", "bf16") for lay in ("all", "none")]
    params = 1_673_344
    for (precision, layout, _), rec in records.items():
        assert rec.status == "ok", rec.reason
        assert rec.key["precision"] == precision and rec.key["layout"] == layout
        # Pure bf16 stores weights, gradients and AdamW state in bf16; amp_bf16 keeps fp32 masters.
        size = 2 if precision == "bf16" else 4
        mem = rec.memory
        assert mem.params_bytes == mem.grads_bytes == params * size, precision
        assert mem.optimizer_state_bytes is not None, precision
        assert 2 * params * size <= mem.optimizer_state_bytes < 2 * params * size + 4096, precision
        assert rec.loss_check is not None and rec.loss_check.match is True, rec.loss_check


def test_cuda_requested_without_gpu_is_a_clear_error() -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    from ckptbench.errors import MachineError

    with pytest.raises(MachineError, match="ckptbench estimate"):
        resolve_device(tiny_config(device="cuda"))
