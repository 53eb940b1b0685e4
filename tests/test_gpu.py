"""GPU checks (CUDA allocator statistics); skipped without a CUDA device. Run by scripts/gpu_check.sh."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.conftest import tiny_config
from tests.test_runner import run_points

pytestmark = pytest.mark.gpu

# Wide layers, small vocabulary: each layer's activations outweigh the logits, so the layer choice shows.
SMALL_GPU = {"preset": "small", "overrides": {"hidden_size": 1024, "intermediate_size": 2752,
                                              "num_attention_heads": 8, "num_key_value_heads": 8}}


def gpu_config(**overrides: Any) -> Any:
    return tiny_config(**{"device": "cuda", "model": SMALL_GPU, "measured_steps": 3, "warmup_steps": 2, **overrides})


def test_cuda_peaks_follow_the_layout() -> None:
    recs = run_points(gpu_config(sweep={"layout": ["none", "all", "first:4", "last:4"], "batch_size": [8],
                                        "seq_len": [1024], "precision": ["bf16"]}))
    peak = {k[0]: r.peak_allocated_bytes for k, r in recs.items()}
    assert all(r.status == "ok" for r in recs.values())
    assert peak["all"] < peak["first:4"] < peak["none"]
    assert peak["first:4"] < peak["last:4"]
    for rec in recs.values():
        assert rec.peak_reserved_bytes >= rec.peak_allocated_bytes
        assert rec.loss_check.match is True, rec.loss_check
        assert rec.memory.leaked is False


def test_cuda_oom_is_a_row_and_memory_is_released() -> None:
    recs = run_points(gpu_config(memory_cap_gib=4.0, sweep={"layout": ["none", "all"], "batch_size": [1, 64],
                                                           "seq_len": [2048], "precision": ["bf16"]}))
    assert recs[("none", 64)].status == "oom"
    assert "out of memory" in recs[("none", 64)].reason.lower()
    assert recs[("none", 1)].status == "ok"
    baseline = recs[("none", 1)].memory.baseline_allocated_bytes
    assert recs[("all", 1)].memory.baseline_allocated_bytes == baseline


def test_cuda_offload_and_selective() -> None:
    cfg = gpu_config(sweep={"layout": ["none", "all", "all@selective"], "batch_size": [8], "seq_len": [1024],
                            "precision": ["bf16"], "offload": ["none", "all", "ckpt_inputs"]})
    recs: dict[tuple[str, str], dict[str, Any]] = {}

    def collect(event: Any) -> None:
        if event.record is not None:
            recs[(event.point.layout, event.point.offload)] = event.record

    from ckptbench.measure.device import make_probe, resolve_device
    from ckptbench.measure.runner import Runner

    device = resolve_device(cfg)
    Runner(cfg, device, make_probe(cfg, device)).run(cfg.points_list(), collect)
    assert all(r.status == "ok" for r in recs.values()), {k: r.reason for k, r in recs.items()}
    peak = {k: r.peak_allocated_bytes for k, r in recs.items()}
    assert peak[("none", "all")] < peak[("none", "none")]
    assert recs[("none", "all")].host_offload_peak_bytes > 0
    # Only the checkpointed layers' inputs go to the host: 8 layers x 8 x 1024 tokens x 1024 x bf16. (The
    # device peak need not drop: reentrant recomputation has no early stop, and with every layer
    # checkpointed the peak sits late in the backward pass, when those inputs are mostly freed.)
    inputs = 8 * 8 * 1024 * 1024 * 2
    assert inputs <= recs[("all", "ckpt_inputs")].host_offload_peak_bytes < 2 * inputs
    assert peak[("all", "none")] < peak[("all@selective", "none")] < peak[("none", "none")]
    for rec in recs.values():
        assert rec.loss_check.match is True, rec.loss_check


def test_cuda_compile_records_compile_time_apart() -> None:
    cfg = gpu_config(model={"preset": "tiny"}, sweep={"layout": ["none", "all"], "batch_size": [2],
                                                      "seq_len": [256], "precision": ["bf16"], "compile": [True]})
    recs = run_points(cfg)
    for rec in recs.values():
        assert rec.status == "ok", rec.reason
        assert rec.compile_s > max(rec.step_times_s)
    assert torch.cuda.memory_allocated() < 2**30
