"""Every technique as a sweep axis: each runs on CPU and moves the measured memory the expected way."""

from __future__ import annotations

import importlib.util
import math
from typing import Any

import pytest
import torch

from ckptbench.config.layouts import parse_layout
from ckptbench.config.load import parse_config
from ckptbench.errors import ConfigError
from ckptbench.measure.device import make_probe, resolve_device
from ckptbench.measure.probes import LiveTensorTracker
from ckptbench.measure.progress import Progress
from ckptbench.measure.runner import Runner
from ckptbench.results.record import PointRecord
from ckptbench.train.checkpointing import applied
from ckptbench.train.model import build_model
from ckptbench.train.offload import HostOffload
from ckptbench.train.optimizers import make_optimizer
from ckptbench.train.step import Trainer, make_batch
from tests._known import known
from tests.conftest import tiny_config

SMALL = {"preset": "tiny", "overrides": {"num_hidden_layers": 2}}


def run(**sweep: Any) -> list[PointRecord]:
    axes = {"layout": ["none"], "batch_size": [1], "seq_len": [64], "precision": ["fp32"], **sweep}
    cfg = tiny_config(model=SMALL, sweep=axes)
    device = resolve_device(cfg)
    records: list[PointRecord] = []

    def collect(event: Progress) -> None:
        if event.record is not None:
            records.append(event.record)

    Runner(cfg, device, make_probe(cfg, device)).run(cfg.points_list(), collect)
    return records


def by(records: list[PointRecord], field: str) -> dict[Any, PointRecord]:
    return {r.key[field]: r for r in records}


def finite(rec: PointRecord) -> bool:
    return rec.status == "ok" and all(math.isfinite(x) for x in rec.losses)


def test_optimizers_state_and_step_temporaries() -> None:
    recs = by(run(optimizer=["adamw_fused", "adamw_foreach", "sgd", "adafactor", "adamw_8bit"]), "optimizer")
    fused, foreach, sgd, ada = (recs[k] for k in ("adamw_fused", "adamw_foreach", "sgd", "adafactor"))
    assert all(finite(r) for r in (fused, foreach, sgd, ada))
    params = known(fused.memory.params_bytes)
    assert known(fused.memory.optimizer_state_bytes) >= 2 * params
    assert known(sgd.memory.optimizer_state_bytes) < 1.01 * params  # one momentum buffer
    assert known(ada.memory.optimizer_state_bytes) < 0.25 * params  # factored second moments
    # foreach materialises temporaries during the step; at this tiny batch the step is the peak.
    assert known(foreach.peak_allocated_bytes) > known(fused.peak_allocated_bytes)
    eight = recs["adamw_8bit"]
    if importlib.util.find_spec("bitsandbytes") is None:
        assert eight.status == "skipped" and "not installed" in known(eight.reason)
    else:  # bitsandbytes 0.50.2 runs its 8-bit AdamW on CPU too
        assert finite(eight), eight.reason
        # Two 1-byte states per parameter (plus block scales): a quarter of fp32 AdamW's two 4-byte states.
        state = known(eight.memory.optimizer_state_bytes)
        assert params / 2 <= state < 0.3 * known(fused.memory.optimizer_state_bytes)


@pytest.mark.usefixtures("no_bitsandbytes")
def test_8bit_adamw_without_bitsandbytes_is_a_skip_naming_the_extra() -> None:
    """Where bitsandbytes is installed it is hidden from the import: the point is skipped, the sweep goes on."""
    recs = by(run(optimizer=["adamw_8bit", "sgd"]), "optimizer")
    eight = recs["adamw_8bit"]
    assert eight.status == "skipped" and eight.reason == "bitsandbytes is not installed (pip install 'ckptbench[8bit]')"
    assert finite(recs["sgd"])


def test_lora_removes_most_gradients_and_optimizer_state() -> None:
    pytest.importorskip("peft")
    recs = by(run(lora=["none", "r4"], layout=["none", "all"]), "lora")
    full, lora = recs["none"], recs["r4"]
    assert finite(lora)
    assert known(lora.memory.params_bytes) > known(full.memory.params_bytes)  # base + adapters
    assert known(lora.memory.grads_bytes) < 0.05 * known(full.memory.grads_bytes)
    assert known(lora.memory.optimizer_state_bytes) < 0.05 * known(full.memory.optimizer_state_bytes)
    assert known(lora.model_flops_per_step) < known(full.model_flops_per_step)  # no weight gradients of the base
    assert known(lora.loss_check).match is True  # 'all' layout vs 'none' under LoRA


def test_gradient_accumulation_keeps_the_peak_at_the_micro_batch() -> None:
    recs = run(batch_size=[1, 2], micro_batches=[1, 2], seq_len=[128])
    by_shape = {(r.key["batch_size"], r.key["micro_batches"]): r for r in recs}
    peak = {shape: known(r.peak_allocated_bytes) for shape, r in by_shape.items()}
    assert all(finite(r) for r in recs)
    assert by_shape[(1, 2)].tokens_per_step == by_shape[(2, 1)].tokens_per_step == 256
    # Two micro-batches of 1 hold one micro-batch of activations (plus the gradients accumulated).
    assert peak[(1, 2)] < peak[(2, 1)]
    assert abs(peak[(1, 2)] - peak[(1, 1)]) < 0.1 * (peak[(2, 1)] - peak[(1, 1)]) + known(
        by_shape[(1, 1)].memory.grads_bytes
    )


def test_selective_checkpointing_sits_between_none_and_full() -> None:
    recs = by(run(layout=["none", "all", "all@selective"], batch_size=[2], seq_len=[128]), "layout")
    none, full, sel = recs["none"], recs["all"], recs["all@selective"]
    assert known(full.peak_allocated_bytes) < known(sel.peak_allocated_bytes) < known(none.peak_allocated_bytes)
    assert known(sel.loss_check).match is True and sel.losses == pytest.approx(none.losses, rel=1e-5)
    assert sel.hardware_flops_per_step == sel.model_flops_per_step  # matmuls are not recomputed


def test_eager_attention_materialises_the_score_matrix() -> None:
    recs = by(run(attn_implementation=["sdpa", "eager"], seq_len=[256]), "attn_implementation")
    assert finite(recs["eager"]) and finite(recs["sdpa"])
    assert known(recs["eager"].peak_allocated_bytes) > known(recs["sdpa"].peak_allocated_bytes)
    assert recs["eager"].losses == pytest.approx(recs["sdpa"].losses, rel=1e-4)


def _offload_step(mode: str) -> tuple[int, int, float]:
    """Peak tracked 'device' bytes, peak host bytes and loss of one step with emulated offloading."""
    model = build_model(tiny_config(model=SMALL).model, device=torch.device("cpu"), dtype=torch.float32, seed=0)
    batch = make_batch(seed=0, batch_size=2, seq_len=128, vocab_size=256, device=torch.device("cpu"))
    tracker = LiveTensorTracker()
    tracker.track([*model.parameters(), batch])
    host = HostOffload(pin_memory=False, copy_cpu=True, on_alloc=tracker.forget)
    plan = parse_layout("all" if mode == "ckpt_inputs" else "none", 2)
    with applied(model, plan, offload_inputs=host if mode == "ckpt_inputs" else None), tracker:
        opt = make_optimizer("sgd", list(model.parameters()), lr=1e-3)
        trainer = Trainer(model, opt, "fp32", "cpu", offload=host.active if mode == "all" else None)
        loss = float(trainer.step(batch))
    return tracker.peak, host.peak_bytes, loss


def test_offloading_moves_saved_activations_to_host_memory() -> None:
    base_peak, base_host, base_loss = _offload_step("none")
    all_peak, all_host, all_loss = _offload_step("all")
    ck_peak, ck_host, ck_loss = _offload_step("ckpt_inputs")
    assert base_host == 0 and all_host > 0 and ck_host > 0
    assert all_peak < base_peak and ck_peak < base_peak
    assert ck_host < all_host  # only the two checkpointed layers' inputs
    assert all_loss == pytest.approx(base_loss, rel=1e-6) and ck_loss == pytest.approx(base_loss, rel=1e-6)


@pytest.mark.parametrize(
    ("sweep", "fragment"),
    [({"offload": ["all"]}, "sweep.offload"), ({"compile": [True]}, "sweep.compile"),
     ({"lora": ["r0"]}, "sweep.lora"), ({"micro_batches": [0]}, "sweep.micro_batches")],
)
def test_nonsense_combinations_are_rejected_at_load(sweep: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        parse_config({"name": "x", "device": "cpu", "model": {"preset": "tiny"}, "sweep": sweep})


def test_torch_compile_trains_like_eager() -> None:
    """The compile axis: the compiled forward gives the eager losses (CPU, no tracker: inductor only)."""
    spec = tiny_config(model={"preset": "tiny", "overrides": {"num_hidden_layers": 1, "hidden_size": 32,
                                                              "intermediate_size": 64, "vocab_size": 64}}).model
    batch = make_batch(seed=0, batch_size=1, seq_len=16, vocab_size=64, device=torch.device("cpu"))
    losses = {}
    for compiled in (False, True):
        model = build_model(spec, device=torch.device("cpu"), dtype=torch.float32, seed=0)
        opt = make_optimizer("adamw_fused", list(model.parameters()), lr=1e-3)
        forward = torch.compile(model) if compiled else None
        trainer = Trainer(model, opt, "fp32", "cpu", forward=forward)
        with applied(model, parse_layout("all", 1)):
            losses[compiled] = [float(trainer.step(batch)) for _ in range(2)]
    torch._dynamo.reset()
    assert losses[True] == pytest.approx(losses[False], rel=1e-4)
