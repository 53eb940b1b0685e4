"""--help of every command: an example, no '<bool>', and every option the README's command table names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ckptbench.cli.main import app

README = Path(__file__).parents[1] / "README.md"
runner = CliRunner()


def readme_commands() -> dict[str, set[str]]:
    """Each command of the README's command table and the options its row names."""
    rows = [line for line in README.read_text(encoding="utf-8").splitlines() if line.startswith("| `ckptbench ")]
    found: dict[str, set[str]] = {}
    for row in rows:
        usage = row.split("`")[1]
        found[usage.split()[1]] = set(re.findall(r"--[a-z][a-z-]*", usage))
    return found


def help_text(command: str) -> str:
    result = runner.invoke(app, [command, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result.stdout


def test_the_readme_table_lists_every_command() -> None:
    registered = {c.name or c.callback.__name__ for c in app.registered_commands if c.callback is not None}
    commands = {
        "sweep", "layouts", "compare", "recommend", "report", "estimate", "answers", "trace-allocator", "tune",
        "advise", "gpus", "cache",
    }
    assert set(readme_commands()) == registered == commands


@pytest.mark.parametrize(("command", "options"), sorted(readme_commands().items()))
def test_help_has_the_readme_options_and_an_example(command: str, options: set[str]) -> None:
    text = help_text(command)
    missing = [opt for opt in options if not re.search(rf"{opt}\b", text)]
    assert not missing, f"ckptbench {command} --help lacks {missing}"
    example = re.search(r"Example:\s+(ckptbench \S+.*)", text)
    assert example is not None and example.group(1).split()[1] == command
    for opt in re.findall(r"--[a-z][a-z-]*", example.group(1)):  # the example uses real options
        assert opt in text
    assert "<bool>" not in text


def test_root_help_shows_no_bool_type() -> None:
    result = runner.invoke(app, ["--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0 and "--version" in result.stdout and "<bool>" not in result.stdout


def test_estimate_argument_is_named_for_what_it_takes() -> None:
    assert "CONFIG|RUN" in help_text("estimate")


@pytest.mark.parametrize("fmt", ["csv", "xml"])
def test_recommend_format_outside_table_markdown_json_is_one_line(fmt: str) -> None:
    run = Path(__file__).parent / "fixtures" / "report_runs" / "tiny-capped"
    result = runner.invoke(app, ["recommend", str(run), "--budget", "32MiB", "--format", fmt])
    assert result.exit_code == 2
    assert result.stderr.strip() == f"error: --format: '{fmt}' is not one of table, markdown, json"


def test_budget_in_gb_says_why_it_is_refused() -> None:
    run = Path(__file__).parent / "fixtures" / "report_runs" / "tiny-capped"
    result = runner.invoke(app, ["recommend", str(run), "--budget", "80GB"])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "ambiguous" in lines[0] and "10^9" in lines[0] and "80GiB" in lines[0]
