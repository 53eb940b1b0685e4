"""Each traced op's cost (estimator/op_costs.py) and its assembly per layout (estimator/assembly.py): the structure the
step-time model stands on, pinned on a tiny LLaMA (traces only, no timing)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from ckptbench.config.grid import Point
from ckptbench.config.layouts import parse_layout
from ckptbench.config.load import parse_config
from ckptbench.config.presets import PRESETS
from ckptbench.estimator.estimator import Estimator
from ckptbench.estimator.op_costs import OpCounter, kind_of, mutated_arguments, spanned_bytes
from ckptbench.train.flops import CHECKPOINTED_PASS, ModelShape, OpCosts, step_flops

_CFG = {"name": "ops", "device": "cpu", "model": {"preset": "tiny"}, "warmup_steps": 1, "measured_steps": 1,
        "sweep": {"layout": ["none"], "batch_size": [2], "seq_len": [64], "precision": ["bf16"]}}
SHAPE = ModelShape.of_fields(PRESETS["tiny"])
BASE = Point(precision="bf16", lora="none", layout="none", seq_len=64, batch_size=2, model="tiny",
             optimizer="adamw_fused")


@pytest.fixture(scope="module")
def est() -> Estimator:
    return Estimator(parse_config(_CFG), target="cuda")


def _at(**axes: object) -> Point:
    return dataclasses.replace(BASE, **axes)  # type: ignore[arg-type]


def _attention(ops: OpCosts) -> int:
    return sum(ops.flops(c) for c in ops.classes if c.startswith("attention:"))


def test_doubling_the_sequence_quadruples_attention_and_doubles_the_matmuls(est: Estimator) -> None:
    short, long = est.op_costs(_at(seq_len=64)), est.op_costs(_at(seq_len=128))
    assert short is not None and long is not None
    assert _attention(long) == 4 * _attention(short) > 0
    assert long.flops("matmul:bf16") == 2 * short.flops("matmul:bf16") > 0
    assert long.ops == short.ops  # the same kernels, on longer tensors
    # the elementwise ops move about twice the bytes (the weights they read do not grow)
    assert 1.8 < long.bytes("memory") / short.bytes("memory") <= 2.0


def test_the_counted_flops_are_the_model_flops_and_a_checkpointed_forward_counts_twice(est: Estimator) -> None:
    none = est.op_costs(_at(layout="none"))
    assert none is not None
    tokens = BASE.batch_size * BASE.seq_len
    # Every matmul's forward, input and weight gradient (6 x the layers' attention and MLP weights and the LM head's;
    # the norms' weights do no matmul) and attention: a forward of 4 x width x sequence per token and layer, its
    # backward by torch's formula 2.5 forwards (it recomputes the score matrix): 3.5 forwards, to the FLOP.
    n, width = SHAPE.num_layers, SHAPE.attn_width or SHAPE.hidden_size
    matmuls = 6 * (n * (SHAPE.attn_params + SHAPE.mlp_params) + SHAPE.lm_head_params)
    assert none.flops() == tokens * (matmuls + n * 14 * width * BASE.seq_len)
    model, _ = step_flops(SHAPE, parse_layout("none", n), tokens=tokens, seq_len=BASE.seq_len)
    # A checkpointed part's forward runs once more, but only up to the last tensor its backward needs (torch's
    # non-reentrant checkpoint stops early): its last projection (attention's o_proj, the MLP's down_proj) is not
    # recomputed, which train/flops.py's hardware FLOPs count.
    o_proj = 2 * width * SHAPE.hidden_size
    down_proj = 2 * (SHAPE.mlp_params // 3)
    skipped = {"attn": o_proj, "mlp": down_proj, "attn+mlp": o_proj + down_proj}
    for layout, layers in (("all@attn+mlp", n), ("every:2@attn+mlp", n // 2), ("first:3@attn", 3), ("last:2@mlp", 2)):
        ops = est.op_costs(_at(layout=layout))
        assert ops is not None
        plan = parse_layout(layout, n)
        _, hardware = step_flops(SHAPE, plan, tokens=tokens, seq_len=BASE.seq_len)
        recomputed = ops.flops() - none.flops()
        assert recomputed == hardware - model - tokens * layers * skipped[plan.granularity], layout


def test_a_checkpointed_layer_runs_its_attention_forward_twice(est: Estimator) -> None:
    def forwards(ops: OpCosts | None) -> int:
        assert ops is not None
        fwd = min(f for (c, f, _) in ops.counts if c.startswith("attention:sdpa"))  # forward: fewer FLOPs
        return sum(n for (c, f, _), n in ops.counts.items() if c.startswith("attention:sdpa") and f == fwd)

    n = SHAPE.num_layers
    counts = {layout: forwards(est.op_costs(_at(layout=layout))) for layout in ("none", "all", "every:2", "first:3")}
    assert counts == {"none": n, "all": 2 * n, "every:2": n + n // 2, "first:3": n + 3}


def test_selective_recomputes_no_matmul(est: Estimator) -> None:
    none, selective = est.op_costs(_at(layout="none")), est.op_costs(_at(layout="all@selective"))
    assert none is not None and selective is not None
    assert selective.flops() == none.flops()  # the matmul and attention outputs are saved, not recomputed
    assert selective.bytes("memory") > none.bytes("memory")  # the cheap ops are


def test_micro_batches_repeat_the_passes_not_the_optimizer(est: Estimator) -> None:
    one, three = est.op_costs(_at(layout="all")), est.op_costs(_at(layout="all", micro_batches=3))
    assert one is not None and three is not None
    assert three.flops() == 3 * one.flops()
    assert three.bytes("optimizer:fused") == one.bytes("optimizer:fused") > 0
    assert three.count(CHECKPOINTED_PASS) == 3 and one.count(CHECKPOINTED_PASS) == 1
    assert est.op_costs(_at(layout="none")).count(CHECKPOINTED_PASS) == 0  # type: ignore[union-attr]
    assert est.op_costs(_at(layout="all@selective")).count(CHECKPOINTED_PASS) == 0  # type: ignore[union-attr]


@pytest.mark.parametrize("layout", ["none", "all", "every:3@attn+mlp", "all@selective"])
def test_the_fast_path_counts_what_the_whole_model_traced_counts(est: Estimator, layout: str) -> None:
    full = Estimator(est.cfg, target="cuda", method="full")
    point = _at(layout=layout, micro_batches=2)
    fast, whole = est.op_costs(point), full.op_costs(point)
    assert fast is not None and whole is not None
    assert fast.flops() == whole.flops()
    # the whole model's trace also holds the step's returned mean loss, divided after the optimizer (one scalar op)
    diff = {k: whole.counts.get(k, 0) - fast.counts.get(k, 0) for k in {*fast.counts, *whole.counts}}
    assert {k: n for k, n in diff.items() if n} == {("optimizer:single", 0, 8): 1}


def test_precision_attention_and_optimizer_change_the_classes(est: Estimator) -> None:
    amp = est.op_costs(_at(precision="amp_bf16"))
    eager = est.op_costs(_at(attn_implementation="eager"))
    fp32 = est.op_costs(_at(precision="fp32"))
    foreach = est.op_costs(_at(optimizer="adamw_foreach"))
    fused = est.op_costs(_at())
    assert amp and eager and fp32 and foreach and fused
    assert "matmul:bf16" in amp.classes and amp.bytes("copy") > fused.bytes("copy")  # autocast's casts
    assert amp.bytes("optimizer:fused") > fused.bytes("optimizer:fused")  # fp32 master weights and state
    assert "attention:eager:bf16" in eager.classes and not any("sdpa" in c for c in eager.classes)
    # eager: the forward's two products and the backward's four, as bmm (3 forwards); sdpa's backward formula
    # recomputes the score product (3.5 forwards)
    assert 7 * _attention(eager) == 6 * _attention(fused)
    assert "matmul:fp32" in fp32.classes and "matmul:bf16" not in fp32.classes
    # foreach: its multi-tensor ops, each reading and writing whole lists (more passes over the state than fused)
    assert foreach.count("optimizer:fused") == 0
    assert fused.count("optimizer:foreach") == 0  # its step counters: scalars, per-tensor
    assert foreach.count("optimizer:foreach") > fused.count("optimizer:fused") > 0
    assert foreach.bytes("optimizer:foreach") > 2 * fused.bytes("optimizer:fused")
    sgd = est.op_costs(_at(optimizer="sgd"))  # a loop of per-tensor ops on fake CPU tensors (foreach on a GPU)
    assert sgd is not None and sgd.count("optimizer:single") > 0 and sgd.count("optimizer:fused") == 0


def test_kinds_bytes_and_writes_of_single_ops() -> None:
    aten = torch.ops.aten
    assert kind_of(aten.mm.default) == "matmul"
    assert kind_of(aten.bmm.default) == "attention:eager"
    assert kind_of(aten._scaled_dot_product_flash_attention_for_cpu.default) == "attention:sdpa"
    assert kind_of(aten.view.default) == "-" and kind_of(aten.empty.memory_format) == "-"
    assert kind_of(aten._to_copy.default) == "copy" and kind_of(aten.add.Tensor) == "memory"
    assert kind_of(aten._fused_adamw_.default) == "optimizer:fused"
    assert kind_of(aten._foreach_mul_.Scalar) == "optimizer:foreach"
    assert mutated_arguments(aten.add_.Tensor) == (0,) and mutated_arguments(aten.add.Tensor) == ()
    x = torch.zeros(4, 1, dtype=torch.bfloat16).expand(4, 8)  # stride 0: read once
    assert spanned_bytes(x) == 4 * 2 and spanned_bytes(torch.zeros(4, 8)) == 4 * 8 * 4

    counter = OpCounter()
    a, b = torch.ones(8, 16), torch.ones(16, 4)
    counter.count(aten.mm.default, (a, b), None, a @ b, "fwd:0@0")
    counter.count(aten.add_.Tensor, (a, a), None, a, "fwd:0@0")  # read both, write the first once
    counter.count(aten.add.Tensor, (a, a), None, a + a, None)  # before the first segment: not the step's
    counter.count(aten.mul.Tensor, (a, a), None, a * a, "opt")  # in the optimizer's segment: its per-tensor op
    ((label, ops), (opt_label, opt)) = counter.result()
    assert label == "fwd:0@0" and opt_label == "opt"
    assert ops.counts == {("matmul:fp32", 2 * 8 * 16 * 4, (8 * 16 + 16 * 4 + 8 * 4) * 4): 1,
                          ("memory", 0, 3 * 8 * 16 * 4): 1}
    assert opt.counts == {("optimizer:single", 0, 3 * 8 * 16 * 4): 1}


def test_op_costs_add_up_and_round_trip() -> None:
    a = OpCosts({("matmul:bf16", 10, 4): 2, ("memory", 0, 8): 1})
    b = OpCosts({("memory", 0, 8): 3, (CHECKPOINTED_PASS, 0, 0): 1})
    total = a.plus(b, 2)
    assert total.counts == {("matmul:bf16", 10, 4): 2, ("memory", 0, 8): 7, (CHECKPOINTED_PASS, 0, 0): 2}
    assert total.ops == 9 and total.flops() == 20 and total.bytes("memory") == 56
    assert OpCosts.of([(a, 1), (a, -1)]).counts == {}
    assert OpCosts.from_json(total.to_json()) == total
