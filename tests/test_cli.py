"""CLI: golden output, files written, errors as one line with the right exit code."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console
from typer.testing import CliRunner

from ckptbench.cli.main import app
from ckptbench.render.summary import summary_table
from ckptbench.results.frame import to_frame
from ckptbench.results.store import load_run

FIXTURES = Path(__file__).parent / "fixtures"
UPDATE = False  # set True locally to rewrite golden files after an intended change

runner = CliRunner()


def golden(name: str, text: str) -> None:
    path = FIXTURES / name
    if UPDATE:
        path.write_text(text)
    assert text == path.read_text()


def test_layouts_golden() -> None:
    result = runner.invoke(app, ["layouts", "configs/tiny.yaml"])
    assert result.exit_code == 0, result.output
    golden("layouts_tiny.txt", result.stdout)


def test_layouts_llama7b_lists_every_layer() -> None:
    result = runner.invoke(app, ["layouts", "configs/llama7b.yaml"])
    assert result.exit_code == 0
    line = next(row for row in result.stdout.splitlines() if "│ every:4 " in row)
    assert "0,4,8,12,16,20,24,28" in line and "8/32" in line
    line = next(row for row in result.stdout.splitlines() if "│ range:8-19 " in row)
    assert "8-19" in line and "12/32" in line


def test_summary_table_golden() -> None:
    console = Console(width=200, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(summary_table(load_run(FIXTURES / "golden_run")))
    golden("golden_summary.txt", console.export_text())


def test_results_load_into_pandas() -> None:
    frame = to_frame(load_run(FIXTURES / "golden_run"))
    assert list(frame["layout"]) == ["none", "all", "last:4@mlp"]
    assert frame["peak_allocated_bytes"].dtype.kind == "i"
    assert (frame["activation_bytes"] == frame["peak_allocated_bytes"] - frame["params_bytes"]
            - frame["grads_bytes"] - frame["optimizer_state_bytes"]).all()
    assert frame.loc[frame.layout == "all", "activation_bytes"].item() < frame.loc[
        frame.layout == "none", "activation_bytes"].item()
    # pandas can read what the sweep wrote, too
    csv = pd.read_csv(FIXTURES / "golden_run" / "summary.csv")
    assert list(csv["layout"]) == ["none", "all", "last:4@mlp"]


def test_sweep_writes_run_files(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "name: clitest\ndevice: cpu\nmodel: {preset: tiny}\nwarmup_steps: 1\nmeasured_steps: 2\n"
        "sweep: {layout: [none, every:2], batch_size: [1], seq_len: [32], precision: [fp32]}\n"
    )
    out = tmp_path / "run"
    result = runner.invoke(app, ["sweep", str(cfg), "--out", str(out)])
    assert result.exit_code == 0, result.output
    meta = json.loads((out / "run.json").read_text())
    assert meta["schema_version"] == 1 and meta["status"] == "complete"
    assert meta["config"]["sweep"]["layout"] == ["none", "every:2"]
    assert meta["environment"]["torch"] and meta["environment"]["transformers"]
    lines = [json.loads(x) for x in (out / "points.jsonl").read_text().splitlines()]
    assert [r["key"]["layout"] for r in lines] == ["none", "every:2"]
    for r in lines:
        assert set(r["key"]) >= {"layout", "batch_size", "seq_len", "precision", "optimizer", "model"}
        assert r["status"] == "ok" and len(r["step_times_s"]) == 2 and len(r["losses"]) == 2
    assert (out / "summary.csv").exists() and (out / "summary.md").exists()
    assert "every:2" in result.stdout and "0,2,4,6" in result.stdout


def test_sweep_refuses_to_overwrite_a_run(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "run.json").write_text("{}")
    result = runner.invoke(app, ["sweep", "configs/tiny.yaml", "--out", str(out)])
    assert result.exit_code == 2
    assert (out / "run.json").read_text() == "{}"


@pytest.mark.parametrize(
    ("yaml_text", "fragment"),
    [
        ("name: x\nsweep: {batch_size: [1, -2]}\n", "sweep.batch_size"),
        ("name: x\nwarmup_step: 3\n", "did you mean 'warmup_steps'"),
        ("name: x\nsweep: {layout: [every:0]}\n", "sweep.layout.0"),
        ("name: x\nsweep: {precision: [fp8]}\n", "sweep.precision.0"),
        ("name: x\nmodel: {preset: llama-70b}\n", "model.preset"),
        ("name: x\nmodel: {preset: tiny}\nsweep: {seq_len: [4096]}\n", "max_position_embeddings"),
        ("name: [oops\n", "invalid YAML at line"),
    ],
)
def test_bad_config_is_one_line_and_exit_2(tmp_path: Path, yaml_text: str, fragment: str) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(yaml_text)
    result = runner.invoke(app, ["sweep", str(cfg), "--results", str(tmp_path / "results")])
    assert result.exit_code == 2
    lines = [x for x in result.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and fragment in lines[0], result.stderr
    assert "Traceback" not in result.output
    assert not (tmp_path / "results").exists()
