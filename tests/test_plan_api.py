"""ckptbench.plan, ckptbench.apply and ckptbench.hf.PeakMemoryCallback in a training script: a tiny LLaMA trained
with HF Trainer on the CPU, exactly the planned layers recomputed, and the measured peak reported beside the plan."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypedDict

import pytest
import torch

import ckptbench
from ckptbench.advise.plan import Plan
from ckptbench.config.presets import PRESETS

pytestmark = pytest.mark.trace_cache  # its traces kept on disk, shared with the other files that ask for them

# A 1 GiB card (its context an estimate) with 610 MiB to use: no checkpointing does not fit the tiny model at
# batch 8, sequence 128, fp32 (652 MiB with the context), a few layers checkpointed do.
class Card(TypedDict):
    """The card, budget and shape arguments of ``ckptbench.plan``."""

    gpu: str
    budget: str
    headroom: str
    batch: int
    seq: int
    precision: str


CARD: Card = {"gpu": "1GiB", "budget": "610MiB", "headroom": "0", "batch": 8, "seq": 128, "precision": "fp32"}


@pytest.fixture(scope="module")
def plan() -> Plan:
    return ckptbench.plan("tiny", **CARD)


def _tiny_llama() -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    fields = {k: v for k, v in PRESETS["tiny"].items() if not k.startswith("_") and k != "model_type"}
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**fields))
    model.config._attn_implementation = "eager"
    return model


def test_plan_is_typed_and_labelled(plan: Plan) -> None:
    assert plan.fits and plan.layout.startswith(("first:", "last:", "every:"))
    assert 0 < len(plan.layers) < plan.num_layers == 8
    assert plan.needed_bytes is not None and plan.needed_bytes <= plan.limit_bytes == 610 * 2**20
    assert plan.margin_bytes == plan.limit_bytes - plan.needed_bytes and plan.needed_label == "predicted"
    assert plan.step_time_label == "measure to know" and plan.step_time_s is None
    assert plan.micro_batch_size * plan.gradient_accumulation_steps == plan.batch_size == 8
    assert "no checkpointing does not fit" in plan.reason
    # the same answer from the model's own config object as from the preset's name
    from transformers import LlamaConfig

    fields = {k: v for k, v in PRESETS["tiny"].items() if not k.startswith("_") and k != "model_type"}
    again = ckptbench.plan(LlamaConfig(**fields), **CARD)
    assert (again.layout, again.needed_bytes) == (plan.layout, plan.needed_bytes)


def test_trainer_with_plan_apply_and_the_callback(plan: Plan, tmp_path: Path) -> None:
    from transformers import Trainer, TrainingArguments

    from ckptbench.hf import PeakMemoryCallback

    model = ckptbench.apply(_tiny_llama(), plan)
    counts = [0] * 8
    for i, layer in enumerate(model.model.layers):
        # a layer that is checkpointed runs its MLP twice per step: in forward, and again in backward
        layer.mlp.gate_proj.register_forward_pre_hook(lambda *_, i=i: counts.__setitem__(i, counts[i] + 1))
    ids = torch.randint(0, 256, (16, plan.seq_len))
    data = [{"input_ids": row, "labels": row} for row in ids]
    lines: list[str] = []
    callback = PeakMemoryCallback(plan, steps=2, report=lines.append)
    args = TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=plan.micro_batch_size,
        gradient_accumulation_steps=plan.gradient_accumulation_steps, max_steps=2, use_cpu=True, report_to=[],
        logging_steps=1000, save_strategy="no", dataloader_num_workers=0,
    )
    Trainer(model=model, args=args, train_dataset=data, callbacks=[callback]).train()
    micro_steps = 2 * plan.gradient_accumulation_steps
    assert [i for i, c in enumerate(counts) if c == 2 * micro_steps] == list(plan.layers)
    assert all(c == micro_steps for i, c in enumerate(counts) if i not in plan.layers)
    assert len(callback.peaks) == 2 and all(p.allocated_bytes > 0 for p in callback.peaks)
    text = "\n".join(lines)
    top = max(p.reserved_bytes for p in callback.peaks)
    assert plan.needed_bytes is not None  # the plan fits
    assert f"peak reserved {top / 2**20:.2f} MiB (measured)" in text
    assert f"the plan ({plan.layout}, batch 8, sequence 128, fp32) needs {plan.needed_bytes / 2**20:.2f} MiB" in text


def test_apply_refuses_what_transformers_cannot_switch() -> None:
    with pytest.raises(ValueError, match="whole decoder layers only"):
        ckptbench.apply(_tiny_llama(), "all@mlp")
    model = ckptbench.apply(_tiny_llama(), "every:4")
    assert [layer.gradient_checkpointing for layer in model.model.layers] == [i % 4 == 0 for i in range(8)]
