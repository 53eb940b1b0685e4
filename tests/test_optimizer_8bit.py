"""bitsandbytes' 8-bit AdamW (adamw_8bit) estimated on fake tensors (estimator/optim_8bit.py): a CPU estimate against
a real CPU sweep to the byte, the state a CUDA target counts, and a note (never a traceback) where the trace fails."""

from __future__ import annotations

import importlib.util
import logging
import math
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from ckptbench.cli.main import app
from ckptbench.estimator import optim_8bit
from ckptbench.estimator.estimator import Estimator, card, estimate_points
from ckptbench.estimator.event_assembly import segment_events
from ckptbench.estimator.events import ALLOC
from ckptbench.measure.device import make_probe, resolve_device
from ckptbench.measure.progress import Progress
from ckptbench.measure.runner import Runner
from ckptbench.train.model import build_model
from ckptbench.train.optimizers import bitsandbytes_quietly, import_bitsandbytes
from ckptbench.train.unavailable import TechniqueUnavailable
from tests.conftest import tiny_config

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("bitsandbytes") is None, reason="bitsandbytes is not installed (the 8bit extra)"
)

Measured = tuple[dict[str, dict[str, Any]], list[Any]]  # records by key_id, CPU-target estimates
SMALL = {"preset": "tiny", "overrides": {"num_hidden_layers": 2}}
SWEEP = {"layout": ["none", "all"], "batch_size": [2], "seq_len": [64], "precision": ["fp32", "bf16"],
         "optimizer": ["adamw_8bit"]}
MAP_BYTES = 256 * 4  # one quantisation map: 256 fp32 values (AdamW8bit holds two)
BLOCK = 256  # elements per absmax (bitsandbytes' blockwise quantisation)
MIN_8BIT_SIZE = 4096  # smaller parameters keep two fp32 states


@pytest.fixture(scope="module")
def measured() -> Measured:
    """A real CPU sweep (bitsandbytes runs its 8-bit AdamW on the CPU) and the CPU-target estimates of its points."""
    cfg = tiny_config(model=SMALL, sweep=SWEEP)
    device = resolve_device(cfg)
    records: dict[str, dict[str, Any]] = {}

    def collect(event: Progress) -> None:
        if event.record is not None:
            records[event.point.key_id] = event.record.to_json()

    Runner(cfg, device, make_probe(cfg, device)).run(cfg.points_list(), collect)
    return records, estimate_points(cfg, cfg.points_list(), target="cpu", workers=1)


def test_cpu_estimates_equal_the_measured_peaks_to_the_byte(measured: Measured) -> None:
    records, estimates = measured
    assert len(estimates) == len(records) == 4
    for est in estimates:
        assert records[est.point.key_id]["status"] == "ok", records[est.point.key_id]["reason"]
        assert est.note is None
    predicted = {(e.point.layout, e.point.precision): e.peak_bytes for e in estimates}
    peaks = {(e.point.layout, e.point.precision): records[e.point.key_id]["peak_allocated_bytes"] for e in estimates}
    assert predicted == peaks
    assert len(set(peaks.values())) == 4  # the layouts and precisions really differ


def test_cpu_static_parts_are_the_real_tensors_but_the_maps(measured: Measured) -> None:
    """The maps are made by torch.tensor, which the CPU tracker never counts (nor the CPU estimate); the state bytes
    a run records walk the state's tensors, maps included."""
    records, estimates = measured
    for est in estimates:
        memory = records[est.point.key_id]["memory"]
        assert est.static["params_bytes"] == memory["params_bytes"]
        assert est.static["grads_bytes"] == memory["grads_bytes"]
        assert est.static["optimizer_state_bytes"] == memory["optimizer_state_bytes"] - 2 * MAP_BYTES
        assert est.breakdown["optimizer_state"] == est.static["optimizer_state_bytes"]  # live throughout


def _first_step(numels: list[int], *, maps: bool) -> list[int]:
    """The requests AdamW8bit's first step makes, parameter by parameter (``init_state``): two uint8 states and two
    fp32 absmax vectors (one per block), after the two maps moved to the device with the first of them (``maps``);
    two fp32 states for a parameter below ``min_8bit_size``. The update itself allocates nothing."""
    sizes: list[int] = []
    for n in numels:
        if n < MIN_8BIT_SIZE:
            sizes += [4 * n, 4 * n]
            continue
        if maps:
            sizes += [MAP_BYTES, MAP_BYTES]
            maps = False
        sizes += [n, n, 4 * math.ceil(n / BLOCK), 4 * math.ceil(n / BLOCK)]
    return sizes


@pytest.mark.parametrize("target", ["cuda", "cpu"])
def test_the_optimizer_steps_allocate_what_bitsandbytes_allocates(target: str) -> None:
    """On a GPU the maps are host memory until the first 8-bit state is made, when they are copied to the device
    (counted there, once for the optimizer); on the CPU no tracker sees them. The states follow in parameter order;
    constructing the optimizer and its later steps allocate nothing."""
    cfg = tiny_config(model=SMALL, device=target, sweep={**SWEEP, "layout": ["none"], "precision": ["bf16"]})
    est = Estimator(cfg, target="cuda" if target == "cuda" else "cpu", gpu=card(None) if target == "cuda" else None)
    est.run_traces(cfg.points_list(), workers=1)
    (optim,) = est._optim.values()
    model = build_model(cfg.model, device=torch.device("cpu"), dtype=torch.bfloat16, seed=0)
    numels = [p.numel() for p in model.parameters()]
    assert min(numels) < MIN_8BIT_SIZE <= numels[0]  # both kinds of state; the maps come with the first
    first = segment_events(optim, "opt_first")
    assert {op for op, _, _ in first} == {ALLOC}
    assert [nbytes for _, _, nbytes in first] == _first_step(numels, maps=target == "cuda")
    assert segment_events(optim, "end") == []  # AdamW8bit's construction (the maps: host memory, or unseen)
    assert segment_events(optim, "opt") == []  # a later step updates in place
    (point,) = cfg.points_list()
    estimate = est.estimate(point)
    rounding = 512 if target == "cuda" else 1  # every request here is small: the allocator rounds to 512 bytes
    blocks = sum(-(-n // rounding) * rounding for n in _first_step(numels, maps=target == "cuda"))
    assert estimate.note is None and estimate.static["optimizer_state_bytes"] == blocks


def test_a_trace_that_fails_inside_bitsandbytes_is_a_note(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """Without the stand-in (as with a bitsandbytes whose maps are built otherwise) the trace fails as issue 32
    saw it: the point is not estimated, with a note; the command exits 0."""
    monkeypatch.setattr(optim_8bit, "_stand_in", lambda real, host_only: real)
    cfg = tiny_config(model=SMALL, sweep={**SWEEP, "layout": ["all"], "precision": ["fp32"]})
    (est,) = estimate_points(cfg, cfg.points_list(), target="cpu", workers=1)
    assert est.peak_bytes is None and est.fits is None
    version = import_bitsandbytes().__version__
    assert est.note == (f"not estimated: bitsandbytes {version}: its 8-bit AdamW could not be traced on fake tensors "
                        "(DataDependentOutputException: aten._local_scalar_dense.default)")
    config = tmp_path / "eight.yaml"
    config.write_text(
        "name: eight\ndevice: cpu\nmodel: {preset: tiny, overrides: {num_hidden_layers: 2}}\noptimizer: adamw_8bit\n"
        "sweep: {layout: [all], batch_size: [1], seq_len: [32], precision: [fp32]}\n", encoding="utf-8"
    )
    result = CliRunner().invoke(app, ["estimate", str(config), "--target", "cpu", "--format", "json"])
    assert result.exit_code == 0, result.output
    assert "could not be traced on fake tensors" in result.stdout and "Traceback" not in result.output


def test_only_what_bitsandbytes_raises_becomes_unavailable_and_the_patch_is_undone() -> None:
    bnb = import_bitsandbytes()
    real = bnb.functional.create_dynamic_map
    unavailable = pytest.raises(TechniqueUnavailable, match=r"could not be traced on fake tensors \(ValueError: ")
    with unavailable, optim_8bit.traceable("adamw_8bit", target="cpu"):
        assert bnb.functional.create_dynamic_map is not real
        bnb.optim.AdamW8bit([], lr=1e-3)  # raised by torch.optim, through bitsandbytes' constructor
    with pytest.raises(ValueError, match="ours"), optim_8bit.traceable("adamw_8bit", target="cpu"):
        raise ValueError("ours")  # not bitsandbytes': an estimator bug stays loud
    assert bnb.functional.create_dynamic_map is real
    with optim_8bit.traceable("adamw_fused", target="cpu"):
        assert bnb.functional.create_dynamic_map is real  # other optimizers: nothing patched


def test_the_import_warning_of_bitsandbytes_cpu_backend_is_dropped_and_nothing_else(
    caplog: pytest.LogCaptureFixture,
) -> None:
    logger = logging.getLogger("bitsandbytes.backends.cpu.ops")
    with caplog.at_level(logging.WARNING), bitsandbytes_quietly():
        logger.warning("Failed to load CPU gemm_4bit_forward from kernels-community: %s. Please ...", "untrusted")
        logger.warning("something else")
        logger.error("a real error")
    assert [r.getMessage() for r in caplog.records] == ["something else", "a real error"]
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        logger.warning("Failed to load CPU gemm_4bit_forward from kernels-community: later")
    assert len(caplog.records) == 1  # the filter is gone after the block
