"""`ckptbench advise`: the thread's question answered on CPU (golden 80-column output), every JSON number
labelled, nothing fitting in mixed precision with the ways out, bad flags, the bisection, and the transformers
and PyTorch snippets executed on a tiny LlamaForCausalLM."""

from __future__ import annotations

import io
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from ckptbench.advise.search import largest, smallest
from ckptbench.advise.snippets import megatron_setting, pytorch_code, torchtitan_setting, transformers_code
from ckptbench.cli.main import app
from ckptbench.config.layouts import parse_layout

GOLDEN = Path(__file__).parent / "fixtures" / "advise_a100_b2_b8_80col.txt"
THREAD = ["advise", "--model", "llama-7b", "--gpu", "a100-80gb", "--batch", "2", "--batch", "8", "--seq", "2048"]
LABELS = {"predicted", "estimated", "measured", "fitted", "transferred", "measure to know"}
runner = CliRunner()


def _run(args: list[str]) -> Any:
    # From the repository root: the default calibration names the committed runs relative to it.
    old = os.getcwd()
    os.chdir(Path(__file__).resolve().parent.parent)
    try:
        return runner.invoke(app, args, env={"COLUMNS": "80"})
    finally:
        os.chdir(old)


@pytest.fixture(scope="module")
def thread() -> tuple[Any, float]:
    """The thread's question answered once (core call, timed), for the golden table and the JSON."""
    from ckptbench.advise.advice import advise
    from ckptbench.advise.request import AdviseRequest

    old = os.getcwd()
    os.chdir(Path(__file__).resolve().parent.parent)  # the default calibration names runs relative to it
    try:
        start = time.process_time()
        advice = advise(AdviseRequest(model="llama-7b", gpu="a100-80gb", batches=(2, 8), seqs=(2048,)))
        return advice, time.process_time() - start
    finally:
        os.chdir(old)


def test_thread_question_matches_the_golden_80_column_output(thread: tuple[Any, float]) -> None:
    from rich.console import Console

    from ckptbench.render.advise import advise_renderable

    advice, cpu_s = thread
    console = Console(width=80, record=True, file=io.StringIO(), highlight=False, soft_wrap=False)
    console.print(advise_renderable(advice))  # as cli/advise.py prints it
    text = console.export_text()
    if os.environ.get("CKPTBENCH_REGOLD"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()
    assert all(len(line) <= 80 for line in text.splitlines())
    assert "…" not in text  # rich's ellipsis: nothing was cut to fit
    assert text.startswith("Assumed: llama-7b, bf16 (pure bf16")
    assert "Answer:\nBatch 2, sequence 2048: no checkpointing fits" in text
    assert "layer.gradient_checkpointing = i in CHECKPOINTED" in text
    # The done-when: under 30 s on a CPU (process time: the estimator's work, not the shared machine's load).
    assert cpu_s < 30


@pytest.fixture(scope="module")
def thread_json(thread: tuple[Any, float]) -> dict[str, Any]:
    from ckptbench.render.advise import advise_json_text

    return json.loads(advise_json_text(thread[0]))


def _numbers(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        if "value" in node and "unit" in node:
            yield node
        for value in node.values():
            yield from _numbers(value)
    elif isinstance(node, list):
        for value in node:
            yield from _numbers(value)


def test_json_labels_every_number(thread_json: dict[str, Any]) -> None:
    numbers = list(_numbers(thread_json))
    assert len(numbers) > 100
    assert {n["label"] for n in numbers} <= LABELS
    assert {n["label"] for n in numbers if n["unit"] == "s"} == {"transferred"}
    b2, b8 = thread_json["tables"]
    rows = {r["family"]: r for r in b2["rows"]}
    assert rows["none"]["fits"] is True
    # 'needed' is decided on the reserved bound (results/fit.py), above the predicted peak reserved
    assert rows["none"]["needed_bytes"]["value"] == (rows["none"]["peak_reserved_bound_bytes"]["value"]
                                                    + rows["none"]["context_bytes"]["value"])
    assert rows["none"]["peak_reserved_bound_bytes"]["value"] > rows["none"]["peak_reserved_bytes"]["value"]
    b8_rows = {r["family"]: r for r in b8["rows"]}
    assert b8_rows["none"]["fits"] is False and b8_rows["first:k"]["fits"] is True
    assert b8_rows["first:k"]["searched"].startswith("smallest k of 1..32 that fits")
    parts = thread_json["why"]["parts"]
    # what fills the memory at the peak: the predicted peak reserved and the context (the bound is a margin)
    assert sum(p["value"] for p in parts) == (rows["none"]["peak_reserved_bytes"]["value"]
                                              + rows["none"]["context_bytes"]["value"])


def test_first_k_is_the_smallest_that_fits(thread_json: dict[str, Any]) -> None:
    """The reported first:k fits and first:(k-1) does not (estimated again here, independently)."""
    from ckptbench.advise.request import AdviseRequest
    from ckptbench.estimator.api import estimate_points

    b8 = {r["family"]: r for r in thread_json["tables"][1]["rows"]}
    k = int(b8["first:k"]["layout"].split(":")[1])
    cfg = AdviseRequest(batches=(8,)).config(layouts=[f"first:{k - 1}", f"first:{k}"])
    fits = [e.fits for e in estimate_points(cfg, cfg.points_list(), gpu="a100-80gb",
                                            budget_bytes=79.25 * 2**30)]
    assert fits == [False, True]


def test_mixed_precision_nothing_fits_and_the_ways_out_have_numbers() -> None:
    result = _run(["advise", "--batch", "2", "--precision", "amp_bf16", "--observed", "70GB", "--format", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert not any(r["fits"] for r in data["tables"][0]["rows"])
    assert "nothing fits" in data["answers"][0]
    ways = {w["what"].split(" (")[0]: w for w in data["ways_out"] if w["fits"]}
    assert {"8-bit AdamW state", "optimizer state offloaded to the CPU", "LoRA r16"} <= set(ways)
    assert ways["LoRA r16"]["changes_what_is_trained"] is True
    for way in ways.values():
        assert way["needed_bytes"]["value"] < 79.25 * 2**30 and way["needed_bytes"]["label"].startswith("predicted")
    assert data["observed"][0].startswith("Observed 70.00 GiB: none at batch 2 runs out of memory")
    assert data["measure"].startswith("ckptbench sweep CONFIG")


@pytest.mark.parametrize(("args", "says"), [
    (["--model", "llama-70b"], "--model: unknown model 'llama-70b'"),
    (["--gpu", "a100"], "--gpu: unknown card 'a100'"),
    (["--precision", "bf8"], "--precision: unknown precision 'bf8'"),
    (["--batch", "0"], "--batch: give positive integers, got 0"),
    (["--batch", "2", "0", "--seq", "2048"], "--batch: give positive integers, got 2 0"),  # `--batch 2 8` spreads
    (["--seq", "8192"], "--seq: 8192 exceeds llama-7b's max_position_embeddings (4096)"),
    (["--observed", "80GiBx"], "--observed: '80GiBx' is not a memory size"),
    (["--allow", "dropout"], "--allow: unknown allow 'dropout'"),
])
def test_bad_flags_are_one_line_and_exit_2(args: list[str], says: str) -> None:
    result = _run(["advise", *args])
    assert result.exit_code == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0]


def test_bisection_finds_the_boundary_in_few_predictions() -> None:
    calls: list[int] = []

    def fits(k: int) -> bool:
        calls.append(k)
        return k >= 13

    assert smallest(fits, 1, 32) == 13 and len(calls) <= 7
    assert smallest(lambda k: False, 1, 32) is None
    assert largest(lambda n: n <= 5, 1, 32) == 5
    assert largest(lambda n: False, 1, 32) is None


def test_framework_settings_say_when_they_are_exact() -> None:
    assert megatron_setting(parse_layout("first:22", 32)).endswith("--recompute-num-layers 22 (exact)")
    assert megatron_setting(parse_layout("last:6", 32)).startswith("no exact equivalent")
    assert torchtitan_setting(parse_layout("all", 32)) == '[activation_checkpoint] mode = "full" (exact)'
    assert "(exact)" in torchtitan_setting(parse_layout("every:4+3", 32))
    assert torchtitan_setting(parse_layout("every:4", 32)).startswith("no exact equivalent")
    assert "No exact equivalent" in transformers_code(parse_layout("all@mlp", 32))


# -- the snippets, executed --------------------------------------------------------------------------


@pytest.fixture
def tiny_llama() -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=6,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)
    cfg._attn_implementation = "eager"
    return LlamaForCausalLM(cfg).train()


def _forward_counts(model: Any, path: str) -> list[int]:
    """How often each layer's module ``path`` starts in one forward and backward. A pre-hook on a module the layer
    calls: transformers checkpoints a layer's ``forward`` inside its own hooks, and early-stopping recomputation
    may end inside a module, after the last tensor it needs (as tests/test_model.py counts)."""
    counts = [0] * len(model.model.layers)
    for i, layer in enumerate(model.model.layers):
        module = layer.get_submodule(path)

        def hook(*_: Any, i: int = i) -> None:
            counts[i] += 1

        module.register_forward_pre_hook(hook)
    ids = torch.randint(0, 64, (2, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    return counts


@pytest.mark.parametrize("layout", ["every:2", "first:4", "last:1", "none"])
def test_transformers_snippet_checkpoints_exactly_the_layouts_layers(tiny_llama: Any, layout: str) -> None:
    plan = parse_layout(layout, 6)
    exec(transformers_code(plan), {"model": tiny_llama})  # the snippet the user will paste
    counts = _forward_counts(tiny_llama, "mlp.gate_proj")
    # a checkpointed layer runs its forward twice: once in forward, once recomputed in backward
    assert [i for i, c in enumerate(counts) if c == 2] == list(plan.layers)
    assert set(counts) <= {1, 2}


def test_pytorch_snippet_wraps_the_chosen_submodules(tiny_llama: Any) -> None:
    plan = parse_layout("range:1-3@mlp", 6)
    exec(pytorch_code(plan), {"model": tiny_llama})
    attn = [0] * 6
    for i, layer in enumerate(tiny_llama.model.layers):
        layer.self_attn.q_proj.register_forward_pre_hook(lambda *_, i=i: attn.__setitem__(i, attn[i] + 1))
    assert _forward_counts(tiny_llama, "mlp.gate_proj") == [1, 2, 2, 2, 1, 1]
    assert attn == [1] * 6  # attention is not recomputed
