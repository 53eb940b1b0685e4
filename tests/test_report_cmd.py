"""`ckptbench report` and `ckptbench recommend` on fixture runs: files, links, plots, JSON, exit codes."""

from __future__ import annotations

import json
import re
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest
from matplotlib.figure import Figure
from typer.testing import CliRunner

from ckptbench.cli.main import app
from ckptbench.config.grid import KEY_FILLS
from ckptbench.plots import breakdown as breakdown_plot
from ckptbench.plots import peaks_speed as plots
from ckptbench.results.store import load_run
from tests._known import known

# Estimates of one config are made once per process and shared (tests/_est_shared.py).
pytestmark = pytest.mark.usefixtures("shared_estimates")

RUNS = Path(__file__).parent / "fixtures" / "report_runs"
SYNTHETIC = RUNS / "synthetic-h200-llama7b"
TINY = RUNS / "tiny-capped"
PNGS = ("peak_memory.png", "speed.png", "tradeoff.png", "memory_breakdown.png")
runner = CliRunner()


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk; fails unless the file is a PNG."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path.name} is not a PNG"
    assert head[12:16] == b"IHDR"
    return struct.unpack(">II", head[16:24])


@pytest.fixture(scope="module")
def synthetic_report(synthetic_report_made: tuple[Path, Any]) -> Path:
    """`ckptbench report SYNTHETIC --out OUT --budget 80`, run once per process (tests/_est_shared.py)."""
    out, result = synthetic_report_made
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == str(out / "report.md")
    return out


def test_report_writes_valid_pngs(synthetic_report: Path) -> None:
    for name in PNGS:
        path = synthetic_report / name
        width, height = png_size(path)
        assert width >= 800 and height >= 400, (name, width, height)
        assert path.stat().st_size > 20_000, name  # a real plot, not an empty canvas


def test_report_markdown_links_every_png(synthetic_report: Path) -> None:
    text = (synthetic_report / "report.md").read_text(encoding="utf-8")
    links = re.findall(r"!\[[^\]]+\]\(([^)]+)\)", text)
    assert links == [*PNGS, "layers.png"]  # layers.png: the per-layer section (tests/test_layer_report.py)
    assert all((synthetic_report / link).is_file() for link in links)
    assert text.startswith("# ckptbench report: synthetic-h200-llama7b\n")
    assert "> **Note:** SYNTHETIC test fixture" in text  # the synthetic origin is never hidden
    assert "## Recommendation" in text
    assert "**none b=2 s=2048 is the fastest point that fits" in text
    row = "| best | none b=2 s=2048 | - | 72.42 GiB | 70.17 GiB | 19.96 GiB | 10,666 | 100% | 3.58 GiB free |"
    assert row in text
    assert "## Pareto front" in text
    assert "| layout | batch | seq | precision | ckpt layers | peak | reserved |" in text  # the summary table
    assert text.index("## Recommendation") < text.index("## Plots") < text.index("## All points")


def test_report_without_budget_in_default_folder(tmp_path: Path) -> None:
    run_dir = tmp_path / "tiny-capped"
    shutil.copytree(TINY, run_dir)
    result = runner.invoke(app, ["report", str(run_dir)])
    assert result.exit_code == 0, result.output
    report = run_dir / "report" / "report.md"
    text = report.read_text(encoding="utf-8")
    assert "## Recommendation" not in text
    assert "| point | ckpt layers | reserved | allocated | tok/s |\n" in text  # Pareto, no 'fits' column
    assert "live-tensor tracker" in text
    for name in PNGS:
        png_size(run_dir / "report" / name)


def test_report_of_a_run_where_nothing_ran(tmp_path: Path) -> None:
    run_dir = tmp_path / "all-oom"
    run_dir.mkdir()
    shutil.copy(TINY / "run.json", run_dir / "run.json")
    result = runner.invoke(app, ["report", str(run_dir), "--budget", "1"])
    assert result.exit_code == 2 and "no finished points yet" in result.stderr  # no points.jsonl at all
    oom = [line for line in (TINY / "points.jsonl").read_text().splitlines() if '"status": "oom"' in line]
    (run_dir / "points.jsonl").write_text("\n".join(oom) + "\n")
    result = runner.invoke(app, ["report", str(run_dir), "--budget", "1"])
    assert result.exit_code == 0, result.output
    text = (run_dir / "report" / "report.md").read_text(encoding="utf-8")
    assert "**Nothing fits under 1.00 GiB: no point of the run finished ok (2 points).**" in text
    for name in PNGS:
        png_size(run_dir / "report" / name)


def test_grouped_bars_skip_and_mark_points_that_did_not_run() -> None:
    run = load_run(SYNTHETIC)
    data = plots.PlotData(run)
    label, rows = data.facets()[0]
    assert label == "seq 2048"
    ax = Figure().subplots()
    plots._grouped_bars(ax, data, rows, lambda r: r.peak_reserved_bytes / data.scale)
    ok = [r for r in rows if r.status == "ok"]
    assert len(ax.patches) == len(ok)
    marks = sorted(t.get_text().strip() for t in ax.texts)
    assert marks == sorted(r.status.upper() for r in rows if r.status != "ok")
    assert marks.count("OOM") == 7 and marks.count("SKIPPED") == 6


def test_breakdown_uses_the_shape_where_most_layouts_ran() -> None:
    assert known(breakdown_plot.reference_shape(load_run(SYNTHETIC)))["batch_size"] == 8
    assert breakdown_plot.reference_shape(load_run(TINY)) == {
        **KEY_FILLS, "batch_size": 2, "model": "tiny", "optimizer": "adamw_fused", "precision": "fp32",
        "seq_len": 128,
    }


# ------------------------------------------------------------------ recommend command


def test_recommend_table() -> None:
    result = runner.invoke(app, ["recommend", str(SYNTHETIC), "--budget", "80GiB", "--headroom", "4GiB"])
    assert result.exit_code == 0, result.output
    assert "Under 80.00 GiB (4.00 GiB headroom: at most 76.00 GiB peak reserved)" in result.stdout
    assert re.search(r"│ best +│ none b=2 s=2048 +│", result.stdout)
    assert "none b=2 s=2048 is the fastest point that fits" in result.stdout


def test_recommend_json() -> None:
    result = runner.invoke(app, ["recommend", str(TINY), "--budget", "40MiB", "--format", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["budget_bytes"] == 40 * 2**20 and data["headroom_bytes"] == 2 * 2**20
    best = data["best"]
    assert best["peak_reserved_bytes"] <= data["limit_bytes"]
    fitting = [p for p in data["pareto"] if p["fits"]]
    assert best["tokens_per_s"] == max(p["tokens_per_s"] for p in fitting)
    assert {"key", "peak_allocated_bytes", "peak_reserved_bytes", "tokens_per_s"} <= set(best)


def test_recommend_no_fit_is_an_answer() -> None:
    result = runner.invoke(app, ["recommend", str(SYNTHETIC), "--budget", "40", "--format", "json"])
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert data["best"] is None and data["fits"] is False
    assert data["smallest"]["label"] == "all b=1 s=2048"
    assert data["why"].startswith("Nothing fits under 40.00 GiB")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["recommend", str(SYNTHETIC), "--budget", "lots"], "--budget: 'lots' is not a memory size"),
        (["recommend", str(SYNTHETIC), "--budget", "-5"], "--budget: '-5' is not a memory size"),
        (["recommend", str(SYNTHETIC)], "--budget is required"),
        (["recommend", str(SYNTHETIC), "--budget", "80", "--headroom", "120%"], "--headroom: '120%'"),
        (["recommend", str(SYNTHETIC), "--budget", "80", "--format", "xml"], "--format: 'xml' is not one of"),
        (["recommend", str(SYNTHETIC), "--budget", "80", "--seq-len", "7"], "no point with seq_len 7"),
        (["recommend", "no/such/run", "--budget", "80"], "no/such/run: no such run directory"),
        (["report", "no/such/run"], "no/such/run: no such run directory"),
        (["report", str(SYNTHETIC), "--budget", "0"], "--budget: '0' is not a memory size"),
    ],
)
def test_bad_input_exits_2_with_one_red_line(args: list[str], message: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert message in " ".join(result.stderr.split())
    assert result.stdout == ""
