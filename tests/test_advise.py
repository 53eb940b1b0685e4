"""`ckptbench advise`: the thread's question answered on CPU (golden 80-column output) with the default headroom,
every JSON number labelled, the fewest layers that one more layer cannot break (every count predicted), gradient
accumulation weighed, nothing fitting in mixed precision with ways out that can be followed, the same answer as
the README's table, bad flags refused before torch is imported, and the code executed on a tiny model."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from ckptbench.advise.record import FamilyScan
from ckptbench.advise.snippets import (
    Setup,
    megatron_setting,
    model_code,
    pytorch_code,
    torchtitan_setting,
    trainer_arguments,
    transformers_code,
)
from ckptbench.advise.verdict import Limit, Outcome, Verdict, judge_needed
from ckptbench.analysis.boundary import largest, smallest
from ckptbench.cli.main import app
from ckptbench.config.layouts import parse_layout
from ckptbench.estimator.gpus import gpu_model
from ckptbench.units import GIB
from tests._advise_shared import ROOT, advise_shared, at_root, rendered

pytestmark = pytest.mark.trace_cache  # its traces kept on disk, shared with the other files that ask for them

GOLDEN = Path(__file__).parent / "fixtures" / "advise_a100_b2_b8_80col.txt"
THREAD = {"model": "llama-7b", "gpu": "a100-80gb", "batches": (2, 8), "seqs": (2048,)}
LABELS = {"predicted", "estimated", "measured", "fitted", "transferred", "measure to know", "given"}
runner = CliRunner()


def _run(args: list[str]) -> Any:
    with at_root():  # the default calibration names the committed runs relative to it
        return runner.invoke(app, args, env={"COLUMNS": "80"})


@pytest.fixture(scope="module")
def thread() -> Any:
    return advise_shared(**THREAD)


def test_thread_question_matches_the_golden_80_column_output(thread: Any) -> None:
    text = rendered(thread)
    if os.environ.get("CKPTBENCH_REGOLD"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()
    assert all(len(line) <= 80 for line in text.splitlines())
    assert "…" not in text  # rich's ellipsis: nothing was cut to fit
    assert text.startswith("Assumed: llama-7b, bf16 (pure bf16")
    assert "Batch 2, sequence 2048, bf16: do not checkpoint" in text
    assert "With HF Trainer's bf16=True (amp_bf16" in text  # the second precision, in one sentence


def test_the_largest_batch_probes_traces_are_the_callers_estimators(thread: Any) -> None:
    # The probes ran in a forked process (advise/advice.py, estimator/workers.py: Background); what they traced and
    # estimated is handed back, so that a caller's Estimator serves the next question without tracing them again.
    from ckptbench.advise.request import AdviseRequest
    from tests._advise_shared import estimator_for

    estimator = estimator_for(AdviseRequest(model="llama-7b", gpu="a100-80gb"))  # THREAD's model, optimizer, card
    ((batch, estimate, _),) = thread.largest.values()
    point = dataclasses.replace(thread.tables[0].none.point, layout="all", batch_size=batch, micro_batches=1)
    cache, estimator.cache = estimator.cache, None  # what this process holds, not what a disk cache kept
    try:
        assert batch not in THREAD["batches"] and not estimator.jobs([point])
        assert estimator.estimate(point, budget_bytes=estimator.gpu.total_bytes) == estimate
    finally:
        estimator.cache = cache


def test_the_answer_keeps_the_default_headroom_and_states_its_margin(thread: Any) -> None:
    limit = thread.limit
    card = gpu_model("a100-80gb")
    assert limit.budget_bytes == card.total_bytes and limit.headroom_bytes == int(card.total_bytes * 0.05)
    for t in thread.tables:
        assert t.choice is not None and t.choice.verdict.needed_bytes is not None
        assert t.choice.verdict.needed_bytes <= limit.limit_bytes  # 'fits' leaves the headroom
        assert t.choice.verdict.margin_bytes == limit.limit_bytes - t.choice.verdict.needed_bytes
        assert f"below the {limit.limit_bytes / GIB:.2f} GiB limit" in thread.answers[thread.tables.index(t)]


def test_the_batch_8_answer_weighs_micro_batches(thread: Any) -> None:
    """At batch 8 no checkpointing does not fit: accumulated micro-batches are weighed against checkpoint layouts
    at the batch itself, each with its predicted time, and the fastest that fits is the answer."""
    b8 = thread.tables[1]
    assert not b8.none.fits and b8.accumulation
    assert {o.accumulation for o in b8.accumulation} <= {2, 4, 8}
    fitting = [o for o in b8.rows if o.fits]
    assert all(o.time is not None for o in fitting)
    fastest = min(fitting, key=lambda o: o.time.step_time_s)
    assert b8.choice is fastest and b8.choice.accumulation > 1
    assert b8.fewest is not None and b8.fewest.accumulation == 1 and b8.fewest.layout.startswith(("first:", "last:"))
    assert f"gradient_accumulation_steps={b8.choice.accumulation}," in thread.code.transformers
    assert f"per_device_train_batch_size={b8.choice.point.batch_size}," in thread.code.transformers


def test_rows_that_repeat_another_rows_layers_are_left_out(thread: Any) -> None:
    """No family row when no checkpointing fits (batch 2); every:1, first:32 and last:32 are all; all@selective
    wraps the same modules as all, per op, and stays."""
    b2, b8 = thread.tables
    assert [o.family for o in b2.options] == ["none", "all", "all@attn", "all@mlp", "all@attn+mlp", "all@selective"]
    assert [o.family for o in b8.options] == ["none", "all", "first:k", "last:k", "all@attn", "all@mlp",
                                              "all@attn+mlp", "all@selective"]  # every:n is every:1 = all here


def test_advise_and_the_readme_table_give_the_same_fewest_layers(thread: Any) -> None:
    """Claim 1's fewest first:k at batch 8 (the README's answers table, generated) and advise's fewest layers at
    batch 8 itself: the same layout."""
    readme = (ROOT / "README.md").read_text()
    found = re.search(r"b=8: none OOM, partial layouts run; (first:\d+) fits \(predicted\)", readme)
    assert found is not None
    assert thread.tables[1].fewest.layout == found.group(1)


@pytest.fixture(scope="module")
def thread_json(thread: Any) -> dict[str, Any]:
    from ckptbench.render.advise import advise_json_text

    return json.loads(advise_json_text(thread))


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
    assert {n["label"].split(":")[0] for n in numbers} <= LABELS
    # bf16 is fitted on the H200 and transferred to the A100; amp_bf16 (the second precision's tables), a cell nobody
    # measured, is modelled from each op's FLOPs and bytes on the H200 and transferred the same way
    assert {n["label"] for n in _numbers(thread_json["tables"]) if n["unit"] == "s"} == {"transferred"}
    assert {n["label"] for n in _numbers(thread_json["also"]) if n["unit"] == "s"} == {"transferred"}
    b2, b8 = thread_json["tables"]
    rows = {r["family"]: r for r in b2["rows"]}
    assert rows["none"]["fits"] is True and b2["choice"] == "none"
    # 'needed' is decided on the reserved bound (results/fit.py), above the predicted peak reserved
    assert rows["none"]["needed_bytes"]["value"] == (rows["none"]["peak_reserved_bound_bytes"]["value"]
                                                    + rows["none"]["context_bytes"]["value"])
    assert rows["none"]["peak_reserved_bound_bytes"]["value"] > rows["none"]["peak_reserved_bytes"]["value"]
    b8_rows = {r["family"]: r for r in b8["rows"]}
    assert b8_rows["none"]["fits"] is False and b8_rows["first:k"]["fits"] is True
    assert b8_rows["none"]["step_time_s"]["value"] is None  # a row that does not fit shows no time
    assert b8_rows["first:k"]["searched"].startswith("every k of 1..32 predicted")
    assert b8["accumulation"] and all(r["accumulation_steps"] > 1 for r in b8["accumulation"])
    # One figure per meaning: what fills the memory adds up to the table's 'needed', the bound's margin named.
    parts = thread_json["why"]["parts"]
    assert sum(p["value"] for p in parts) == rows["none"]["needed_bytes"]["value"]
    assert any(p["name"].startswith("bound's margin") for p in parts)


# -- the fewest layers that one more layer cannot break ----------------------------------------------------


def _scan(family: str, fits: list[bool]) -> FamilyScan:
    limit = Limit(gpu_model("a100-80gb"), 100, 0, "0")
    verdicts = tuple(judge_needed(50 if f else 150, limit, label="predicted") for f in fits)
    return FamilyScan(family, len(fits), verdicts)


def test_the_robust_count_is_the_fewest_layers_every_larger_count_also_fits() -> None:
    # first:k, k = 1..8: k=3 fits alone, k=4 does not, k >= 5 fit
    scan = _scan("first", [False, False, True, False, True, True, True, True])
    assert scan.robust == 5 and scan.isolated == 3 and not scan.monotone
    assert "first:3 fits too" in scan.describe()
    assert _scan("first", [False] * 7 + [True]).robust == 8
    assert _scan("first", [False] * 8).robust is None and _scan("first", [False] * 8).isolated is None
    # every:n: larger n is fewer layers: n = 1..3 fit, n = 4 not, n = 6 alone
    every = _scan("every", [True, True, True, False, False, True, False, False])
    assert every.robust == 3 and every.isolated == 6 and every.more_layers(3) == [2, 1]


@pytest.fixture(scope="module")
def qwen3_no_headroom() -> Any:
    return advise_shared(model="qwen3-8b", gpu="a100-80gb", batches=(2,), seqs=(2048,), precision="bf16",
                         headroom="0")


def test_qwen3_8b_batch_2_on_an_a100_answers_the_count_one_more_layer_cannot_break(qwen3_no_headroom: Any) -> None:
    """Qwen3-8B at batch 2 with no headroom: first:6 fits, first:7 does not, first:8 and every larger count fit.
    The answer is first:8, and the isolated first:6 is named, with the count that breaks it."""
    t = qwen3_no_headroom.tables[0]
    first = next(o for o in t.options if o.family == "first:k")
    assert first.layout == "first:8" and first.scan is not None
    assert first.scan.isolated == 6 and not first.scan.fits(7)
    assert all(first.scan.fits(k) for k in range(8, 37))
    text = qwen3_no_headroom.answers[0]
    assert "first:6 fits too" in text and "but first:7 does not" in text and "non-monotone" in text
    default = advise_shared(model="qwen3-8b", gpu="a100-80gb", batches=(2,), seqs=(2048,), precision="bf16")
    robust = next(o for o in default.tables[0].options if o.family == "first:k")
    assert robust.layout == "first:13" and robust.scan is not None and robust.scan.monotone


# -- nothing fits: ways out that can be followed ----------------------------------------------------------


@pytest.fixture(scope="module")
def amp() -> Any:
    return advise_shared(model="llama-7b", gpu="a100-80gb", batches=(2,), seqs=(2048,), precision="amp_bf16",
                         observed="70GiB")


def test_mixed_precision_nothing_fits_and_the_way_out_is_the_code(amp: Any) -> None:
    t = amp.tables[0]
    assert t.stuck and not any(o.fits for o in t.rows)
    assert "nothing fits the 75.29 GiB limit" in amp.answers[0]
    ways = {w.what.split(" (")[0]: w for w in amp.ways_out}
    assert {"8-bit AdamW state", "AdamW state on the CPU", "LoRA r16"} <= set(ways)
    for way in amp.ways_out:  # each names its batch and sequence length
        assert way.point.batch_size == 2 and way.point.seq_len == 2048
    assert ways["LoRA r16"].changes_training
    eight = ways["8-bit AdamW state"]
    assert eight.fits and eight.verdict.needed_bytes <= amp.limit.limit_bytes
    # The printed code applies the recommended way out (8-bit AdamW, its layout), not 'disable checkpointing'.
    assert amp.code_for.startswith("the way out: 8-bit AdamW state")
    assert 'optim="adamw_bnb_8bit"' in amp.code.transformers and "bnb.optim.AdamW8bit" in amp.code.pytorch
    assert "bf16=True," in amp.code.transformers
    assert "gradient_checkpointing_disable" not in amp.code.transformers
    assert amp.observed[0].startswith("Observed 70.00 GiB: all at batch 2: the replayed caching allocator")


def test_no_way_out_repeats_what_the_question_already_has() -> None:
    advice = advise_shared(model="llama-7b", gpu="a100-40gb", batches=(8,), seqs=(2048,), precision="bf16",
                           optimizer="adamw_8bit")
    assert all("8-bit" not in w.what for w in advice.ways_out)
    assert all(t.none.verdict.predicted for t in advice.tables)  # traced, or by labelled arithmetic


# -- flags ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("args", "says"), [
    (["--model", "llama-70b"], "--model: unknown model 'llama-70b'"),
    (["--gpu", "a100"], "--gpu: unknown card 'a100'"),
    (["--precision", "bf8"], "--precision: unknown precision 'bf8'"),
    (["--batch", "0"], "--batch: give positive integers, got 0"),
    (["--batch", "2", "0", "--seq", "2048"], "--batch: give positive integers, got 2 0"),  # `--batch 2 8` spreads
    (["--seq", "8192"], "--seq: 8192 exceeds llama-7b's max_position_embeddings (4096)"),
    (["--observed", "80GiBx"], "--observed: '80GiBx' is not a memory size"),
    (["--observed", "9" * 400 + "GB"], "is not a memory size"),
    (["--allow", "dropout"], "--allow: unknown allow 'dropout'"),
    (["--attention", "flash"], "--attention: unknown attention 'flash'; allowed: sdpa, eager"),
    (["--model", "gemma-2-9b", "--attention", "sdpa"],
     "--attention: Gemma-2's code runs eager attention only, not sdpa"),
    (["--format", "csv"], "'csv' is not one of 'table', 'markdown', 'json'"),
    (["--budget", "100GiB"], "--budget: 100.00 GiB is more than the a100-80gb's 79.25 GiB usable"),
    (["--headroom", "100%"], "--headroom: '100%' is not a percentage"),
])
def test_bad_flags_are_one_line_and_exit_2(args: list[str], says: str) -> None:
    result = _run(["advise", *args])
    assert result.exit_code == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0]


def test_bad_flags_are_refused_before_torch_is_imported() -> None:
    """A mistyped card, model or format is refused without importing torch (what took seconds before)."""
    code = ("import sys\nfrom ckptbench.cli.main import main\nsys.argv = ['ckptbench', 'advise', '--gpu', 'a1000']\n"
            "try:\n    main()\nexcept SystemExit as e:\n    print(e.code, 'torch' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.stdout.split() == ["2", "False"], done.stderr
    assert "--gpu: unknown card 'a1000'" in done.stderr


def test_help_offers_only_the_formats_advise_writes() -> None:
    result = _run(["advise", "--help"])
    assert result.exit_code == 0
    assert "csv" not in result.stdout and "--headroom" in result.stdout and "--budget" in result.stdout


def test_a_budget_and_a_headroom_change_the_limit() -> None:
    advice = advise_shared(**THREAD, budget="70GiB", headroom="2GiB", precision="bf16")
    assert advice.limit.limit_bytes == 68 * GIB
    assert "68.00 GiB limit (the 70.00 GiB budget less 2GiB headroom, 2.00 GiB)" in advice.assumptions
    none2 = advice.tables[0].none
    assert none2.fits is (none2.verdict.needed_bytes <= 68 * GIB)


def test_bisection_finds_the_boundary_in_few_predictions() -> None:
    calls: list[int] = []

    def fits(k: int) -> bool:
        calls.append(k)
        return k >= 13

    assert smallest(fits, 1, 32) == 13 and len(calls) <= 7
    assert smallest(lambda k: False, 1, 32) is None
    assert largest(lambda n: n <= 5, 1, 32) == 5
    assert largest(lambda n: False, 1, 32) is None


def test_verdict_reasons_read_their_own_numbers() -> None:
    card = gpu_model("a100-80gb")
    limit = Limit(card, card.total_bytes, 4 * GIB, "4GiB")
    above_limit = judge_needed(card.total_bytes - GIB, limit, label="predicted")
    assert above_limit.outcome is Outcome.ABOVE_LIMIT and "3.00 GiB above the 75.25 GiB limit" in above_limit.reason()
    above_card = judge_needed(card.total_bytes + GIB, limit, label="predicted")
    assert above_card.outcome is Outcome.ABOVE_BUDGET
    assert above_card.reason() == "needs 80.25 GiB, 1.00 GiB above a100-80gb's 79.25 GiB usable"
    oom = Verdict(Outcome.ALLOCATOR_OOM, limit, None, 72 * GIB, oom_request_bytes=GIB, oom_reserved_bytes=78 * GIB)
    assert "allocated peak 72.00 GiB is below the card's 79.25 GiB" in oom.reason()  # fragmentation, not size
    tight = judge_needed(limit.limit_bytes - GIB // 2, limit, label="predicted")
    assert tight.fits and tight.tight


def test_framework_settings_say_when_they_are_exact() -> None:
    assert megatron_setting(parse_layout("first:22", 32)).endswith("--recompute-num-layers 22 (exact)")
    assert megatron_setting(parse_layout("last:6", 32)).startswith("no exact equivalent")
    assert torchtitan_setting(parse_layout("all", 32)) == '[activation_checkpoint] mode = "full" (exact)'
    assert "(exact)" in torchtitan_setting(parse_layout("every:4+3", 32))
    assert torchtitan_setting(parse_layout("every:4", 32)).startswith("no exact equivalent")
    assert "No exact equivalent" in transformers_code(parse_layout("all@mlp", 32))


def test_native_every_n_layers_where_transformers_offers_it() -> None:
    native = Setup(parse_layout("every:4", 32), micro_batch=2, native_every_n=True)
    assert "activation_checkpointing_enable(every_n_layers=4," in model_code(native)
    assert '"every_n_layers": 4}' in trainer_arguments(native) and "gradient_checkpointing=True," in \
        trainer_arguments(native)
    first = Setup(parse_layout("first:5", 32), micro_batch=2, native_every_n=True)
    assert "first:5 is not an every_n_layers layout" in model_code(first)  # it says it cannot express it
    assert "gradient_checkpointing=False," in trainer_arguments(first)


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


@pytest.mark.parametrize(("layout", "native"), [("every:2", False), ("every:2", True), ("first:4", False),
                                                 ("last:1", False), ("none", False)])
def test_transformers_snippet_checkpoints_exactly_the_layouts_layers(tiny_llama: Any, layout: str,
                                                                     native: bool) -> None:
    from ckptbench.train.checkpointing import transformers_switches

    if native and not transformers_switches()[1]:
        pytest.skip("this transformers has no every_n_layers")
    plan = parse_layout(layout, 6)
    api = transformers_switches()[0]
    exec(model_code(Setup(plan, micro_batch=2, native_every_n=native, activation_api=api)),  # what is pasted
         {"model": tiny_llama})
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


def test_ways_out_are_traced_side_by_side_before_any_is_judged() -> None:
    """Every way out the question does not take, at no checkpointing and at all layers, is handed to the predictor in
    one ``warm`` (its traces then run on every core, each variant's short model holding both layouts) before the first
    verdict; the variants the question has are left out, and judging stops at a variant's first layout that fits."""
    from types import SimpleNamespace

    from ckptbench.advise.ways_out import ways_out
    from ckptbench.config.grid import Point

    base = Point(precision="bf16", lora="none", layout="none", seq_len=2048, batch_size=8, model="llama-7b",
                 optimizer="adamw_8bit")
    calls: list[tuple[str, Any]] = []

    class Stub:
        def warm(self, points: list[Point]) -> None:
            calls.append(("warm", [(p.layout, p.optimizer, p.optimizer_offload, p.parallel, p.lora) for p in points]))

        def verdict(self, point: Point) -> Any:
            calls.append(("verdict", point.layout))
            return SimpleNamespace(fits=point.layout == "none" and point.lora == "r16")

    table = SimpleNamespace(none=SimpleNamespace(point=base))
    request = SimpleNamespace(allow=(), parallel="none")
    out = ways_out(Stub(), table, request)  # type: ignore[arg-type]
    assert calls[0] == ("warm", [(layout, "adamw_8bit", offload, parallel, lora)
                                 for offload, parallel, lora in (("cpu", "none", "none"), ("none", "fsdp2:2", "none"),
                                                                  ("none", "none", "r16"))
                                 for layout in ("none", "all")])
    assert calls[1:] == [("verdict", lay) for lay in ("none", "all", "none", "all", "none")]
    assert [w.point.layout for w in out] == ["none", "all", "none", "all", "none"] and out[-1].fits


def _counted_replays(monkeypatch: pytest.MonkeyPatch, estimator: Any) -> list[tuple[int, int]]:
    """(points asked, replays run) of every ``estimate_each`` call from now on (the replays in this process)."""
    monkeypatch.setenv("CKPTBENCH_WORKERS", "1")
    replays, calls = [0], []
    each, one = estimator.estimate_each, estimator._estimate

    def counted(*args: Any, **kwargs: Any) -> Any:
        replays[0] += 1
        return one(*args, **kwargs)

    def asked(points: Any, **kwargs: Any) -> Any:
        before = replays[0]
        found = each(points, **kwargs)
        calls.append((len(points), replays[0] - before))
        return found

    monkeypatch.setattr(estimator, "_estimate", counted)
    monkeypatch.setattr(estimator, "estimate_each", asked)
    return calls


def test_a_tables_rows_are_replayed_together_even_where_none_fits(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each row of a table shows its estimate (reserved bytes, where the allocator runs out), fitting or not: the six
    # are replayed side by side at once (Predictor.warm_rows), not one by one as the rows are made, where ``warm``'s
    # shortcut (an allocated peak alone above the limit needs no replay for a verdict) would have left them.
    from ckptbench.advise.predictor import PRIMED, Predictor, family_rows
    from ckptbench.advise.request import AdviseRequest

    request = AdviseRequest(model="tiny", gpu="8MiB", batches=(2,), seqs=(128,), precision="bf16").checked()
    cfg = request.config(layouts=PRIMED)
    pred = Predictor(cfg, request.limit(), None)
    pred.estimator.cache = None
    calls = _counted_replays(monkeypatch, pred.estimator)
    rows = family_rows(pred, next(p for p in cfg.points_list() if p.layout == "none"))
    assert [r.layout for r in rows] == list(PRIMED) and not any(r.fits for r in rows)
    assert all(r.verdict.allocated_bytes and r.verdict.allocated_bytes > pred.limit.limit_bytes for r in rows)
    assert calls[0] == (6, 6) and all(n == 0 for _, n in calls[1:])


def test_a_table_whose_none_exceeds_the_limit_by_its_allocated_peak_replays_rows_and_counts_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Where no checkpointing is over the limit by its allocated peak alone (known from the traces, before any replay),
    # its table's family counts need no replayed verdict of it first: they are replayed with the rows, in one batch
    # (those whose own allocated peak is over the limit are judged without one); the rows made after replay nothing.
    from ckptbench.advise.predictor import FAMILIES, PRIMED, Predictor, family_rows, warm_tables
    from ckptbench.advise.request import AdviseRequest

    request = AdviseRequest(model="tiny", gpu="100MiB", batches=(8,), seqs=(256,), precision="bf16").checked()
    cfg = request.config(layouts=PRIMED)
    pred = Predictor(cfg, request.limit(), None)
    pred.estimator.cache = None
    (base,) = [p for p in cfg.points_list() if p.layout == "none"]
    calls = _counted_replays(monkeypatch, pred.estimator)
    warm_tables(pred, [base])
    n = cfg.model.num_layers
    counts = [dataclasses.replace(base, layout=f"{f}:{c}") for f in FAMILIES for c in range(1, n + 1)]
    under = [p for p in counts if not pred.over_by_allocation(p)]
    assert pred.over_by_allocation(base) and 0 < len(under) < len(counts)
    assert [c for c in calls if c[1]] == [(len(PRIMED) + len(under),) * 2]
    calls.clear()
    rows = family_rows(pred, base)
    assert not rows[0].fits and all(n == 0 for _, n in calls)


def test_the_tables_of_several_batches_are_replayed_in_two_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    # warm_tables: every row of every table, then every family count of the tables where no checkpointing does not
    # fit, each set side by side; the tables made after replay nothing more.
    from ckptbench.advise.predictor import PRIMED, Predictor, family_rows, warm_tables
    from ckptbench.advise.request import AdviseRequest

    request = AdviseRequest(model="tiny", gpu="600MiB", batches=(4, 8), seqs=(256,), precision="bf16").checked()
    cfg = request.config(layouts=PRIMED)
    pred = Predictor(cfg, request.limit(), None)
    pred.estimator.cache = None
    bases = [p for p in cfg.points_list() if p.layout == "none"]
    calls = _counted_replays(monkeypatch, pred.estimator)
    warm_tables(pred, bases)
    replayed = [c for c in calls if c[1]]
    assert len(replayed) == 2 and replayed[0] == (12, 12)  # the rows, then the family counts of both tables
    assert replayed[1][0] == 2 * 3 * cfg.model.num_layers
    calls.clear()
    tables = [family_rows(pred, base) for base in bases]
    assert not any(rows[0].fits for rows in tables) and any(o.fits for rows in tables for o in rows)
    assert calls and all(n == 0 for _, n in calls)
