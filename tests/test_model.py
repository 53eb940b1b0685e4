"""Applying a plan checkpoints exactly the chosen modules and changes nothing numerically."""

from __future__ import annotations

import pytest
import torch
from transformers import PreTrainedModel

from ckptbench.config.layouts import parse_layout
from ckptbench.config.model import ModelSpec
from ckptbench.train.checkpointing import applied
from ckptbench.train.model import build_model
from ckptbench.train.optimizers import make_optimizer
from ckptbench.train.step import Trainer, make_batch

SPEC = ModelSpec(preset="tiny")
CPU = torch.device("cpu")


def _model(dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    return build_model(SPEC, device=CPU, dtype=dtype, seed=0)


def _batch(model: PreTrainedModel) -> torch.Tensor:
    return make_batch(seed=0, batch_size=2, seq_len=32, vocab_size=model.config.vocab_size, device=CPU)


def _count_calls(model: PreTrainedModel, layout: str) -> dict[str, list[int]]:
    """Runs of every layer's self_attn and mlp (their first projection) during forward+backward.

    Pre-hooks on the first projection count recomputation too: a wrapped module's own hooks do not
    run again (the checkpoint replays its forward directly) and early-stopping recomputation may end
    inside it, after the last tensor it needs.
    """
    layers = model.model.layers
    counts = {"self_attn": [0] * len(layers), "mlp": [0] * len(layers)}
    handles = []
    for i, layer in enumerate(layers):
        for part in counts:

            def hook(*_: object, part: str = part, i: int = i) -> None:
                counts[part][i] += 1

            first = layer.self_attn.q_proj if part == "self_attn" else layer.mlp.gate_proj
            handles.append(first.register_forward_pre_hook(hook))
    with applied(model, parse_layout(layout, len(layers))):
        model(input_ids=_batch(model), labels=_batch(model)).loss.backward()
    for h in handles:
        h.remove()
    model.zero_grad(set_to_none=True)
    return counts


def test_recomputes_exactly_the_planned_layers() -> None:
    model = _model()
    counts = _count_calls(model, "every:2+1")
    assert counts["mlp"] == [1, 2, 1, 2, 1, 2, 1, 2]
    assert counts["self_attn"] == [1, 2, 1, 2, 1, 2, 1, 2]
    counts = _count_calls(model, "first:3@mlp")
    assert counts["mlp"] == [2, 2, 2, 1, 1, 1, 1, 1]
    assert counts["self_attn"] == [1] * 8


def test_recomputation_grows_with_the_layout() -> None:
    model = _model()
    totals = {lay: sum(map(sum, _count_calls(model, lay).values())) for lay in ("none", "every:2", "all")}
    assert totals["none"] < totals["every:2"] < totals["all"]
    assert totals == {"none": 16, "every:2": 24, "all": 32}


def test_plan_is_removed_after_the_block() -> None:
    model = _model()
    with applied(model, parse_layout("all@attn+mlp", 8)) as modules:
        assert len(modules) == 16
        assert all("forward" in vars(m) for m in modules)
    assert not any("forward" in vars(m) for m in model.modules())
    assert _count_calls(model, "none")["mlp"] == [1] * 8


@pytest.mark.parametrize("layout", ["all", "every:2", "last:3@attn", "all@attn+mlp", "all@mlp"])
def test_gradients_equal_the_unchecked_run(layout: str) -> None:
    model = _model()
    batch = _batch(model)
    model(input_ids=batch, labels=batch).loss.backward()
    reference = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    with applied(model, parse_layout(layout, 8)):
        model(input_ids=batch, labels=batch).loss.backward()
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.grad, reference[name], rtol=1e-5, atol=1e-7, msg=name)


def test_losses_identical_across_layouts_over_steps() -> None:
    losses = {}
    for layout in ("none", "all", "first:4@mlp"):
        model = _model()
        trainer = Trainer(model, make_optimizer("adamw_fused", list(model.parameters()), lr=1e-3), "fp32", "cpu")
        with applied(model, parse_layout(layout, 8)):
            losses[layout] = [float(trainer.step(_batch(model))) for _ in range(3)]
    assert losses["none"][2] < losses["none"][0]  # the optimizer really steps
    assert losses["all"] == pytest.approx(losses["none"], rel=1e-5)
    assert losses["first:4@mlp"] == pytest.approx(losses["none"], rel=1e-5)


def test_build_is_deterministic_and_in_the_requested_dtype() -> None:
    a, b = _model(torch.bfloat16), _model(torch.bfloat16)
    assert {p.dtype for p in a.parameters()} == {torch.bfloat16}
    for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb), name
    assert a.config._attn_implementation == "sdpa"


def test_lora_wrapping_leaves_no_future_warning() -> None:
    """peft reads transformers' deprecated `is_gradient_checkpointing`; its FutureWarning must not reach stderr."""
    import warnings

    from ckptbench.config.model import LoraSpec
    from ckptbench.train.model import apply_lora

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        apply_lora(_model(), rank=4, spec=LoraSpec())
    assert [str(w.message) for w in caught if issubclass(w.category, FutureWarning)] == []
