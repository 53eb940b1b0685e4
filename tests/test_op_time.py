"""The op model (analysis/op_time.py) on made-up steps whose times a known set of rates gives: calibration recovers
them, held-out cells are predicted from the others, fallbacks and transfers follow the card table."""

from __future__ import annotations

import pytest

from ckptbench.analysis.op_time import (
    LOOP,
    OP,
    PASS,
    STEP,
    OpTimeModel,
    Rates,
    Sample,
    calibrate,
    fallbacks,
    least_seconds,
    loop_ops,
    not_modelled,
)
from ckptbench.config.cards import BY_KEY
from ckptbench.train.flops import CHECKPOINTED_PASS, OpCosts

H200 = "NVIDIA H200"
TRUE = Rates(H200, {"flop:matmul:bf16": 1 / 650e12, "flop:attention:sdpa:bf16": 1 / 400e12,
                    "byte:memory": 1 / 3.0e12, "byte:copy": 1 / 2.5e12, "byte:optimizer:fused": 1 / 3.5e12,
                    OP: 5e-6, STEP: 2e-3, PASS: 4e-3})


def _step(tokens: int, *, attn: int = 0, mlp: int = 0, seq: int = 2048, optimizer_bytes: int = 94_000_000_000,
          copies: int = 1) -> OpCosts:
    """A made-up step of 32 layers: per layer, the attention's four projections, its kernel and copies, the MLP's
    three matmuls and elementwise ops (FLOPs and bytes grow with the tokens, attention's FLOPs with the sequence too),
    then the optimizer; ``attn`` and ``mlp`` layers run that part's forward again (checkpointed)."""
    a, m = 32 + attn, 32 + mlp
    counts = {
        ("matmul:bf16", 2 * 4096 * 4096 * tokens, 2 * (4096 * 4096 + 2 * 4096 * tokens)): 4 * a,
        ("attention:sdpa:bf16", 4 * 4096 * seq * tokens, 8 * 4096 * tokens): a,
        ("copy", 0, 4 * 4096 * tokens): copies * a,
        ("matmul:bf16", 2 * 4096 * 11008 * tokens, 2 * (4096 * 11008 + (4096 + 11008) * tokens)): 3 * m,
        ("memory", 0, 2 * 11008 * tokens): 4 * m,
        ("memory", 0, 16): 30,  # small ops: their launch, not their bytes
        ("optimizer:fused", 0, optimizer_bytes): 1,
    }
    if attn or mlp:
        counts[(CHECKPOINTED_PASS, 0, 0)] = 1
    return OpCosts(counts)


def _samples() -> list[Sample]:
    main = [(_step(t, attn=a, mlp=m), "main") for t in (2048, 4096, 16384) for a, m in ((0, 0), (32, 0), (0, 32))]
    others = [(_step(4096, seq=4096), "seq 4096"), (_step(4096, copies=4), "amp"),
              (_step(4096, optimizer_bytes=250_000_000_000), "foreach")]
    return [Sample({"i": i}, cell, ops, TRUE.time(ops)) for i, (ops, cell) in enumerate(main + others)]  # type: ignore[arg-type]


def test_calibration_recovers_the_times_of_the_rates_that_made_them() -> None:
    samples = _samples()
    rates = calibrate(samples, card=H200)
    assert rates is not None
    for s in samples:  # (the weak prior toward the fallbacks moves them by a few parts per million)
        assert rates.time(s.ops) == pytest.approx(s.step_time_s, rel=1e-4)
    # a step nobody measured: a longer sequence and another batch
    new = _step(8192, seq=8192, attn=16, mlp=16)
    assert rates.time(new) == pytest.approx(TRUE.time(new), rel=1e-4)


def test_held_out_cells_are_predicted_from_the_others() -> None:
    model = OpTimeModel.calibrated(_samples(), card=H200)
    assert model is not None and model.cells == 4 and model.main_cell == "main"
    loo = {c.key["i"]: c.error for c in model.loo}
    assert all(e is not None and abs(e) < 1e-3 for i, e in loo.items() if i < 9)  # the main cell: exact data
    loco = {c.key["i"]: c.error for c in model.loco}
    # A longer sequence: its rates (attention's apart from the matmuls': the attention-only and MLP-only
    # recomputation separate them) are determined by the main cell: predicted exactly. More copies: in the main cell
    # copies grow with attention's FLOPs, so their bandwidth and attention's rate share the data, the prior holds
    # the copies near the memory bandwidth: nearly. The optimizer's bandwidth: where only the layout and the batch
    # vary, its time and the fixed cost are one number, and the prior holds it at the memory bandwidth (3.0 TB/s
    # for the 3.5 that made the data): off by more.
    assert abs(loco[9]) < 1e-3 and abs(loco[10]) < 0.01  # type: ignore[arg-type]
    assert 0.01 < loco[11] < 0.05  # type: ignore[operator]
    assert model.error_bound == pytest.approx(abs(loco[11]))  # type: ignore[arg-type]
    # the main cell's checkpointed points from the others: not at all (only it holds checkpointed passes: no
    # calibrated cost); its plain ones from the few plain points of the other cells
    assert all(loco[i] is None for i in (1, 2, 4, 5, 7, 8)) and all(loco[i] is not None for i in (0, 3, 6))
    assert model.source() == (f"modelled from each op's FLOPs and bytes, rates calibrated on 12 points of 4 cells "
                              f"(NVIDIA H200), leave-one-cell-out error <= {abs(loco[11]):.1%} (3 cells)")  # type: ignore[arg-type]


def test_each_op_takes_its_longer_side() -> None:
    rates = Rates(None, {"flop:matmul:bf16": 1e-12, "byte:memory": 1e-9, OP: 0.0, STEP: 0.0})
    compute_bound = OpCosts({("matmul:bf16", 10**9, 10**2): 1})  # 1 ms of FLOPs, 0.1 us of bytes
    memory_bound = OpCosts({("matmul:bf16", 10**3, 10**6): 1})  # 1 ns of FLOPs, 1 ms of bytes
    assert rates.time(compute_bound) == pytest.approx(1e-3)
    assert rates.time(memory_bound) == pytest.approx(1e-3)
    terms = rates.terms(compute_bound.plus(memory_bound))
    assert terms == pytest.approx({"matmul:bf16": 2e-3, "per-op": 0.0, "fixed": 0.0})


def test_fallbacks_and_what_has_none() -> None:
    a100 = BY_KEY["a100-80gb"]
    assert fallbacks("byte:copy", a100) == [("byte:memory", 1.0)]
    assert fallbacks("flop:attention:eager:bf16", a100) == [
        ("flop:attention:eager:fp16", 1.0), ("flop:matmul:bf16", 1.0), ("flop:matmul:fp16", 1.0)]
    rates = Rates(H200, {"flop:matmul:bf16": 2e-15, "byte:memory": 1e-12, OP: 1e-6, STEP: 0.0})
    assert rates.get("flop:matmul:fp16") == 2e-15  # the H200's fp16 and bf16 peaks are equal
    assert rates.get("flop:attention:sdpa:bf16") == 2e-15 and rates.get("byte:optimizer:fused") == 1e-12
    fp32 = OpCosts({("matmul:fp32", 10**9, 10**6): 1})
    assert rates.time(fp32) is None and rates.missing(fp32) == ["flop:matmul:fp32"]
    assert Rates(None, rates.seconds).get("flop:matmul:fp16") is None  # a CPU has no datasheet peaks
    assert rates.missing(OpCosts({("communication", 0, 10): 1})) == ["communication"]


def test_another_card_scales_each_class_by_its_datasheet_figure() -> None:
    rates = Rates(H200, {"flop:matmul:bf16": 1 / 650e12, "flop:matmul:fp32": 0.0, "byte:memory": 1 / 3e12,
                         OP: 5e-6, STEP: 1e-3})
    a100 = rates.on_card(BY_KEY["a100-80gb"])
    assert a100 is not None and a100.card == "NVIDIA A100-SXM4-80GB" and a100.transferred_from == H200
    assert a100.seconds["flop:matmul:bf16"] == pytest.approx(989 / 312 / 650e12)
    assert a100.seconds["byte:memory"] == pytest.approx(4.8 / 2.039 / 3e12)
    assert a100.seconds[OP] == 5e-6 and a100.seconds[STEP] == 1e-3  # not datasheet figures: kept
    assert a100.seconds["flop:matmul:fp32"] == 0.0  # calibrated free: free anywhere
    v100 = rates.on_card(BY_KEY["v100-32gb"])  # no bf16: fp16 carried from bf16 by the H200's own peaks
    assert v100 is not None and "flop:matmul:bf16" not in v100.seconds
    assert v100.seconds["flop:matmul:fp16"] == pytest.approx(989 / 125 / 650e12)
    assert Rates(None, rates.seconds).on_card(BY_KEY["a100-80gb"]) is None  # a CPU calibration has no figures


def test_what_is_not_timed_per_op_says_why() -> None:
    plain = {"offload": "none", "optimizer_offload": "none", "optimizer": "adamw_fused", "compile": False,
             "parallel": "none"}
    assert not_modelled(plain) is None
    assert "offloading" in str(not_modelled({**plain, "offload": "all"}))
    assert "8-bit" in str(not_modelled({**plain, "optimizer": "adamw_8bit"}))
    assert "communication" in str(not_modelled({**plain, "parallel": "fsdp2:8"}))
    assert "compile" in str(not_modelled({**plain, "compile": True}))


def test_the_shipped_op_model_is_read_back_as_calibrated_without_scipy() -> None:
    """The calibration file keeps the op model's rates and held-out predictions (no refit when read, no scipy
    imported); they equal what calibrating again on the same points gives, to the last bit."""
    import json
    import subprocess
    import sys
    from importlib import resources

    from ckptbench.analysis.step_time import CALIBRATION, StepTimeModel, shipped_calibration

    data = json.loads(resources.files("ckptbench").joinpath("data", CALIBRATION).read_text(encoding="utf-8"))
    assert data["op_models"], "the shipped calibration keeps no op model"
    kept = shipped_calibration().op_models
    again = StepTimeModel.from_calibration({k: v for k, v in data.items() if k != "op_models"}).op_models
    assert [m.rates for m in kept] == [m.rates for m in again]
    for a, b in zip(kept, again, strict=True):
        assert a.loo == b.loo and a.error_bound == b.error_bound and a.loo_bound == b.loo_bound
        assert {(c.measured_s, c.predicted_s) for c in a.loco} == {(c.measured_s, c.predicted_s) for c in b.loco}
    code = ("import sys; from ckptbench.analysis.step_time import shipped_calibration as s; "
            "assert s().op_models; print('scipy' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"


def test_a_gpu_calibration_stays_within_its_datasheet_and_foreach_falls_back_by_device() -> None:
    h200 = BY_KEY["h200"]
    assert least_seconds("byte:copy", h200) == pytest.approx(1 / 4.8e12)
    assert least_seconds("flop:matmul:bf16", h200) == pytest.approx(1 / 989e12)
    assert least_seconds("flop:matmul:fp32", h200) == 0.0 and least_seconds(OP, h200) == 0.0
    assert least_seconds("byte:memory", None) == 0.0  # a CPU: no datasheet
    # the optimizer's per-tensor and multi-tensor ops are the same streaming kernels: each other's bandwidth, then on
    # a GPU the fused kernel's; the loop's per-op cost at any op's
    assert fallbacks("byte:optimizer:foreach", h200) == [
        ("byte:optimizer:single", 1.0), ("byte:optimizer:fused", 1.0), ("byte:memory", 1.0)]
    assert fallbacks("byte:optimizer:single", h200) == [
        ("byte:optimizer:foreach", 1.0), ("byte:optimizer:fused", 1.0), ("byte:memory", 1.0)]
    assert fallbacks("byte:optimizer:foreach", None) == [("byte:optimizer:single", 1.0), ("byte:memory", 1.0)]
    assert fallbacks(LOOP, h200) == [(OP, 1.0)]
    # fallbacks that name each other still end: neither calibrated, both take the fused kernel's, then memory's
    streaming = Rates(H200, {"byte:optimizer:fused": 2e-12, "byte:memory": 1e-12})
    assert streaming.get("byte:optimizer:single") == streaming.get("byte:optimizer:foreach") == 2e-12
    assert Rates(None, {"byte:memory": 1e-12}).get("byte:optimizer:single") == 1e-12
    assert Rates(None, {OP: 1e-6}).get("byte:optimizer:foreach") is None
    # copies that cost nothing in the data: calibrated at the bandwidth, not above it
    free_copies = Rates(H200, {**TRUE.seconds, "byte:copy": 0.0})
    samples = [Sample(s.key, s.cell, s.ops, free_copies.time(s.ops)) for s in _samples()]  # type: ignore[arg-type]
    rates = calibrate(samples, card=H200)
    assert rates is not None and rates.seconds["byte:copy"] >= 1 / 4.8e12 * (1 - 1e-9)
    assert all(v >= least_seconds(p, h200) * (1 - 1e-9) for p, v in rates.seconds.items())


def _loop_step(single_bytes: int, loops: int) -> OpCosts:
    """A step whose optimizer is a per-tensor loop: ``loops`` ops moving ``single_bytes`` in all."""
    counts = dict(_step(4096).counts)
    del counts[("optimizer:fused", 0, 94_000_000_000)]
    counts[("optimizer:single", 0, single_bytes // loops)] = loops
    return OpCosts(counts)


def test_a_gpu_per_tensor_loop_costs_its_ops_and_streams_as_foreach_does() -> None:
    """SGD's and Adafactor's loops: each op costs the loop's per-op cost on top of any op's (GPU only), their bytes
    stream at the multi-tensor kernels' bandwidth. Held out, either loop is predicted from the other and foreach."""
    true = Rates(H200, {**TRUE.seconds, "byte:optimizer:foreach": 1 / 3.2e12, "byte:optimizer:single": 1 / 3.2e12,
                        LOOP: 7e-6})
    steps = [(_step(4096, optimizer_bytes=0), "no optimizer")]  # (a fused kernel moving nothing)
    steps += [(_step(4096).plus(OpCosts({("optimizer:foreach", 0, 283_000_000_000 // 8): 8})), "foreach"),
              (_loop_step(108_000_000_000, 873), "sgd"), (_loop_step(229_000_000_000, 4944), "adafactor")]
    main = [(_step(t, attn=a, mlp=m), "main") for t in (2048, 4096, 16384) for a, m in ((0, 0), (32, 0), (0, 32))]
    samples = [Sample({"i": i}, cell, ops, true.time(ops))  # type: ignore[arg-type]
               for i, (ops, cell) in enumerate(main + steps)]
    assert loop_ops(samples[-1].ops, BY_KEY["h200"]) == 4944 and loop_ops(samples[-1].ops, None) == 0
    assert loop_ops(samples[0].ops, BY_KEY["h200"]) == 0  # a fused kernel's step counters: one op, no loop
    terms = true.terms(samples[-1].ops)
    assert terms is not None and terms["optimizer loop"] == pytest.approx(4944 * 7e-6)
    model = OpTimeModel.calibrated(samples, card=H200)
    assert model is not None and model.rates.seconds[LOOP] == pytest.approx(7e-6, rel=0.01)
    loco = {c.cell: c.error for c in model.loco}
    assert abs(loco["sgd"]) < 1e-3 and abs(loco["adafactor"]) < 1e-3 and abs(loco["foreach"]) < 1e-3  # type: ignore[arg-type]
    # a CPU runs nothing ahead of an op's dispatch: no loop cost, the per-op cost is all of it
    cpu = Rates(None, {**TRUE.seconds, "byte:optimizer:single": 1 / 3.2e12, LOOP: 7e-6})
    cpu_terms = cpu.terms(samples[-1].ops)
    assert cpu_terms is not None and "optimizer loop" not in cpu_terms
