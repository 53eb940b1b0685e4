"""issue 22, robustness: what a user types, a damaged file or a full disk gives one clear line and a non-zero
exit, loses nothing and never runs unbounded."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ckptbench.cli.main import app
from ckptbench.results.store import POINTS_FILE, RUN_FILE

FIXTURES = Path(__file__).parent / "fixtures"


def invoke(args: list[str]) -> Any:
    """The command through typer's runner; a traceback is a failure of the test, not a result."""
    result = CliRunner().invoke(app, args)
    crashed = result.exception is not None and not isinstance(result.exception, SystemExit)
    assert not crashed, (args, repr(result.exception))
    assert "Traceback" not in result.output, result.output
    return result


def error_line(result: Any) -> str:
    """The one line a refused command prints."""
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


@pytest.fixture
def few_run(tmp_path: Path) -> Path:
    """A copy of a small committed run (two layouts, a few points) to write around."""
    return Path(shutil.copytree(FIXTURES / "runs" / "few", tmp_path / "run"))


# --- 1. no command writes over a run's own files -------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["answers", "{run}", "--out", "{run}/run.json"],
        ["answers", "{run}", "--out", "{run}/points.jsonl"],
        ["answers", "{run}", "--out", "{link}"],  # a link to points.jsonl
        ["answers", "{run}", "--readme", "{run}/run.json"],
        ["report", "{run}", "--out", "{run}/summary.md", "--no-estimate"],  # a folder would be made there
    ],
    ids=["answers-run.json", "answers-points", "answers-link", "answers-readme", "report-summary"],
)
def test_no_command_writes_over_a_run_s_own_files(few_run: Path, tmp_path: Path, args: list[str]) -> None:
    (tmp_path / "link.md").symlink_to(few_run / POINTS_FILE)
    before = {name: (few_run / name).read_bytes() for name in (RUN_FILE, POINTS_FILE)}
    result = invoke([a.format(run=few_run, link=tmp_path / "link.md") for a in args])
    assert result.exit_code == 2
    assert "never writes over a run's own files" in error_line(result)
    assert {name: (few_run / name).read_bytes() for name in before} == before
    assert sorted(p.name for p in few_run.iterdir()) == sorted(before)
