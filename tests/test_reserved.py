"""Predicted peak reserved memory: the full model's request stream re-assembled from a short trace equals a
full trace's, the replayed process against the committed H200 measurements, the device model per card."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ckptbench.cli.main import app
from ckptbench.config.layouts import parse_layout
from ckptbench.config.load import parse_config
from ckptbench.config.schema import SweepConfig
from ckptbench.errors import ConfigError
from ckptbench.estimator.assembly import layer_classes, plans_for, short_model_classes
from ckptbench.estimator.event_assembly import (
    EventAssembler,
    StepEvents,
    assemble_step,
    segment_events,
    short_template,
    traced_step,
)
from ckptbench.estimator.events import ALLOC
from ckptbench.estimator.gpus import DEFAULT_CUBLAS_WORKSPACE, GPUS, HOPPER_CUBLAS_WORKSPACE, gpu_model
from ckptbench.estimator.trace import trace_step
from ckptbench.results.record import PointRecord
from tests._known import known
from tests.conftest import tiny_config

# Estimates of one config are made once per process and shared (tests/_est_shared.py).
pytestmark = [pytest.mark.usefixtures("shared_estimates"), pytest.mark.trace_cache]  # traces shared on disk

GIB, MIB = 2**30, 2**20
RESULTS = Path(__file__).parents[1] / "results"


def _normal(step: StepEvents) -> tuple[list[tuple[int, int, int]], list[str]]:
    """Events with keys renamed in allocation order; a run of frees sorted (their order changes nothing:
    merging freed neighbours gives the same cached blocks in any order)."""
    names: dict[int, int] = {}
    out: list[tuple[int, int, int]] = []
    run: list[tuple[int, int, int]] = []
    for op, key, nbytes in step.events:
        if op == ALLOC:
            out += sorted(run)
            run = []
            names[key] = len(names)
            out.append((op, names[key], nbytes))
        else:
            run.append((op, names[key], 0))
    return out + sorted(run), [label for _, label in step.bounds]


def _assert_fast_events_equal_full(cfg: SweepConfig, target: str = "cuda") -> None:
    points = cfg.points_list()
    num_layers = cfg.model.num_layers
    needed = {c for p in points for c in layer_classes(parse_layout(p.layout, num_layers))}
    classes = short_model_classes(needed)
    first = points[0]
    short = trace_step(cfg, first, target=target, plans=plans_for(classes), num_layers=len(classes),
                       micro_batches=min(first.micro_batches, 2), defer_shared=True)
    for point in points:
        full = trace_step(cfg, point, target=target, defer_shared=True)
        full_classes = layer_classes(parse_layout(point.layout, num_layers))
        fast = assemble_step(short, classes, full_classes, point.micro_batches, segment_events(full, "opt"))
        assert _normal(fast) == _normal(traced_step(full)), point.layout


LAYOUTS = ["none", "all", "every:2", "last:3", "all@attn", "layers:1,4@mlp", "all@attn+mlp", "all@selective", "first:3"]


def test_fast_events_equal_a_full_trace_for_every_layout() -> None:
    sweep = {"layout": LAYOUTS, "batch_size": [2], "seq_len": [64], "precision": ["bf16"]}
    _assert_fast_events_equal_full(tiny_config(device="cuda", sweep=sweep))


@pytest.mark.parametrize(
    ("layouts", "axes"),
    [
        (["none", "all", "first:3@mlp", "last:2@attn"], {"precision": ["amp_bf16"], "micro_batches": [3]}),
        # micro-batches 3 and 4 are copies of the one before (EventAssembler._repeat)
        (["all", "every:2@attn"], {"precision": ["bf16"], "micro_batches": [5]}),
        (["none", "all", "first:3@mlp", "last:2@attn"], {"precision": ["bf16"], "lora": ["r4"]}),
        # Offloading the checkpointed inputs uses reentrant checkpointing, which holds the tensors every layer
        # receives until the embedding's backward: where they are freed in a layout without checkpointed layers
        # is not known from the short model (the byte model shares this; they are a few KiB).
        (["all", "last:2@attn"], {"precision": ["bf16"], "offload": ["ckpt_inputs"]}),
    ],
    ids=["amp-3-microbatches", "5-microbatches", "lora", "offload"],
)
def test_fast_events_equal_a_full_trace_on_other_axes(layouts: list[str], axes: dict[str, Any]) -> None:
    sweep = {"layout": layouts, "batch_size": [2], "seq_len": [64], **axes}
    _assert_fast_events_equal_full(tiny_config(device="cuda", sweep=sweep))


def test_fast_events_equal_a_full_trace_at_llama7b_widths() -> None:
    cfg = parse_config({
        "name": "mid", "model": {"preset": "llama-7b", "overrides": {"num_hidden_layers": 4, "vocab_size": 1024}},
        "sweep": {"layout": ["none", "all", "last:1", "first:2@attn+mlp", "layers:0@mlp"], "batch_size": [2],
                  "seq_len": [256], "precision": ["bf16"]},
    })
    _assert_fast_events_equal_full(cfg)


@pytest.mark.parametrize("precision", ["bf16", "amp_bf16"])
def test_later_micro_batches_copied_from_the_one_before_equal_their_templates(precision: str) -> None:
    """From the fourth micro-batch on, each is the one before with its keys moved on: the same step, event for
    event (keys, bounds, workspaces), as copying every micro-batch from the short model's templates."""
    layouts = ["none", "all", "every:2", "last:3", "first:2@mlp", "all@selective", "layers:1,4@attn"]
    cfg = tiny_config(device="cuda", sweep={"layout": layouts, "batch_size": [2], "seq_len": [32],
                                            "precision": [precision]})
    num_layers = cfg.model.num_layers
    classes = short_model_classes({c for lay in layouts for c in layer_classes(parse_layout(lay, num_layers))})
    short = trace_step(cfg, cfg.points_list()[0], target="cuda", plans=plans_for(classes), num_layers=len(classes),
                       micro_batches=2, defer_shared=True)
    opt = segment_events(short, "opt")
    for layout in layouts:
        full = layer_classes(parse_layout(layout, num_layers))
        for count in (3, 4, 5, 9):
            template = short_template(short, classes, count)
            copied = EventAssembler(template, full, count).run(opt)
            assert copied == EventAssembler(template, full, count).run(opt, repeat=False), (layout, count)


# -- the committed H200 runs --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def h200_check(shared_estimates: None) -> dict[str, dict[str, Any]]:
    """`ckptbench estimate results/h200-gpu-check-2/check --format json`, by layout and batch (the estimates
    are shared with test_reserved_predictions_against_every_committed_h200_point's run of the same command)."""
    if not (RESULTS / "h200-gpu-check-2/check/points.jsonl").exists():
        pytest.skip("no H200 results in this checkout")
    result = CliRunner().invoke(app, ["estimate", str(RESULTS / "h200-gpu-check-2/check"), "--format", "json"])
    assert result.exit_code == 0, result.output
    return {f"{r['key']['layout']} b{r['key']['batch_size']}": r for r in json.loads(result.stdout)}


def test_none_at_batch_8_runs_out_where_and_as_the_h200_did(h200_check: dict[str, dict[str, Any]]) -> None:
    """results/h200-gpu-check-2/gpu_check.log: 'Tried to allocate 1.95 GiB ... 132.21 GiB is allocated by
    PyTorch, and 6.52 GiB is reserved by PyTorch but unallocated' (the fp32 logits of 8 x 2048 x 32000)."""
    oom = h200_check["none b8"]["predicted_oom"]
    assert oom["segment"] == "logits@0" and oom["request_bytes"] == 8 * 2048 * 32000 * 4
    assert abs(oom["allocated_bytes"] / GIB - 132.21) < 0.005  # the message rounds to 0.01 GiB
    assert abs(oom["reserved_bytes"] - (132.21 + 6.52) * GIB) < 0.005 * (132.21 + 6.52) * GIB
    assert h200_check["none b8"]["fits"] is False


# Measured in-process inside a sweep (after empty_cache, but with the previous points' history in the
# driver's address space), so not the fresh-process 1% target: the errors found (README: 41 of 46 within
# 1%), pinned per point; the three outliers are where the recomputed MLP dominates the fragmentation.
WORST_RESERVED_ERROR = {"all@attn+mlp b8": 0.037, "all@mlp b2": 0.025, "all@selective b8": 0.021}
OTHER_RESERVED_ERROR = 0.01
H200_RUNS = {"h200-gpu-check-2/check": 16, "h200-gpu-check-1/check": 16, "h200-gpu-check-1/axes": 14}


@pytest.mark.parametrize(("run", "points"), list(H200_RUNS.items()))
def test_reserved_predictions_against_every_committed_h200_point(run: str, points: int) -> None:
    if not (RESULTS / run / "points.jsonl").exists():
        pytest.skip(f"{run} is not in this checkout")
    result = CliRunner().invoke(app, ["estimate", str(RESULTS / run), "--format", "json"])
    assert result.exit_code == 0, result.output
    compared = 0
    for rec in json.loads(result.stdout):
        if rec["measured_peak_reserved_bytes"] is None or rec["predicted_peak_reserved_bytes"] is None:
            continue  # out of memory (none b=8), or not estimated (8-bit AdamW without bitsandbytes)
        compared += 1
        name = f"{rec['key']['layout']} b{rec['key']['batch_size']}"
        error = abs(rec["reserved_relative_error"])
        assert error <= WORST_RESERVED_ERROR.get(name, OTHER_RESERVED_ERROR), f"{name}: {error:.2%}"
        # reserved is never below allocated, and the replay's allocated is the byte model's to 1 MiB
        # (cuBLASLt's workspace, which the byte model leaves out) plus whole-block rounding
        assert rec["predicted_peak_reserved_bytes"] >= rec["predicted_peak_allocated_bytes"]
    # the axes run's 8-bit AdamW point is estimated only where bitsandbytes is installed
    extra = run.endswith("axes") and importlib.util.find_spec("bitsandbytes") is not None
    assert compared == points + extra


# -- the device model ---------------------------------------------------------------------------------------


def test_cublas_workspace_follows_the_architecture_and_the_variable() -> None:
    assert gpu_model("h200").cublas_workspace_bytes() == HOPPER_CUBLAS_WORKSPACE == 32 * MIB
    assert gpu_model("a100-80gb").cublas_workspace_bytes() == DEFAULT_CUBLAS_WORKSPACE == 8 * MIB + 128 * 1024
    assert gpu_model("a100-80gb").cublas_workspace_bytes(":4096:8") == 32 * MIB
    assert gpu_model("l40s").cublas_workspace_bytes(":16:8") == 128 * 1024


def test_only_the_h200_figures_are_measured_and_every_figure_has_a_source() -> None:
    assert [g.key for g in GPUS.values() if g.measured] == ["h200"]
    for g in GPUS.values():
        status = "measured" if g.measured else "estimate"
        assert g.total_source.startswith(status) and g.context_source.startswith(status)
        assert 0 < g.context_bytes < GIB < g.total_bytes


def test_unknown_card_is_a_config_error_with_a_hint() -> None:
    with pytest.raises(ConfigError, match="did you mean 'a100-80gb'"):
        gpu_model("a100-80g")


def test_estimate_for_a_card_the_user_does_not_have() -> None:
    """`--gpu a100-40gb`: its memory is the budget; reserved plus its context must fit; labelled estimates."""
    config = str(Path(__file__).parent / "fixtures" / "estimate_tiny.yaml")
    result = CliRunner().invoke(app, ["estimate", config, "--target", "cuda", "--gpu", "a100-40gb", "--format", "json"])
    assert result.exit_code == 0, result.output
    records = json.loads(result.stdout)
    card = gpu_model("a100-40gb")
    for rec in records:
        assert rec["gpu"] == "a100-40gb" and rec["gpu_figures_measured"] is False
        assert rec["budget_bytes"] == card.total_bytes and rec["context_bytes"] == card.context_bytes
        assert rec["predicted_peak_reserved_bytes"] >= rec["predicted_peak_allocated_bytes"] > 0
        assert rec["fits"] is True
    table = CliRunner().invoke(app, ["estimate", config, "--target", "cuda", "--gpu", "a100-40gb"])
    assert "a100-40gb (card figures estimated)" in table.stdout


# -- the allocator axis and where a point was measured --------------------------------------------------------


def test_the_allocator_axis_changes_the_replay_not_the_trace() -> None:
    """configs/allocator-axis.yaml's point (LLaMA-7B all@attn+mlp b=8, 91.4 GiB reserved for 76.1 GiB allocated
    on the H200): the options change where blocks go, not what is allocated; expandable segments are
    predicted to take most of the fragmentation away (an estimate until scripts/gpu_stages/10-allocator.sh
    measures it)."""
    from ckptbench.config.load import load_config
    from ckptbench.estimator.estimator import estimate_points

    cfg = load_config(Path(__file__).parents[1] / "configs" / "allocator-axis.yaml")
    est = {e.point.allocator: e for e in estimate_points(cfg, cfg.points_list())}
    assert set(est) == {"default", "expandable_segments", "max_split_size_mb:256", "garbage_collection_threshold:0.8"}
    assert len({e.peak_bytes for e in est.values()}) == 1  # the same tensors: the byte model does not change
    replayed = {a: e.reserved.peak_reserved_bytes for a, e in est.items() if e.reserved is not None}
    assert all(r is not None for r in replayed.values()) and len(replayed) == 4
    reserved = {a: known(r) for a, r in replayed.items()}
    assert reserved["expandable_segments"] < reserved["max_split_size_mb:256"] < reserved["default"] - 4 * GIB
    # never above the 0.8 x 139.8 GiB threshold, so garbage collection never runs: the same as the default
    assert reserved["garbage_collection_threshold:0.8"] == reserved["default"]


def test_points_record_where_they_were_measured() -> None:
    from tests.test_runner import run_points

    recs = run_points(tiny_config(sweep={"layout": ["none", "all"], "batch_size": [1, 2], "seq_len": [32]}))
    ordered = sorted(recs.values(), key=lambda r: known(r.points_before))
    assert [r.points_before for r in ordered] == [0, 1, 2, 3]
    assert {r.process for r in ordered} == {"in-process"} and all(r.allocator_conf is not None for r in ordered)
    assert all(r.context_bytes is None for r in ordered)  # the CPU tracker has no memory outside it


def test_a_child_record_keeps_the_parents_predictions_and_is_marked_fresh() -> None:
    from ckptbench.processes.launch import child_record
    from ckptbench.processes.outcome import ProcessFailure

    base = PointRecord(key={"layout": "all"}, status="error", predicted_peak_reserved_bytes=5, predicted_oom=None,
                       predicted_peak_allocated_bytes=4, process="in-process",
                       allocator_conf="expandable_segments:True", search=True)
    child = PointRecord(key={"layout": "all"}, status="ok", peak_reserved_bytes=6, process="in-process",
                        points_before=0, fatal=True)
    merged = child_record(base, child)
    assert merged.predicted_peak_reserved_bytes == 5 and merged.peak_reserved_bytes == 6 and merged.search
    # The child's own null prediction of the OOM is not carried over; its fatal error is not the next point's.
    assert "predicted_oom" not in merged.to_json() and "fatal" not in merged.to_json()
    assert merged.process == "fresh" and merged.isolated and merged.points_before == 0
    assert merged.allocator_conf == "expandable_segments:True"
    failed = child_record(base, ProcessFailure("killed", stderr_tail="", exit_code=-9))
    assert failed.status == "error" and failed.reason == "killed" and failed.process == "fresh"
    assert (failed.stderr_tail, failed.exit_code, failed.predicted_peak_allocated_bytes) == ("", -9, 4)


def test_background_predictions_carry_the_reserved_prediction_for_the_sweeps_card() -> None:
    """On CUDA a sweep's predictions come from a process that sees no GPU: the card travels with the request."""
    from ckptbench.estimator.estimator import predict_records
    from ckptbench.sweep.predictions import BackgroundPredictions

    cfg = tiny_config(device="cuda", sweep={"layout": ["none", "all"], "batch_size": [2], "seq_len": [64]})
    points, a100 = cfg.points_list(), gpu_model("a100-40gb")
    bg = BackgroundPredictions.start()
    try:
        bg.request(cfg, points, target="cuda", gpu=a100)
        streamed = {p.key_id: bg.get(p.key_id) for p in points}
    finally:
        bg.close()
    # Every prediction arrived (close() may end the process before its final 'done' line is read: not an error).
    assert bg.notes() == [] and streamed == predict_records(cfg, points, target="cuda", gpu=a100)
    h200 = predict_records(cfg, points, target="cuda", gpu="h200")
    # Ampere's smaller cuBLAS workspaces: less reserved than on the H200, so the card did reach the process.
    for key, prediction in streamed.items():
        assert prediction is not None and prediction.predicted_peak_reserved_bytes is not None
        assert prediction.predicted_peak_reserved_bytes < (h200[key].predicted_peak_reserved_bytes or 0)


def test_one_trace_serves_every_card_its_workspaces_added_after() -> None:
    """A trace holds no cuBLAS workspace (the card's size): the Estimator adds each card's two (Hopper's 32 MiB,
    Ampere's 8.125 MiB) to the trace's own peak, in "other", fast and whole, where the peak falls unchanged; an
    Estimator carried to another card shares its traces."""
    from ckptbench.estimator.assembly import Peak, StepCosts, assemble
    from ckptbench.estimator.estimator import Estimator
    from ckptbench.estimator.step_trace import OTHER
    from ckptbench.estimator.trace import trace_optimizer

    cfg = tiny_config(device="cuda", sweep={"layout": ["none", "all", "last:1"], "batch_size": [2], "seq_len": [64]})
    h200 = Estimator(cfg, target="cuda", gpu=gpu_model("h200"), cache=None)
    a100 = h200.on_card(gpu_model("a100-80gb"))
    points = cfg.points_list()
    h200.run_traces(points, workers=1)
    assert a100._traces is h200._traces and a100.jobs(points) == []  # nothing to trace for the other card
    for est, workspace in ((h200, HOPPER_CUBLAS_WORKSPACE), (a100, DEFAULT_CUBLAS_WORKSPACE)):
        def with_workspaces(peak: Peak, workspace: int = workspace) -> Peak:
            vector = list(peak.vector)
            vector[OTHER] += 2 * workspace  # two handles; both sizes are whole 512-byte blocks under 10 MiB or 2 MiB
            return Peak(tuple(vector), peak.label, peak.retained)

        for point in points:
            optim = trace_optimizer(cfg, point, target="cuda")
            key = est._short_key(point)
            classes = key[-1]
            short = trace_step(cfg, point, target="cuda", plans=plans_for(classes), num_layers=len(classes),
                               micro_batches=1, defer_shared=True)
            fast = assemble(StepCosts.from_trace(short, classes, 1), optim, est.classes(point), 1)
            assert est._peak(point) == with_workspaces(fast), (est.gpu.key, point.layout)  # type: ignore[union-attr]
            full = Estimator(cfg, target="cuda", method="full", gpu=est.gpu, cache=None)
            full.run_traces([point], workers=1)
            assert full._peak(point) == with_workspaces(Peak.of_trace(trace_step(cfg, point, target="cuda")))
    assert h200.estimate(points[0]).peak_bytes - a100.estimate(points[0]).peak_bytes == 2 * (  # type: ignore[operator]
        HOPPER_CUBLAS_WORKSPACE - DEFAULT_CUBLAS_WORKSPACE)
