"""The technique axes tune searches: the loss head (default, chunked, fused_linear), the optimizer in
backward, torchao's optimizers; measured on CPU, estimated to the byte, and loss-checked."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from ckptbench.config.grid import Point
from ckptbench.estimator.estimator import estimate_points
from ckptbench.measure.device import make_probe, resolve_device
from ckptbench.measure.progress import Progress
from ckptbench.measure.runner import Runner
from ckptbench.train.losses import chunked_cross_entropy, loss_head
from ckptbench.train.model import build_model
from ckptbench.train.optimizers import OptimizerInBackward, build_optimizer, make_optimizer
from ckptbench.train.step import Trainer
from ckptbench.train.unavailable import TechniqueUnavailable
from tests._known import known
from tests.conftest import tiny_config

CPU = torch.device("cpu")


def _model(vocab: int = 256, dtype: torch.dtype = torch.float32) -> Any:
    cfg = tiny_config(model={"preset": "tiny", "overrides": {"vocab_size": vocab}})
    return build_model(cfg.model, device=CPU, dtype=dtype, seed=0)


def _batch(vocab: int = 256, rows: int = 2, seq: int = 32) -> torch.Tensor:
    return torch.randint(0, vocab, (rows, seq), generator=torch.Generator().manual_seed(1))


# -- the chunked loss -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_loss_and_gradients_equal_transformers_default(dtype: torch.dtype) -> None:
    model, batch = _model(dtype=dtype), _batch()
    loss = model(input_ids=batch, labels=batch, use_cache=False).loss
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    with loss_head(model, "chunked") as used:
        chunked = model(input_ids=batch, labels=batch, use_cache=False).loss
    chunked.backward()
    assert used == "chunked cross-entropy, 8 chunks"
    assert float(chunked.detach()) == pytest.approx(float(loss.detach()), rel=1e-6)
    # The same sums in another order: fp32 agrees to rounding, bf16 to one bf16 rounding of a gradient.
    tol = 1e-6 if dtype == torch.float32 else 2**-8
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[name], rtol=tol, atol=tol, msg=name)
    assert "forward" not in vars(model)  # the model is restored


def test_chunked_loss_keeps_no_logits_of_the_whole_batch() -> None:
    """Estimated on a model whose logits dominate (vocab 8192): the default keeps B x S x V fp32 logits."""
    sweep = {"layout": ["all"], "batch_size": [2], "seq_len": [256], "precision": ["fp32"],
             "loss": ["default", "chunked"]}
    cfg = tiny_config(model={"preset": "tiny", "overrides": {"vocab_size": 8192}}, sweep=sweep)
    default, chunked = estimate_points(cfg, cfg.points_list(), target="cpu")
    logits_fp32 = 2 * 256 * 8192 * 4  # 16 MiB
    assert default.point.loss == "default" and chunked.point.loss == "chunked"
    assert known(default.peak_bytes) - known(chunked.peak_bytes) >= logits_fp32


def test_chunked_loss_ignores_the_last_position_of_every_row() -> None:
    hidden, weight = torch.randn(2, 5, 4), torch.randn(7, 4)
    labels = torch.randint(0, 7, (2, 5))
    logits = (hidden @ weight.T)[:, :-1].reshape(-1, 7)
    expected = torch.nn.functional.cross_entropy(logits, labels[:, 1:].reshape(-1))
    assert float(chunked_cross_entropy(hidden, weight, labels, chunks=3)) == pytest.approx(float(expected), rel=1e-6)


def test_an_unestimable_loss_leaves_the_other_losses_estimated() -> None:
    """fused_linear has no fake-tensor stand-in; the optimizer trace the losses share must not fail with it."""
    sweep = {"layout": ["all"], "batch_size": [1], "seq_len": [32], "precision": ["bf16"],
             "loss": ["default", "fused_linear"]}
    cfg = tiny_config(device="cuda", sweep=sweep)
    default, fused = estimate_points(cfg, cfg.points_list(), target="cuda")
    assert default.point.loss == "default" and default.peak_bytes is not None and default.note is None
    assert fused.peak_bytes is None
    assert fused.note == "not estimated: loss fused_linear runs Triton kernels, which are not estimated"


def test_fused_linear_loss_is_a_clean_skip_on_cpu() -> None:
    with pytest.raises(TechniqueUnavailable, match=r"needs a CUDA device|not installed"), loss_head(
        _model(), "fused_linear"
    ):
        pass


# -- the optimizer in backward ----------------------------------------------------------------------


@pytest.mark.parametrize("micro_batches", [1, 2])
def test_optimizer_in_backward_makes_the_same_updates(micro_batches: int) -> None:
    """Per-parameter fused AdamW in the hooks = one fused AdamW after backward, bit for bit (fp32 CPU);
    with micro-batches the hooks apply only in the last micro-batch's backward."""
    batch = _batch()
    after = []
    for in_backward in (False, True):
        model = _model()
        params = [p for p in model.parameters() if p.requires_grad]
        point = Point("fp32", "none", "none", 32, 2, "tiny", "adamw_fused", micro_batches=micro_batches,
                      optimizer_in_backward=in_backward)
        opt = build_optimizer(point, params, lr=1e-3, zero_grad_to_none=True)
        trainer = Trainer(model, opt, "fp32", "cpu", micro_batches=micro_batches)
        losses = [float(trainer.step(batch)) for _ in range(2)]
        after.append((losses, [p.detach().clone() for p in params]))
        assert all(p.grad is None for p in params)
    (plain_losses, plain), (hooked_losses, hooked) = after
    assert hooked_losses == plain_losses
    for a, b in zip(plain, hooked, strict=True):
        assert torch.equal(a, b)


def test_optimizer_in_backward_frees_each_gradient_during_backward() -> None:
    model, batch = _model(), _batch()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = OptimizerInBackward("adamw_fused", params, lr=1e-3, zero_grad_to_none=True)
    seen: list[bool] = []
    model.model.embed_tokens.weight.register_post_accumulate_grad_hook(
        lambda p: seen.append(model.lm_head.weight.grad is None)
    )
    model(input_ids=batch, labels=batch, use_cache=False).loss.backward()
    assert seen == [True]  # the LM head's gradient was applied and freed before the embedding's landed
    assert len(opt.state) == len(params)
    opt.remove_hooks()
    model(input_ids=batch, labels=batch, use_cache=False).loss.backward()
    assert all(p.grad is not None for p in params)  # detached: gradients stay, as for a plain optimizer


def test_torchao_optimizers_are_clean_skips_here() -> None:
    params = list(_model().parameters())
    point = Point("fp32", "none", "none", 32, 2, "tiny", "adamw_fused", optimizer_offload="cpu")
    with pytest.raises(TechniqueUnavailable, match="needs a CUDA device"):
        build_optimizer(point, params, lr=1e-3, zero_grad_to_none=True)
    try:
        import torchao  # noqa: F401
    except ImportError:
        with pytest.raises(TechniqueUnavailable, match="torchao is not installed"):
            make_optimizer("adamw_8bit_torchao", params, lr=1e-3)


# -- measured on CPU, estimated to the byte, loss-checked -----------------------------------------

MEASURED_AXES = {
    "layout": ["none", "all", "first:3"],
    "batch_size": [2],
    "seq_len": [32],
    "precision": ["fp32"],
    "loss": ["default", "chunked"],
    "optimizer_in_backward": [False, True],
}
# The plain step (the loss reference) and the new techniques, alone and combined with checkpointing.
MEASURED_KEYS = [
    ("none", "default", False, 1),
    ("none", "chunked", False, 1),
    ("all", "default", True, 1),
    ("first:3", "chunked", True, 1),
    ("all", "chunked", True, 2),
]


def _measured_cfg() -> Any:
    points = [{"layout": layout, "loss": loss, "optimizer_in_backward": oib, "micro_batches": mb}
              for layout, loss, oib, mb in MEASURED_KEYS]
    cfg_axes = {**MEASURED_AXES, "micro_batches": [1, 2]}
    return tiny_config(model={"preset": "tiny", "overrides": {"vocab_size": 1024}}, sweep=cfg_axes, points=points,
                       points_mode="replace", measured_steps=1)


@pytest.fixture(scope="module")
def measured() -> tuple[list[Point], dict[str, Any]]:
    cfg = _measured_cfg()
    device = resolve_device(cfg)
    records: dict[str, Any] = {}

    def collect(event: Progress) -> None:
        if event.record is not None:
            records[event.point.key_id] = event.record

    points = cfg.points_list()
    Runner(cfg, device, make_probe(cfg, device)).run(points, collect)
    return points, records


def test_new_techniques_are_estimated_to_the_byte(measured: tuple[list[Point], dict[str, Any]]) -> None:
    points, records = measured
    cfg = _measured_cfg()
    for method in ("fast", "full"):
        estimates = estimate_points(cfg, points, target="cpu", method=method)
        for est in estimates:
            rec = records[est.point.key_id]
            assert rec.ok, rec.reason
            assert est.peak_bytes == rec.peak_allocated_bytes, (method, est.point.key_id)
            assert est.static["grads_bytes"] == rec.memory.grads_bytes


def test_new_techniques_keep_the_plain_steps_losses(measured: tuple[list[Point], dict[str, Any]]) -> None:
    points, records = measured
    plain = next(p for p in points if p.layout == "none" and p.loss == "default")
    for p in points:
        check = records[p.key_id].loss_check
        assert check.match is True, (p.key_id, check)
        if p != plain:  # every technique is compared with the plain step, every step
            assert check.reference == "none" and check.reference_point == plain.key_id
    # The optimizer in backward keeps no gradient between steps: its static gradients are 0 bytes.
    hooked = [p for p in points if p.optimizer_in_backward]
    assert hooked and all(records[p.key_id].memory.grads_bytes == 0 for p in hooked)
    assert records[points[0].key_id].memory.grads_bytes > 0


def test_a_wrong_chunked_loss_is_flagged(monkeypatch: pytest.MonkeyPatch) -> None:
    """Break the chunked loss on purpose (no shift: every token predicts itself): the check must catch it."""
    import ckptbench.train.losses as losses

    monkeypatch.setattr(losses, "shifted_labels", lambda labels: labels.reshape(-1))
    sweep = {"layout": ["none"], "batch_size": [2], "seq_len": [32], "precision": ["fp32"],
             "loss": ["default", "chunked"]}
    cfg = tiny_config(sweep=sweep, measured_steps=1)
    device = resolve_device(cfg)
    records: dict[str, Any] = {}
    Runner(cfg, device, make_probe(cfg, device)).run(
        cfg.points_list(), lambda e: records.update({e.point.loss: e.record}) if e.record else None
    )
    assert records["default"].loss_check.match is True
    assert records["chunked"].loss_check.match is False and records["chunked"].loss_mismatch
