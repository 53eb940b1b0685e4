"""GPU checks (CUDA allocator statistics); skipped without a CUDA device. Run by scripts/gpu_check.sh."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from ckptbench.config.schema import SweepConfig
from ckptbench.measure.progress import Progress
from ckptbench.results.record import PointRecord
from tests._known import known
from tests.conftest import tiny_config
from tests.test_runner import run_points

pytestmark = pytest.mark.gpu

# Wide layers, small vocabulary: each layer's activations outweigh the logits, so the layer choice shows.
SMALL_GPU = {"preset": "small", "overrides": {"hidden_size": 1024, "intermediate_size": 2752,
                                              "num_attention_heads": 8, "num_key_value_heads": 8}}


def gpu_config(**overrides: Any) -> SweepConfig:
    return tiny_config(**{"device": "cuda", "model": SMALL_GPU, "measured_steps": 3, "warmup_steps": 2, **overrides})


def test_cuda_peaks_follow_the_layout() -> None:
    recs = run_points(gpu_config(sweep={"layout": ["none", "all", "first:4", "last:4"], "batch_size": [8],
                                        "seq_len": [1024], "precision": ["bf16"]}))
    assert all(r.status == "ok" for r in recs.values())
    peak = {layout: known(r.peak_allocated_bytes) for (_, layout, _), r in recs.items()}
    assert peak["all"] < peak["first:4"] < peak["none"]
    assert peak["first:4"] < peak["last:4"]
    for rec in recs.values():
        assert known(rec.peak_reserved_bytes) >= known(rec.peak_allocated_bytes)
        assert known(rec.loss_check).match is True, rec.loss_check
        assert rec.memory.leaked is False


def test_cuda_oom_is_a_row_and_memory_is_released() -> None:
    recs = run_points(gpu_config(memory_cap_gib=4.0, sweep={"layout": ["none", "all"], "batch_size": [1, 64],
                                                           "seq_len": [2048], "precision": ["bf16"]}))
    assert recs[("bf16", "none", 64)].status == "oom"
    assert "out of memory" in known(recs[("bf16", "none", 64)].reason).lower()
    assert recs[("bf16", "none", 1)].status == "ok"
    baseline = recs[("bf16", "none", 1)].memory.baseline_allocated_bytes
    assert recs[("bf16", "all", 1)].memory.baseline_allocated_bytes == baseline


def test_cuda_offload_and_selective() -> None:
    cfg = gpu_config(sweep={"layout": ["none", "all", "all@selective"], "batch_size": [8], "seq_len": [1024],
                            "precision": ["bf16"], "offload": ["none", "all", "ckpt_inputs"]})
    recs: dict[tuple[str, str], PointRecord] = {}

    def collect(event: Progress) -> None:
        if event.record is not None:
            recs[(event.point.layout, event.point.offload)] = event.record

    from ckptbench.measure.device import make_probe, resolve_device
    from ckptbench.measure.runner import Runner

    device = resolve_device(cfg)
    Runner(cfg, device, make_probe(cfg, device)).run(cfg.points_list(), collect)
    assert all(r.status == "ok" for r in recs.values()), {k: r.reason for k, r in recs.items()}
    peak = {k: known(r.peak_allocated_bytes) for k, r in recs.items()}
    assert peak[("none", "all")] < peak[("none", "none")]
    assert known(recs[("none", "all")].host_offload_peak_bytes) > 0
    # Only the checkpointed layers' inputs go to the host: 8 layers x 8 x 1024 tokens x 1024 x bf16. (The
    # device peak need not drop: reentrant recomputation has no early stop, and with every layer
    # checkpointed the peak sits late in the backward pass, when those inputs are mostly freed.)
    inputs = 8 * 8 * 1024 * 1024 * 2
    assert inputs <= known(recs[("all", "ckpt_inputs")].host_offload_peak_bytes) < 2 * inputs
    assert peak[("all", "none")] < peak[("all@selective", "none")] < peak[("none", "none")]
    for rec in recs.values():
        assert known(rec.loss_check).match is True, rec.loss_check


def test_cuda_compile_records_compile_time_apart() -> None:
    cfg = gpu_config(model={"preset": "tiny"}, sweep={"layout": ["none", "all"], "batch_size": [2],
                                                      "seq_len": [256], "precision": ["bf16"], "compile": [True]})
    recs = run_points(cfg)
    for rec in recs.values():
        assert rec.status == "ok", rec.reason
        assert known(rec.compile_s) > max(rec.step_times_s)
    assert torch.cuda.memory_allocated() < 2**30
