"""Guardrails: a 7B sweep on a CPU is refused with how long it would take; a sweep says what to run next."""

from __future__ import annotations

import builtins
from pathlib import Path
from typing import Any

import pytest
import tomllib
from typer.testing import CliRunner

from ckptbench.cli.main import app
from ckptbench.cli.sweep import _next_steps
from ckptbench.config.load import load_config
from ckptbench.results.store import load_run
from ckptbench.sweep.cpu_guard import REFUSE_ABOVE_S, CpuCost, matmul_params, training_flops
from ckptbench.train.optimizers import OptimizerUnavailable, make_optimizer

ROOT = Path(__file__).parents[1]


def test_matmul_params_of_llama_7b() -> None:
    cfg = load_config(ROOT / "configs" / "llama7b.yaml")
    # 32 layers x (4 x 4096^2 attention + 3 x 4096 x 11008 MLP) + 4096 x 32000 LM head.
    assert matmul_params(cfg.model.resolved()) == 32 * (4 * 4096**2 + 3 * 4096 * 11008) + 4096 * 32000
    tiny = load_config(ROOT / "configs" / "tiny.yaml")
    # The tiny sweep: well under the limit even at a slow 1 GFLOP/s.
    assert CpuCost(training_flops(tiny), 1e9, 12).seconds < REFUSE_ABOVE_S


def test_a_7b_sweep_on_a_cpu_is_refused_unless_forced(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["sweep", str(ROOT / "configs" / "llama7b.yaml"), "--out", str(out)])
    assert result.exit_code == 2
    line = result.stderr.strip()
    assert "\n" not in line
    assert line.startswith("error: ") and "66 point(s) of llama-7b on a CPU would train for at least" in line
    assert "days" in line and "GFLOP/s" in line
    assert "`ckptbench estimate " in line and "--force runs it anyway" in line
    assert not out.exists()  # nothing was started


def test_after_a_sweep_one_line_says_what_to_run_next() -> None:
    run = load_run(ROOT / "tests" / "fixtures" / "ten_cpu" / "r0")
    assert _next_steps(run) == (
        f"next: ckptbench report {run.path} --budget SIZE (report.md and plots); "
        f"ckptbench recommend {run.path} --budget SIZE (the fastest point that fits)"
    )
    gpu = load_run(ROOT / "results" / "h200-gpu-check-2" / "check")
    assert f"ckptbench recommend {gpu.path} --budget 140 " in _next_steps(gpu)


def test_the_lora_and_8bit_extras_are_declared_and_named_by_the_skip(monkeypatch: pytest.MonkeyPatch) -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["lora"] == ["peft>=0.13"] and extras["8bit"] == ["bitsandbytes>=0.43"]
    real_import = builtins.__import__

    def no_bitsandbytes(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "bitsandbytes":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_bitsandbytes)
    with pytest.raises(OptimizerUnavailable, match=r"pip install 'ckptbench\[8bit\]'"):
        make_optimizer("adamw_8bit", [], lr=1e-3)
    assert "pip install 'ckptbench[lora]'" in (ROOT / "ckptbench" / "train" / "model.py").read_text()


def test_a_cpu_sweeps_summary_at_80_columns_keeps_tokens_per_s_not_a_repeated_reserved() -> None:
    import io

    from rich.console import Console

    from ckptbench.render.summary import summary_table

    console = Console(file=io.StringIO(), width=80, color_system=None, legacy_windows=False)
    console.print(summary_table(load_run(ROOT / "tests" / "fixtures" / "ten_cpu" / "r0")))
    header = next(line for line in console.file.getvalue().splitlines() if line.startswith("┃ layout"))
    names = [c.strip() for c in header.strip("┃").split("┃")]
    assert "tok/s" in names and "reserved" not in names  # on a CPU reserved repeats peak
