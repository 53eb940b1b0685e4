"""Labels: which columns are measured and which predicted; --gpu predicts for that card; card aliases."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from ckptbench.cli.main import app
from ckptbench.errors import ConfigError
from ckptbench.estimator.gpus import gpu_model, suggest_cards

# Estimates of one config are made once per process and shared (tests/_est_shared.py).
pytestmark = pytest.mark.usefixtures("shared_estimates")

ROOT = Path(__file__).parents[1]
TINY_CONFIG = ROOT / "tests" / "fixtures" / "estimate_tiny.yaml"
runner = CliRunner(env={"COLUMNS": "250"})


@pytest.mark.parametrize(("typed", "meant"), [
    ("h100", "'h100-80gb' or 'h100-pcie' or 'h100-nvl'"), ("a100", "'a100-80gb' or 'a100-40gb' or 'a100-pcie-80gb'"),
    ("h1000", "'h100-80gb' or 'h200'"),
])
def test_did_you_mean_knows_the_card_aliases(typed: str, meant: str) -> None:
    with pytest.raises(ConfigError, match=f"did you mean {meant}"):
        gpu_model(typed)
    assert suggest_cards("h100") == ["h100-80gb", "h100-pcie", "h100-nvl"]


@pytest.mark.parametrize(("typed", "key"), [("l40", "l40"), ("NVIDIA H200", "h200"), ("RTX 4090", "rtx-4090"),
                                            ("A100-SXM4-80GB", "a100-80gb")])
def test_a_card_by_its_alias_or_torch_name(typed: str, key: str) -> None:
    assert gpu_model(typed).key == key


def test_gpu_implies_the_cuda_device_model_of_that_card() -> None:
    result = runner.invoke(app, ["estimate", str(TINY_CONFIG), "--gpu", "a100-80gb", "--format", "json"])
    assert result.exit_code == 0, result.output
    assert '"target": "cuda"' in result.stdout and '"gpu": "a100-80gb"' in result.stdout
    contradiction = runner.invoke(app, ["estimate", str(TINY_CONFIG), "--gpu", "a100-80gb", "--target", "cpu"])
    assert contradiction.exit_code == 2
    assert "--gpu a100-80gb predicts for a CUDA card; --target cpu contradicts it" in contradiction.stderr


def test_another_cards_measurements_get_no_error_column(tmp_path: Path) -> None:
    # A one-point copy of the H200 check (one trace): predicted for an A100, measured on the H200.
    check = ROOT / "results" / "h200-gpu-check-2" / "check"
    run = tmp_path / "one"
    run.mkdir()
    (run / "run.json").write_text((check / "run.json").read_text())
    point = next(line for line in (check / "points.jsonl").read_text().splitlines()
                 if '"layout": "all"' in line and '"batch_size": 2,' in line)
    (run / "points.jsonl").write_text(point + "\n")
    other = runner.invoke(app, ["estimate", str(run), "--gpu", "a100-80gb"])
    assert other.exit_code == 0, other.output
    assert ("predicting for NVIDIA A100-SXM4-80GB; the run was measured on NVIDIA H200: its measurements and the "
            "error columns are left out") in other.stderr.replace("\n", " ")
    assert "error" not in other.stdout and "measured" not in other.stdout.split("\n", 2)[2]
    assert "every number predicted" in other.stdout
    own = runner.invoke(app, ["estimate", str(run)])
    assert "'measured' columns measured by the run, every other number predicted" in own.stdout
    assert "reserved error" in own.stdout
