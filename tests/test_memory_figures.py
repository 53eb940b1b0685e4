"""One memory figure per meaning across commands: the same point shows the same 'peak reserved' and 'needed'.

The point is none b=2 of the committed H200 check: peak reserved 63.22 GiB measured; needed (peak reserved
plus the card's 0.74 GiB CUDA context, results/fit.py) 63.96 GiB. Sweep's summary, recommend, answers,
report and estimate must show 63.22 GiB as "peak reserved"/"reserved" and 63.96 GiB only as "needed".
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ckptbench.cli.main import app
from ckptbench.render.summary import summary_markdown
from ckptbench.results.store import load_run

# Estimates of one config are made once per process and shared (tests/_est_shared.py).
pytestmark = pytest.mark.usefixtures("shared_estimates")

ROOT = Path(__file__).parents[1]
CHECK = ROOT / "results" / "h200-gpu-check-2" / "check"
AXES = ROOT / "results" / "h200-gpu-check-1" / "axes"
RESERVED, NEEDED = "63.22 GiB", "63.96 GiB"
runner = CliRunner(env={"COLUMNS": "250"})


def _none_b2_rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if re.search(r"\bnone( b=2|\s*[|│]\s*2\s*[|│])", line)]


def test_sweep_summary_shows_peak_reserved() -> None:
    rows = _none_b2_rows(summary_markdown(load_run(CHECK)))
    assert rows and RESERVED in rows[0] and NEEDED not in rows[0]


def test_recommend_shows_reserved_and_needed_apart() -> None:
    result = runner.invoke(app, ["recommend", str(CHECK), "--budget", "80"])
    assert result.exit_code == 0, result.output
    header = next(line for line in result.stdout.splitlines() if "┃ role" in line)
    cells = [c.strip() for c in header.strip("┃").split("┃")]
    row = next(line for line in result.stdout.splitlines() if line.startswith("│ best"))
    values = [c.strip() for c in row.strip("│").split("│")]
    assert (values[cells.index("reserved")], values[cells.index("needed")]) == (RESERVED, NEEDED)
    assert f"at {RESERVED} peak reserved, {NEEDED} needed with the 0.74 GiB CUDA context" in result.stdout
    data = json.loads(runner.invoke(app, ["recommend", str(CHECK), "--budget", "80", "--format", "json"]).stdout)
    best = data["best"]
    assert best["needed_bytes"] == best["peak_reserved_bytes"] + best["context_bytes"]
    assert f"{best['peak_reserved_bytes'] / 2**30:.2f} GiB" == RESERVED
    assert f"{best['needed_bytes'] / 2**30:.2f} GiB" == NEEDED


def test_answers_and_report_show_the_same_peak_reserved(tmp_path: Path) -> None:
    answers = runner.invoke(app, ["answers", str(CHECK), str(AXES)])
    assert answers.exit_code == 0, answers.output
    cited = [line for line in answers.stdout.splitlines()
             if line.startswith("| none b=2 s=2048 bf16 |") and "h200-gpu-check-2" in line
             and line.endswith("| ok |")]  # the cited points (the predictions section sets predicted / measured)
    assert cited and all(line.split(" | ")[3] == RESERVED for line in cited)  # the 'reserved' column
    assert NEEDED not in answers.stdout or f"{NEEDED} needed" in answers.stdout
    run = tmp_path / "check"
    shutil.copytree(CHECK, run, ignore=shutil.ignore_patterns("report"))
    report = runner.invoke(app, ["report", str(run), "--budget", "80"])
    assert report.exit_code == 0, report.output
    text = (run / "report" / "report.md").read_text(encoding="utf-8")
    best = next(line for line in text.splitlines() if line.startswith("| best |"))
    assert f"| {RESERVED} | {NEEDED} |" in best
    assert RESERVED in _none_b2_rows(text)[-1]  # the summary table at the end


@pytest.mark.slow
def test_estimate_shows_the_measured_peak_reserved(tmp_path: Path) -> None:
    run = tmp_path / "one"
    run.mkdir()
    shutil.copy(CHECK / "run.json", run / "run.json")
    point = next(line for line in (CHECK / "points.jsonl").read_text().splitlines()
                 if '"layout": "none"' in line and '"batch_size": 2,' in line)
    (run / "points.jsonl").write_text(point + "\n")
    result = runner.invoke(app, ["estimate", str(run)])
    assert result.exit_code == 0, result.output
    header = next(line for line in result.stdout.splitlines() if "┃ layout" in line)
    cells = [c.strip() for c in header.strip("┃").split("┃")]
    row = _none_b2_rows(result.stdout)[0]
    values = [c.strip() for c in row.strip("│").split("│")]
    assert values[cells.index("measured reserved")] == RESERVED
