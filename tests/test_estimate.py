"""ckptbench estimate: predictions from fake-tensor traces against measured CPU peaks, fast path
against full traces, breakdowns, budgets, the CUDA kernel model, and the CLI."""

from __future__ import annotations

import importlib.util
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from ckptbench.cli.main import app
from ckptbench.config.grid import Point, key_id
from ckptbench.config.load import load_config, parse_config
from ckptbench.config.schema import SweepConfig
from ckptbench.estimator.device_model import CudaKernels
from ckptbench.estimator.estimator import Estimate, Estimator, estimate_config, estimate_points, iter_predictions
from ckptbench.estimator.record import CATEGORIES
from ckptbench.measure.device import make_probe, resolve_device
from ckptbench.measure.progress import Progress
from ckptbench.measure.runner import Runner
from ckptbench.results.inputs import load_input
from ckptbench.results.meta import RunMeta
from ckptbench.results.record import PointRecord
from ckptbench.results.store import RunWriter, load_run
from tests._known import known
from tests.conftest import tiny_config

# Estimates of one config are made once per process and shared (tests/_est_shared.py).
pytestmark = [pytest.mark.usefixtures("shared_estimates"), pytest.mark.trace_cache]  # traces shared on disk

FIXTURES = Path(__file__).parent / "fixtures"
GIB, MIB, KIB = 2**30, 2**20, 2**10

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
def test_cpu_predictions_equal_measured_peaks(measured: dict, precision: str) -> None:
    """Byte for byte: the estimator and the CPU probe count with the same LiveStorageCounter."""
    records, estimates = measured[precision]
    assert len(estimates) == len(records) == len(_cfg(precision).points_list())
    for est in estimates:
        assert records[est.point.key_id]["status"] == "ok", records[est.point.key_id]["reason"]
    predicted = {(e.point.layout, e.point.batch_size): e.peak_bytes for e in estimates}
    peaks = {(e.point.layout, e.point.batch_size): records[e.point.key_id]["peak_allocated_bytes"] for e in estimates}
    assert predicted == peaks


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
    assert known(first.peak_bytes) < known(last.peak_bytes)
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
    # The caching-allocator replay runs out under the 80 GiB cap when the first optimizer step creates
    # the fp32 state (64 MiB per 4096 x 4096 weight), with parameters and gradients (50.2 GiB) held.
    assert est.reserved is not None and est.reserved.oom is not None
    assert est.reason is not None
    assert est.reason.startswith("runs out of memory in warm-up step 1 (optimizer step) allocating 64.00 MiB")
    assert "largest part: optimizer state 50.2" in est.reason
    assert est.peak_bytes is not None and est.peak_bytes > 100 * GIB  # the byte model's peak allocated


def test_llama7b_grid_is_fast_and_traces_one_short_model_per_shape() -> None:
    cfg = load_config("configs/llama7b.yaml")
    points = cfg.points_list()
    est = Estimator(cfg, cache=None)  # what it traces, whatever another test of the run left on disk
    jobs = est.jobs(points)
    shapes = {(p.precision, p.seq_len, p.batch_size) for p in points}
    assert len(points) == 66 and len(jobs) == len(shapes) + 1  # + the optimizer step of the whole model
    started = time.perf_counter()
    for _, job in jobs:
        job()
    estimates = [est.estimate(p) for p in points]
    assert time.perf_counter() - started < 60
    by_point = {(e.point.layout, e.point.batch_size, e.point.seq_len): e for e in estimates}

    def peak(layout: str, batch_size: int) -> int:
        return known(by_point[(layout, batch_size, 2048)].peak_bytes)

    assert peak("first:16", 4) < peak("last:16", 4)
    assert peak("all", 16) < peak("every:2", 16) < peak("none", 16)
    for batch in (2, 4, 8, 16):
        assert peak("none", batch // 2) < peak("none", batch)


# -- the committed H200 runs ----------------------------------------------------------------------

RESULTS = Path(__file__).parents[1] / "results"
# Every committed H200 run with the accuracy claimed for its predictions: the largest |error| as a
# fraction of the measured peak, and in bytes (None: no claim in bytes).
H200_CLAIMS: dict[str, tuple[float, int | None]] = {
    # README.md: "largest error 0.0001%"; estimate_vs_measured.md: "about 32 KiB of 50-120 GiB"
    "h200-gpu-check-1/check": (1e-6, 32 * KIB),
    "h200-gpu-check-1/axes": (1e-6, 32 * KIB),
    # results/README.md: "every prediction within 0.01%"
    "h200-gpu-check-2/check": (1e-4, None),
}


def _not_compared(point: Point, measured: int | str | None) -> str | None:
    """Why a committed point cannot be set against its prediction, or None when it can."""
    if not isinstance(measured, int):
        return f"measured status {measured or 'missing'}: no measured peak to compare"
    if point.compile:
        return "torch.compile is not modelled: the eager step is estimated"
    if point.optimizer == "adamw_8bit" and importlib.util.find_spec("bitsandbytes") is None:
        return "bitsandbytes is not installed: 8-bit AdamW is not estimated"
    return None


def _point_id(point: Point, reference: Point) -> str:
    """'all@attn-b2', plus each other key field that differs from the run's first point."""
    extra = [f"{k}={v}" for k, v in point.key.items() if k not in ("layout", "batch_size") and v != reference.key[k]]
    return "-".join([point.layout, f"b{point.batch_size}", *extra])


def _h200_points() -> list[Any]:
    """One test parameter per point of every committed H200 run: (run, key_id, measured peak)."""
    params = []
    for run in H200_CLAIMS:
        if not (RESULTS / run / "points.jsonl").exists():
            params.append(pytest.param(run, "", 0, marks=pytest.mark.skip(reason=f"{run} is not in this checkout")))
            continue
        cfg, measured = load_input(RESULTS / run)
        points = cfg.points_list()
        for point in points:
            peak = measured.get(point.key_id)
            reason = _not_compared(point, peak)
            marks = [pytest.mark.skip(reason=reason)] if reason else []
            params.append(pytest.param(run, point.key_id, peak, marks=marks, id=f"{run}:{_point_id(point, points[0])}"))
    return params


@pytest.fixture(scope="module")
def h200_estimates(shared_estimates: None) -> Callable[[str], dict[str, Estimate]]:
    """Predictions for a committed run's points by key_id, computed once per distinct config."""
    by_config: dict[str, dict[str, Estimate]] = {}

    def of_run(run: str) -> dict[str, Estimate]:
        cfg, _ = load_input(RESULTS / run)
        config = cfg.model_dump_json(exclude={"name"})  # runs of one config share their predictions
        if config not in by_config:
            by_config[config] = {e.point.key_id: e for e in estimate_config(cfg)}
        return by_config[config]

    return of_run


@pytest.mark.parametrize(("run", "key", "measured_bytes"), _h200_points())
def test_prediction_matches_the_h200_measurement(
    h200_estimates: Callable[[str], dict[str, Estimate]], run: str, key: str, measured_bytes: int
) -> None:
    """LLaMA-7B bf16 on an H200: the check grid and the technique axes, within the accuracy claimed."""
    est = h200_estimates(run)[key]
    assert est.target == "cuda" and est.method == "fast"
    assert est.peak_bytes is not None, est.note
    rel_tol, abs_tol = H200_CLAIMS[run]
    error = est.peak_bytes - measured_bytes
    if est.point.optimizer == "adamw_8bit":
        # The trace has every 8-bit state tensor (their raw bytes are the measured state's: test_optimizer_8bit.py
        # holds them to the byte), but the byte model counts each storage over 10 MiB as a fresh segment rounded up
        # to 2 MiB (device_model.py): LLaMA-7B's 43 MiB uint8 MLP states (and 125 MiB embedding states) count 1 MiB
        # more each, 196 MiB in all, where the H200's first step carved most of them out of blocks the backward left
        # cached, exactly. The prediction errs high, by at most that rounding of the state (+179 MiB, 0.35%).
        (rec,) = [r for r in load_run(RESULTS / run).points if r.key_id == key]
        rounding = est.static["optimizer_state_bytes"] - known(rec.memory.optimizer_state_bytes)
        assert 0 < error <= rounding, f"{error / measured_bytes:+.6%} ({error} bytes, rounding {rounding})"
        return
    assert abs(error) <= rel_tol * measured_bytes, f"{error / measured_bytes:+.6%} ({error} bytes)"
    if abs_tol is not None:
        assert abs(error) <= abs_tol, f"{error} bytes"


def test_every_committed_h200_point_is_pinned_or_skipped_for_a_reason() -> None:
    if not all((RESULTS / run / "points.jsonl").exists() for run in H200_CLAIMS):
        pytest.skip("no H200 results in this checkout")
    params = _h200_points()
    recorded = {(run, rec.key_id) for run in H200_CLAIMS for rec in load_run(RESULTS / run).points}
    assert {(p.values[0], p.values[1]) for p in params} == recorded and len(params) == 17 + 15 + 17
    skipped = sorted(m.kwargs["reason"] for p in params for m in p.marks)
    expected = 2 * ["measured status oom: no measured peak to compare"]  # `none` at batch 8, in both checks
    if importlib.util.find_spec("bitsandbytes") is None:
        expected.append("bitsandbytes is not installed: 8-bit AdamW is not estimated")
    assert skipped == sorted(expected)


def test_forgotten_host_copies_stay_uncounted_through_in_place_ops() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ckptbench.estimator.device_model import CpuKernels
    from ckptbench.estimator.tracker import StepTracker

    tracker = StepTracker(CpuKernels())
    with FakeTensorMode(), tracker:
        host = torch.empty(1024)
        tracker.forget(host)  # e.g. an offloaded activation's host copy
        source = torch.ones(1024)
        host.copy_(source)  # returns ``host`` itself
        assert tracker.live == 1024 * 4  # only the source is device memory
        del source
        assert tracker.live == 0


def test_predictions_map_key_ids_to_bytes() -> None:
    cfg = tiny_config(device="cuda", sweep={"layout": ["none", "all"], "batch_size": [2], "seq_len": [128]})
    predictions = {k: p.predicted_peak_allocated_bytes for k, p in iter_predictions(cfg, cfg.points_list())}
    assert set(predictions) == {p.key_id for p in cfg.points_list()}
    by_layout = {p.layout: known(predictions[p.key_id]) for p in cfg.points_list()}
    assert by_layout["all"] < by_layout["none"]


@pytest.mark.usefixtures("no_bitsandbytes")
def test_unavailable_optimizer_is_reported_not_estimated() -> None:
    """Without bitsandbytes (hidden from the import where it is installed) an 8-bit AdamW point is not estimated,
    with a note naming the extra to install."""
    sweep = {"layout": ["all"], "batch_size": [1], "seq_len": [32], "optimizer": ["adamw_8bit"]}
    cfg = tiny_config(device="cuda", sweep=sweep)
    (est,) = estimate_points(cfg, cfg.points_list(), workers=1)
    assert est.peak_bytes is None and est.fits is None
    assert est.note == "not estimated: bitsandbytes is not installed (pip install 'ckptbench[8bit]')"


# -- the CUDA kernel model ------------------------------------------------------------------------


def test_cuda_allocator_block_sizes() -> None:
    k = CudaKernels()
    assert [k.block_bytes(n) for n in (0, 1, 512, 513)] == [0, 512, 512, 1024]
    assert k.block_bytes(16 * MIB) == 16 * MIB
    assert k.block_bytes(43 * MIB) == 44 * MIB  # 2 MiB segment, 1 MiB left over: not split
    assert k.block_bytes(43 * MIB + 4096) == 44 * MIB
    assert k.block_bytes(41 * MIB - 4096) == 41 * MIB - 4096  # more than 1 MiB left: split
    assert k.block_bytes(9 * MIB + 1) == 9 * MIB + 512  # from a 20 MiB segment, split


_FLASH_BWD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default
_EMBEDDING_BWD = torch.ops.aten.embedding_dense_backward.default
_SOFTMAX_BWD = torch.ops.aten._softmax_backward_data.default


def _meta(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.empty(shape, device="meta", dtype=dtype)


# Bytes worked out by hand from device_model.py's docstring: the FlashAttention-2 backward holds an
# fp32 dQ accumulator (B x S rounded up to 128 x H x D rounded up to 32) and an fp32 softmax-dO sum
# (B x H x S rounded up to 128), plus, when K/V have fewer heads (GQA), dK and dV for every query
# head (B x S_k x H x D in K's dtype); each a separate allocator block (512-byte multiples; above
# 10 MiB a 2 MiB-rounded segment, split when more than 1 MiB would remain).
@pytest.mark.parametrize(
    ("query", "key", "expected"),
    [
        # LLaMA-7B: 32 heads of 128, 2 x 2000 tokens. dQ: 2 x 2048 x 32 x 128 x 4 = 64 MiB (a whole
        # segment); softmax-dO sum: 2 x 32 x 2048 x 4 = 512 KiB.
        ((2, 32, 2000, 128), (2, 32, 2000, 128), 64 * MIB + 512 * KIB),
        # GQA, 32 query heads on 8 K/V heads: the same two buffers, plus dK and dV of 2 x 2000 x 32 x 128
        # x 2 bytes = 31.25 MiB each, in a 32 MiB segment (0.75 MiB left over: not split).
        ((2, 32, 2000, 128), (2, 8, 2000, 128), 64 * MIB + 512 * KIB + 2 * 32 * MIB),
        # head_dim 80 is padded to 96, 100 tokens to 128: dQ 1 x 128 x 4 x 96 x 4 = 196608 bytes
        # (384 blocks of 512), softmax-dO sum 1 x 4 x 128 x 4 = 2048 bytes; GQA 4 on 2: dK, dV of
        # 1 x 100 x 4 x 80 x 2 = 64000 bytes each, 125 blocks of 512.
        ((1, 4, 100, 80), (1, 2, 100, 80), 196608 + 2048 + 2 * 64000),
    ],
    ids=["llama7b", "gqa-32-on-8", "gqa-padded"],
)
def test_cuda_attention_backward_scratch(query: tuple[int, ...], key: tuple[int, ...], expected: int) -> None:
    q, k = _meta(*query), _meta(*key)
    assert CudaKernels().workspace_bytes(_FLASH_BWD, (None, q, k, k), None) == expected


def test_cuda_softmax_backward_holds_a_gradient_sized_temporary() -> None:
    """Eager attention's softmax backward: ``grad * output`` first, 2 x 32 x 2048 x 2048 bf16 = 512 MiB."""
    grad = _meta(2, 32, 2048, 2048)
    assert CudaKernels().workspace_bytes(_SOFTMAX_BWD, (grad, grad, -1, torch.bfloat16), None) == 512 * MIB


# embedding_dense_backward with more than 3072 tokens (or scale_grad_by_freq): int64 buffers of
# tokens (sorted indices), tokens (original positions), tokens (offsets), 2 x min(tokens, vocab)
# (segment offsets and sizes) and partials = tokens // 10 + min(tokens, vocab), two 8-byte counters,
# and fp32 partial sums of partials x hidden; each its own 512-byte-rounded block.
@pytest.mark.parametrize(
    ("tokens", "vocab", "hidden", "scale", "expected"),
    [
        (2048, 32000, 4096, False, 0),  # at most 3072 tokens: one atomic-add kernel, no scratch
        (3072, 32000, 4096, False, 0),
        # 3073 tokens: segments 3073, partials 307 + 3073 = 3380. int64: 24584 bytes -> 25088 (x 5),
        # 27040 -> 27136; counters 2 x 512; fp32 sums 3380 x 4096 x 4 = 55377920 (a 512 multiple; its
        # 54 MiB segment would leave 1.19 MiB, so the block is split off).
        (3073, 32000, 4096, False, 5 * 25088 + 27136 + 2 * 512 + 55377920),
        # LLaMA-7B at 2 x 2048: segments 4096, partials 409 + 4096 = 4505. int64: 32768 (x 5),
        # 36040 -> 36352; counters; fp32 sums 4505 x 4096 x 4 = 73809920 (72 MiB segment minus 1.61 MiB).
        (4096, 32000, 4096, False, 5 * 32768 + 36352 + 2 * 512 + 73809920),
        # a vocabulary smaller than the tokens: segments 256, partials 409 + 256 = 665. int64: 3 x 32768,
        # 2 x 2048, 5320 -> 5632; counters; fp32 sums 665 x 64 x 4 = 170240 -> 170496.
        (4096, 256, 64, False, 3 * 32768 + 2 * 2048 + 5632 + 2 * 512 + 170496),
        # scale_grad_by_freq takes the sorting path at any size: segments 100, partials 10 + 100 = 110.
        # int64: 800 -> 1024 (x 5), 880 -> 1024; counters; fp32 sums 110 x 64 x 4 = 28160 -> 28160.
        (100, 32000, 64, True, 6 * 1024 + 2 * 512 + 28160),
    ],
    ids=["2048-tokens", "3072-tokens", "3073-tokens", "llama7b-4096-tokens", "small-vocab", "scaled"],
)
def test_cuda_embedding_backward_scratch(tokens: int, vocab: int, hidden: int, scale: bool, expected: int) -> None:
    grad, indices = _meta(tokens, hidden), _meta(1, tokens, dtype=torch.long)
    assert CudaKernels().workspace_bytes(_EMBEDDING_BWD, (grad, indices, vocab, -1, scale), None) == expected


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
    assert "every number predicted" in result.stdout and "est. peak" in result.stdout
    line = next(row for row in result.stdout.splitlines() if "│ none " in row)
    assert "no (optimizer state)" in line
    assert "estimate" in result.stderr  # the progress bar


def test_cli_sets_a_run_directory_against_its_measurements(measured: dict, tmp_path: Path) -> None:
    """`ckptbench estimate RUN_DIR` on a CPU run: each point's measured peak, and an error of 0 bytes."""
    cfg = _cfg("bf16")
    records = list(measured["bf16"][0].values())
    oom = {**records[-1], "status": "oom", "peak_allocated_bytes": None}
    meta = RunMeta(schema_version=1, name=cfg.name, status="complete", config=cfg.model_dump(mode="json"))
    writer = RunWriter(tmp_path, meta)
    for rec in [*records[:-1], oom]:
        writer.append(PointRecord.model_validate(rec))
    writer.close()
    result = runner.invoke(app, ["estimate", str(tmp_path), "--format", "json"])
    assert result.exit_code == 0, result.output
    rows = {key_id(r["key"]): r for r in json.loads(result.stdout)}
    assert len(rows) == len(records) == 3
    for rec in records[:-1]:
        row = rows[key_id(rec["key"])]
        assert row["target"] == "cpu" and row["measured_status"] == "ok"
        assert row["measured_peak_allocated_bytes"] == row["predicted_peak_allocated_bytes"]
        assert row["measured_peak_allocated_bytes"] == rec["peak_allocated_bytes"]
        assert row["relative_error"] == 0.0
    row = rows[key_id(oom["key"])]
    assert row["measured_status"] == "oom" and row["relative_error"] is None
    assert row["measured_peak_allocated_bytes"] is None and row["predicted_peak_allocated_bytes"] > 0


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
        "model": "tiny", "architecture": "llama", "layout": "all", "batch_size": 1, "seq_len": 32, "precision": "fp32",
        "optimizer": "adamw_fused", "micro_batches": 2, "offload": "none", "lora": "none", "compile": False,
        "attn_implementation": "sdpa", "loss": "default", "optimizer_in_backward": False, "optimizer_offload": "none",
        "parallel": "none", "allocator": "default",
    }
