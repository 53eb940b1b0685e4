"""The card table (config/cards.py): at least 20 cards, every figure with its source, dense peaks only, names and
aliases that pick one card each; `ckptbench gpus` lists them; --gpu takes a key, an alias, torch's name or a size."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from ckptbench.config.cards import AMBIGUOUS, BY_KEY, CARDS, card_named, card_or_size, find_card
from ckptbench.errors import ConfigError
from ckptbench.estimator.gpus import GPUS, gpu_for_name, gpu_model
from ckptbench.train.flops import peak_tflops_for

runner = CliRunner()


def test_at_least_twenty_cards_each_figure_with_its_source() -> None:
    assert len(CARDS) >= 20
    assert len(BY_KEY) == len(CARDS)  # keys are unique
    for card in CARDS:
        assert card.memory_source and card.flops_source and card.bandwidth_source, card.key
        assert (card.context_bytes is None) is (not card.context_source), card.key
        assert 8 * 2**30 < card.memory_bytes < 200 * 2**30, card.key
        assert 0.1e12 < card.bandwidth_bytes_per_s < 10e12, card.key
        # Dense peaks: the sparse datasheet figures are twice these (B200's dense bf16 is 2,250 TFLOP/s)
        assert card.bf16_tflops is None or 50 <= card.bf16_tflops <= 2300, card.key
        assert card.bf16_tflops is not None or card.capability < (8, 0) or card.key == "a10g", card.key


def test_names_and_aliases_pick_one_card_each() -> None:
    spellings = [s for c in CARDS for s in (c.key, *c.aliases)]
    assert len(spellings) == len(set(spellings))
    names = [n for c in CARDS for n in (c.name, *c.names)]
    assert len(names) == len(set(names))
    assert find_card("4090") is BY_KEY["rtx-4090"] and find_card("RTX 4090") is BY_KEY["rtx-4090"]
    assert find_card("NVIDIA GeForce RTX 4090") is BY_KEY["rtx-4090"]
    assert card_named("NVIDIA H200 141GB HBM3e") is BY_KEY["h200"]  # another driver's name for the same card
    for short in AMBIGUOUS:
        assert find_card(short) is None  # 'h100' is three cards: refused with the list


def test_the_five_cards_ckptbench_modelled_before_keep_their_figures() -> None:
    """Estimates on these cards must not change: their memory, context and peaks stay as they were."""
    assert GPUS["h200"].total_bytes == 150_109_880_320 and GPUS["h200"].context_bytes == 794_568_949
    assert GPUS["a100-80gb"].total_bytes == int(79.25 * 2**30)
    assert GPUS["h100-80gb"].context_bytes == GPUS["h200"].context_bytes  # the H200's measured one stands in
    assert [GPUS[k].bf16_peak_tflops for k in ("h200", "h100-80gb", "a100-80gb", "l40s")] == [989, 989, 312, 362.05]


def test_peaks_by_torch_name_no_longer_match_a_substring() -> None:
    assert peak_tflops_for("NVIDIA H100 PCIe") == 756.0  # the old substring table said 989 ('H100' in the name)
    assert peak_tflops_for("NVIDIA GH200 480GB") == BY_KEY["gh200"].bf16_tflops
    assert peak_tflops_for("NVIDIA A800-SXM4-80GB") == 312.0  # an export twin of the A100
    assert peak_tflops_for("Tesla V100-SXM2-32GB") is None  # no bf16 tensor cores
    assert gpu_for_name("NVIDIA GeForce RTX 4090") is GPUS["rtx-4090"]


def test_a_card_by_its_size() -> None:
    card = gpu_model("24GiB")
    assert card.total_bytes == 24 * 2**30 and card.memory_label == "given" and card.bf16_peak_tflops is None
    assert card_or_size("24GiB") == 24 * 2**30
    with pytest.raises(ConfigError, match="is ambiguous"):
        card_or_size("24GB")
    with pytest.raises(ConfigError, match="unknown card 'h1000'"):
        card_or_size("h1000")
    with pytest.raises(ConfigError, match=r"did you mean 'h100-80gb' or 'h100-pcie' or 'h100-nvl'"):
        card_or_size("h100")


def test_gpus_lists_every_card_with_sources() -> None:
    from ckptbench.cli.main import app

    table = runner.invoke(app, ["gpus"], env={"COLUMNS": "80"})
    assert table.exit_code == 0 and all(f"│ {c.key} " in table.stdout for c in CARDS)
    assert all(len(line) <= 80 for line in table.stdout.splitlines())
    data = json.loads(runner.invoke(app, ["gpus", "--format", "json"]).stdout)
    assert [d["key"] for d in data] == [c.key for c in CARDS]
    assert all(d["memory_bytes"]["source"] and d["context_bytes"]["source"] for d in data)
    markdown = runner.invoke(app, ["gpus", "--format", "markdown"]).stdout
    assert "| memory source | context source | flops source | bandwidth source |" in markdown.splitlines()[0]
