"""ckptbench estimate: predictions from fake-tensor traces against measured CPU peaks, fast path
against full traces, breakdowns, budgets, the CUDA kernel model, and the CLI."""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ckptbench.bench.device import make_probe, resolve_device
from ckptbench.bench.runner import Progress, Runner
from ckptbench.cli import app
from ckptbench.config.load import load_config, parse_config
from ckptbench.config.schema import SweepConfig
from ckptbench.estimate.api import Estimate, Estimator, estimate_config, estimate_points, predict_points
from ckptbench.estimate.device_model import CudaKernels
from ckptbench.estimate.record import CATEGORIES
from tests.conftest import tiny_config

FIXTURES = Path(__file__).parent / "fixtures"
GIB, MIB = 2**30, 2**20

# Measured on CPU by the live-tensor tracker, through the same Runner as `ckptbench sweep`.
MEASURED_CASES: dict[str, tuple[list[str], list[int]]] = {
    "fp32": (["none", "all", "last:4", "all@attn+mlp"], [1, 2]),
    "bf16": (["none", "first:4", "all@mlp"], [2]),
    "amp_bf16": (["none", "all"], [2]),
}


def _cfg(precision: str) -> SweepConfig:
    layouts, batches = MEASURED_CASES[precision]
    return tiny_config(sweep={"layout": layouts, "batch_size": batches, "seq_len": [64], "precision": [precision]})


@pytest.fixture(scope="module")
def measured() -> dict[str, tuple[dict[str, dict[str, Any]], list[Estimate]]]:
    """Per precision: the runner's records by point key, and the CPU-target predictions."""
    out = {}
    for precision in MEASURED_CASES:
        cfg = _cfg(precision)
        device = resolve_device(cfg)
        records: dict[str, dict[str, Any]] = {}

        def collect(event: Progress, records: dict[str, dict[str, Any]] = records) -> None:
            if event.record is not None:
                records[event.point.key_id] = event.record.to_json()

        Runner(cfg, device, make_probe(cfg, device)).run(cfg.points_list(), collect)
        out[precision] = (records, estimate_points(cfg, cfg.points_list(), target="cpu"))
    return out


@pytest.mark.parametrize("precision", list(MEASURED_CASES))
def test_cpu_predictions_match_measured_peaks(measured: dict, precision: str) -> None:
    records, estimates = measured[precision]
    assert len(estimates) == len(records) == len(_cfg(precision).points_list())
    for est in estimates:
        rec = records[est.point.key_id]
        assert rec["status"] == "ok", rec["reason"]
        error = abs(est.peak_bytes - rec["peak_allocated_bytes"]) / rec["peak_allocated_bytes"]
        assert error < 0.02, (est.point.layout, est.point.batch_size, est.peak_bytes, rec["peak_allocated_bytes"])


@pytest.mark.parametrize("precision", list(MEASURED_CASES))
def test_predicted_layout_ranking_matches_measured(measured: dict, precision: str) -> None:
    records, estimates = measured[precision]
    by_pred = sorted(estimates, key=lambda e: (e.peak_bytes, e.point.key_id))
    by_meas = sorted(estimates, key=lambda e: (records[e.point.key_id]["peak_allocated_bytes"], e.point.key_id))
    assert [e.point for e in by_pred] == [e.point for e in by_meas]


def test_static_parts_equal_the_real_tensors(measured: dict) -> None:
    for records, estimates in measured.values():
        for est in estimates:
            memory = records[est.point.key_id]["memory"]
            assert est.static == {k: memory[k] for k in ("params_bytes", "grads_bytes", "optimizer_state_bytes")}
            # the parameters and optimizer state are live throughout, so the peak holds all of them
            assert est.breakdown["params"] == memory["params_bytes"]
            assert est.breakdown["optimizer_state"] == memory["optimizer_state_bytes"]


def test_breakdown_sums_to_the_prediction(measured: dict) -> None:
    for _, estimates in measured.values():
        for est in estimates:
            assert list(est.breakdown) == list(CATEGORIES)
            assert sum(est.breakdown.values()) == est.peak_bytes
            assert min(est.breakdown.values()) >= 0


FAST_FULL_LAYOUTS = ["none", "all", "every:2", "last:3", "all@attn", "layers:1,4@mlp", "all@attn+mlp", "all@selective"]


def test_fast_path_equals_full_trace_tiny() -> None:
    sweep = {"layout": FAST_FULL_LAYOUTS, "batch_size": [2], "seq_len": [64], "precision": ["bf16"]}
    fast = _assert_fast_equals_full(tiny_config(device="cuda", sweep=sweep), "cuda")
    assert len({e.peak_bytes for e in fast}) >= len(FAST_FULL_LAYOUTS) - 1  # the layouts really differ


@pytest.mark.parametrize(
    "axes",
    [
        {"precision": ["amp_bf16"], "micro_batches": [2]},
        {"precision": ["fp32"], "optimizer": ["adamw_foreach"], "attn_implementation": ["eager"]},
    ],
    ids=["amp-microbatches", "foreach-eager"],
)
def test_fast_path_equals_full_trace_other_axes(axes: dict[str, Any]) -> None:
    sweep = {"layout": ["none", "first:3@mlp", "last:2@attn"], "batch_size": [2], "seq_len": [32], **axes}
    fast = _assert_fast_equals_full(tiny_config(sweep=sweep), "cpu")
    if "adamw_foreach" in axes.get("optimizer", []):
        # foreach AdamW holds a full copy of the state while it steps: at this size that is the peak
        assert {e.peak_at for e in fast} == {"optimizer step"}


def test_fast_path_equals_full_trace_llama7b_widths() -> None:
    """A mid-size model: LLaMA-7B's widths and vocabulary with 4 layers, CUDA kernel model."""
    cfg = parse_config(
        {
            "name": "mid",
            "model": {"preset": "llama-7b", "overrides": {"num_hidden_layers": 4}},
            "sweep": {
                "layout": ["none", "all", "every:2", "last:1", "first:2@attn+mlp"],
                "batch_size": [4],
                "seq_len": [1024],
                "precision": ["bf16"],
            },
        }
    )
    fast = _assert_fast_equals_full(cfg, "cuda")
    assert len({e.peak_bytes for e in fast}) == 5


def _assert_fast_equals_full(cfg: SweepConfig, target: str) -> list[Estimate]:
    points = cfg.points_list()
    fast = estimate_points(cfg, points, target=target)  # type: ignore[arg-type]
    full = estimate_points(cfg, points, target=target, method="full")  # type: ignore[arg-type]
    for a, b in zip(fast, full, strict=True):
        assert (a.point.layout, a.peak_bytes, a.peak_at) == (b.point.layout, b.peak_bytes, b.peak_at)
        assert a.breakdown == b.breakdown
    return fast


def test_checkpointing_late_layers_peaks_higher_than_early_ones() -> None:
    sweep = {"layout": ["first:4", "last:4"], "batch_size": [2], "seq_len": [64], "precision": ["bf16"]}
    cfg = tiny_config(sweep=sweep)
    first, last = estimate_points(cfg, cfg.points_list(), target="cpu")
    # Unchecked late layers are freed early in the backward; checkpointed late layers are recomputed
    # while every early layer's activations are still held.
    assert first.peak_bytes < last.peak_bytes
    assert last.peak_at == "backward of layer 4"


def test_llama7b_fp32_adamw_does_not_fit_80gib_and_says_why() -> None:
    cfg = parse_config(
        {
            "name": "big",
            "model": {"preset": "llama-7b"},
            "memory_cap_gib": 80,
            "optimizer": "adamw_fused",
            "sweep": {"layout": ["all"], "batch_size": [1], "seq_len": [2048], "precision": ["fp32"]},
        }
    )
    (est,) = estimate_config(cfg)
    assert est.target == "cuda" and est.budget_bytes == 80 * GIB
    assert est.fits is False
    assert est.static["params_bytes"] == 6_738_415_616 * 4  # LLaMA-7B: 6.74 B fp32 parameters
    assert est.static["optimizer_state_bytes"] >= 2 * est.static["params_bytes"]
    assert est.dominant == "optimizer_state"
    assert est.reason is not None and est.reason.startswith("needs 100.")
    assert "largest part: optimizer state 50.2" in est.reason


def test_llama7b_grid_is_fast_and_traces_one_short_model_per_shape() -> None:
    cfg = load_config("configs/llama7b.yaml")
    points = cfg.points_list()
    est = Estimator(cfg)
    jobs = est.jobs(points)
    shapes = {(p.precision, p.seq_len, p.batch_size) for p in points}
    assert len(points) == 66 and len(jobs) == len(shapes) + 1  # + the optimizer step of the whole model
    started = time.perf_counter()
    for _, job in jobs:
        job()
    estimates = [est.estimate(p) for p in points]
    assert time.perf_counter() - started < 60
    peaks = {(e.point.layout, e.point.batch_size, e.point.seq_len): e.peak_bytes for e in estimates}
    assert peaks[("first:16", 4, 2048)] < peaks[("last:16", 4, 2048)]
    assert peaks[("all", 16, 2048)] < peaks[("every:2", 16, 2048)] < peaks[("none", 16, 2048)]
    for batch in (2, 4, 8, 16):
        assert peaks[("none", batch // 2, 2048)] < peaks[("none", batch, 2048)]


H200_CHECK = Path(__file__).parents[1] / "results" / "h200-gpu-check-1" / "check"


@pytest.mark.skipif(not (H200_CHECK / "points.jsonl").exists(), reason="no H200 results in this checkout")
def test_predictions_match_the_h200_measurements_within_1_percent() -> None:
    """LLaMA-7B bf16, fused AdamW, sdpa, 11 layouts at batch 2 and 6 at batch 8, measured on an H200."""
    result = runner.invoke(app, ["estimate", str(H200_CHECK), "--format", "json"])  # a run directory
    assert result.exit_code == 0, result.output
    records = json.loads(result.stdout)
    measured = [r for r in records if r["measured_status"] == "ok"]
    assert len(records) == 17 and len(measured) == 16
    assert next(r for r in records if r["measured_status"] != "ok")["measured_status"] == "oom"
    for rec in measured:
        assert rec["target"] == "cuda"
        assert abs(rec["relative_error"]) < 0.01, (rec["key"], rec["relative_error"])


def test_forgotten_host_copies_stay_uncounted_through_in_place_ops() -> None:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ckptbench.estimate.device_model import CpuKernels
    from ckptbench.estimate.tracker import StepTracker

    tracker = StepTracker(CpuKernels())
    with FakeTensorMode(), tracker:
        host = torch.empty(1024)
        tracker.forget(host)  # e.g. an offloaded activation's host copy
        source = torch.ones(1024)
        host.copy_(source)  # returns ``host`` itself
        assert tracker.live == 1024 * 4  # only the source is device memory
        del source
        assert tracker.live == 0


def test_predict_points_maps_key_ids_to_bytes() -> None:
    cfg = tiny_config(device="cuda", sweep={"layout": ["none", "all"], "batch_size": [2], "seq_len": [128]})
    predictions = predict_points(cfg, cfg.points_list())
    assert set(predictions) == {p.key_id for p in cfg.points_list()}
    by_layout = {p.layout: predictions[p.key_id] for p in cfg.points_list()}
    assert by_layout["all"] < by_layout["none"]


def test_unavailable_optimizer_is_reported_not_estimated() -> None:
    if importlib.util.find_spec("bitsandbytes") is not None:
        pytest.skip("bitsandbytes is installed")
    sweep = {"layout": ["all"], "batch_size": [1], "seq_len": [32], "optimizer": ["adamw_8bit"]}
    cfg = tiny_config(device="cuda", sweep=sweep)
    (est,) = estimate_points(cfg, cfg.points_list())
    assert est.peak_bytes is None and est.fits is None
    assert est.note is not None and est.note.startswith("not estimated: bitsandbytes")


# -- the CUDA kernel model ------------------------------------------------------------------------


def test_cuda_allocator_block_sizes() -> None:
    k = CudaKernels()
    assert [k.block_bytes(n) for n in (0, 1, 512, 513)] == [0, 512, 512, 1024]
    assert k.block_bytes(16 * MIB) == 16 * MIB
    assert k.block_bytes(43 * MIB) == 44 * MIB  # 2 MiB segment, 1 MiB left over: not split
    assert k.block_bytes(43 * MIB + 4096) == 44 * MIB
    assert k.block_bytes(41 * MIB - 4096) == 41 * MIB - 4096  # more than 1 MiB left: split
    assert k.block_bytes(9 * MIB + 1) == 9 * MIB + 512  # from a 20 MiB segment, split


def test_cuda_attention_and_embedding_backward_scratch() -> None:
    import torch

    k = CudaKernels()
    q = torch.empty((2, 32, 2000, 128), device="meta", dtype=torch.bfloat16)
    flash_bwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default
    # fp32 dQ accumulator (B x S rounded to 128 x H x D) + fp32 softmax-dO sum (B x H x S rounded)
    assert k.workspace_bytes(flash_bwd, (None, q, q), None) == 2 * 2048 * 32 * 128 * 4 + 2 * 32 * 2048 * 4
    grad = torch.empty((4096, 4096), device="meta", dtype=torch.bfloat16)
    emb_bwd = torch.ops.aten.embedding_dense_backward.default
    few = torch.empty((1, 2048), device="meta", dtype=torch.long)
    many = torch.empty((2, 2048), device="meta", dtype=torch.long)
    assert k.workspace_bytes(emb_bwd, (grad, few, 32000, -1, False), None) == 0  # <= 3072 tokens: atomics
    partials = 4096 // 10 + 4096
    assert k.workspace_bytes(emb_bwd, (grad, many, 32000, -1, False), None) >= partials * 4096 * 4


# -- CLI ------------------------------------------------------------------------------------------

runner = CliRunner()
TINY = str(FIXTURES / "estimate_tiny.yaml")


def test_cli_json_is_a_list_of_labelled_estimates() -> None:
    result = runner.invoke(app, ["estimate", TINY, "--format", "json"])
    assert result.exit_code == 0, result.output
    records = json.loads(result.stdout)
    assert [r["key"]["layout"] for r in records] == ["none", "all", "last:4"]
    for rec in records:
        assert rec["estimate"] is True and rec["target"] == "cpu"
        assert sum(rec["breakdown"].values()) == rec["predicted_peak_allocated_bytes"]
    # the config's memory cap (29.7 MiB) is the budget: no checkpointing does not fit at batch 2
    assert [r["fits"] for r in records] == [False, True, True]
    assert "largest part: optimizer state" in records[0]["reason"]


def test_cli_budget_overrides_the_cap_and_target_cuda_rounds_up() -> None:
    cpu = json.loads(runner.invoke(app, ["estimate", TINY, "--format", "json", "--budget", "1GiB"]).stdout)
    cuda = json.loads(runner.invoke(app, ["estimate", TINY, "--format", "json", "--target", "cuda"]).stdout)
    assert all(r["fits"] for r in cpu) and cpu[0]["budget_bytes"] == GIB
    # 512-byte blocks and the cuBLAS workspaces make every CUDA prediction larger
    for gpu, host in zip(cuda, cpu, strict=True):
        assert gpu["predicted_peak_allocated_bytes"] > host["predicted_peak_allocated_bytes"]


def test_cli_csv_names_every_number_as_predicted() -> None:
    result = runner.invoke(app, ["estimate", TINY, "--format", "csv"])
    assert result.exit_code == 0, result.output
    header, *rows = result.stdout.splitlines()
    columns = header.split(",")
    assert len(rows) == 3
    numbers = [c for c in columns if c.endswith("_bytes") and c != "budget_bytes"]
    assert numbers and all(c.startswith("predicted_") for c in numbers)


def test_cli_table_says_estimate_and_shows_the_fit() -> None:
    result = runner.invoke(app, ["estimate", TINY])
    assert result.exit_code == 0, result.output
    assert "all numbers estimated" in result.stdout and "est. peak" in result.stdout
    line = next(row for row in result.stdout.splitlines() if "│ none " in row)
    assert "no (optimizer state)" in line
    assert "estimate" in result.stderr  # the progress bar


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--target", "tpu"], "--target: 'tpu' is not one of cuda, cpu"),
        (["--budget", "lots"], "--budget: 'lots' is not a memory size"),
    ],
)
def test_cli_bad_input_is_exit_2(args: list[str], message: str) -> None:
    result = runner.invoke(app, ["estimate", TINY, *args])
    assert result.exit_code == 2
    assert message in result.stderr


def test_point_key_fields_all_reach_the_json() -> None:
    axes = {"layout": ["all"], "batch_size": [1], "seq_len": [32], "precision": ["fp32"], "micro_batches": [2]}
    cfg = tiny_config(sweep=axes)
    (est,) = estimate_points(cfg, cfg.points_list(), target="cpu")
    record = json.loads(json.dumps(est.to_record()))  # as written to and read from disk
    assert record["key"] == {
        "model": "tiny", "layout": "all", "batch_size": 1, "seq_len": 32, "precision": "fp32",
        "optimizer": "adamw_fused", "micro_batches": 2, "offload": "none", "lora": "none", "compile": False,
        "attn_implementation": "sdpa",
    }
