"""advise where users stand: a model by its config.json (or folder) or a Hugging Face id (the local cache, offline),
a card by key, alias or memory size, several cards with FSDP2 or DDP (answered per rank, with the launchers'
settings); and each refusal one line with exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ckptbench.cli.main import app

pytestmark = pytest.mark.trace_cache  # its traces kept on disk, shared with the other files that ask for them

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()
# A LLaMA-family config.json the project has never seen (no preset has these sizes).
UNSEEN = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 320, "hidden_size": 96,
    "intermediate_size": 256, "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16", "tie_word_embeddings": False,
}
SMALL = ["--batch", "2", "--seq", "64", "--precision", "bf16"]


def _advise(*args: str) -> Any:
    return runner.invoke(app, ["advise", *args], env={"COLUMNS": "80"})


@pytest.fixture(scope="module")
def unseen(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("models") / "Unseen-6L"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(UNSEEN))
    return folder


def test_a_config_json_or_its_folder_is_answered_as_a_preset_would_be(unseen: Path) -> None:
    by_file = _advise("--model", str(unseen / "config.json"), "--gpu", "rtx-4090", *SMALL, "--format", "json")
    assert by_file.exit_code == 0, by_file.output
    data = json.loads(by_file.stdout)
    assert data["assumptions"].startswith("Assumed: Unseen-6L, bf16")
    assert data["tables"][0]["rows"][0]["needed_bytes"]["label"] == "predicted"
    by_folder = _advise("--model", str(unseen), "--gpu", "rtx-4090", *SMALL, "--format", "json")
    assert by_folder.exit_code == 0 and json.loads(by_folder.stdout)["tables"] == data["tables"]


def test_a_model_ckptbench_does_not_build_is_refused_in_one_line(tmp_path: Path) -> None:
    moe = tmp_path / "config.json"
    moe.write_text(json.dumps({**UNSEEN, "model_type": "mixtral", "num_local_experts": 8}))
    result = _advise("--model", str(moe), *SMALL)
    assert result.exit_code == 2 and result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1 and "--model:" in result.stderr


def _hub_cache(root: Path, repo: str, fields: dict[str, Any]) -> None:
    """A Hugging Face cache holding one repo's config.json, laid out as huggingface_hub lays it out."""
    revision = "0" * 40
    repo_dir = root / f"models--{repo.replace('/', '--')}"
    (repo_dir / "refs").mkdir(parents=True)
    (repo_dir / "refs" / "main").write_text(revision)
    snapshot = repo_dir / "snapshots" / revision
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(fields))


def _offline(cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "COLUMNS": "80",
           "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "ckptbench", "advise", *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=300)


def test_a_hub_id_from_the_local_cache_offline_and_one_line_without_it(tmp_path: Path) -> None:
    cache = tmp_path / "hub"
    _hub_cache(cache, "acme/tiny-unseen", UNSEEN)
    found = _offline(cache, "--model", "acme/tiny-unseen", "--gpu", "24GiB", *SMALL, "--format", "json")
    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout)["assumptions"].startswith("Assumed: tiny-unseen, bf16")
    missing = _offline(cache, "--model", "acme/not-cached", *SMALL)
    assert missing.returncode == 2 and missing.stdout == ""
    assert missing.stderr.strip().splitlines() == [
        "error: --model: acme/not-cached's config.json is not in the local Hugging Face cache and the Hub is offline "
        "(HF_HUB_OFFLINE); download it once with network, or give the config.json's path"]


@pytest.mark.parametrize(("gpu", "usable"), [("rtx-4090", "23.64 GiB usable (estimated)"),
                                             ("4090", "23.64 GiB usable (estimated)"),
                                             ("h100-pcie", "79.11 GiB usable (estimated)"),
                                             ("24GiB", "24.00 GiB usable (given)")])
def test_a_card_by_key_alias_or_size(gpu: str, usable: str) -> None:
    result = _advise("--model", "tiny", "--gpu", gpu, *SMALL, "--format", "json")
    assert result.exit_code == 0, result.output
    assert usable in json.loads(result.stdout)["assumptions"]


def test_peaks_only_for_a_card_given_by_its_size() -> None:
    refused = _advise("--model", "tiny", "--gpu", "rtx-4090", "--tflops", "100", *SMALL)
    assert refused.exit_code == 2 and "--tflops: only with --gpu SIZE" in refused.stderr


@pytest.mark.parametrize(("parallel", "launcher"), [("fsdp2:2", "fsdp_version: 2"), ("ddp:2", "MULTI_GPU")])
def test_several_cards_are_answered_per_rank_with_the_launchers_settings(parallel: str, launcher: str) -> None:
    result = _advise("--model", "tiny", "--gpu", "24GiB", "--parallel", parallel, *SMALL, "--format", "json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert "2 x 24.00 GiB card" in data["assumptions"] and "every figure per rank, rank 0" in data["assumptions"]
    assert launcher in data["code"]["accelerate"] and "num_processes: 2" in data["code"]["accelerate"]
    assert "[parallelism] data_parallel_" in data["code"]["torchtitan"]
    assert "torchrun --nproc_per_node 2" in data["code"]["transformers"]
    bad = _advise("--parallel", "fsdp3:2", *SMALL)
    assert bad.exit_code == 2 and "--parallel:" in bad.stderr
