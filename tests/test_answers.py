"""docs/answers.md and the README's verdict table are what `ckptbench answers` generates from the committed runs."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ckptbench.answers.claims import answer_claims
from ckptbench.answers.verdicts import Budget
from ckptbench.cli.main import app
from ckptbench.render.answers import README_BEGIN, README_END, answers_markdown, readme_block, verdict_table
from ckptbench.results.store import load_run
from ckptbench.units import parse_headroom, parse_size

ROOT = Path(__file__).resolve().parents[1]
ANSWERS = ROOT / "docs" / "answers.md"
runner = CliRunner()


def committed_command() -> list[str]:
    """The command recorded in docs/answers.md (the only way the file is made)."""
    text = ANSWERS.read_text(encoding="utf-8")
    found = re.search(r"```bash\n(ckptbench answers .*)\n```", text)
    assert found, "docs/answers.md does not record the command that generated it"
    return shlex.split(found.group(1))


def regenerate(args: list[str]) -> tuple[str, str]:
    """(answers.md, README block) from the recorded arguments, read from the repository root."""
    first_option = next(i for i, a in enumerate(args) if a.startswith("--"))
    runs, options = args[2:first_option], args[first_option:]
    opts = dict(zip(options[::2], options[1::2], strict=True))
    budget = parse_size(opts["--budget"])
    loaded = [load_run(ROOT / r) for r in runs]
    for run, given in zip(loaded, runs, strict=True):
        run.path = Path(given)  # cited as given on the command line (run from the repository root)
    answers = answer_claims(loaded, budget=Budget(budget, parse_headroom(opts["--headroom"], budget_bytes=budget)))
    return (answers_markdown(answers, command=shlex.join(args), plot_name="answers-layers.png"),
            readme_block(answers, link=opts["--out"]))


@pytest.fixture(scope="module")
def generated() -> tuple[str, str]:
    return regenerate(committed_command())


def test_committed_answers_are_what_the_runs_generate(generated: tuple[str, str]) -> None:
    assert ANSWERS.read_text(encoding="utf-8") == generated[0]


def test_readme_carries_the_generated_verdict_table(generated: tuple[str, str]) -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert generated[1] in readme
    # Right after the two set-up commands, which stay first.
    assert readme.index("python -m pytest -q\n```") < readme.index(README_BEGIN) < readme.index("## Commands")


def test_every_claim_has_a_verdict_and_open_claims_name_a_stage(generated: tuple[str, str]) -> None:
    text = generated[0]
    for n in range(1, 15):
        assert re.search(rf"^## {n}\. ", text, re.M), n
    assert text.count("**Verdict: ") == 14
    for section in re.split(r"^## \d+\. ", text, flags=re.M)[1:]:
        if "not settled yet" in section.split("\n\n", 3)[2]:
            assert "Waits for: `" in section


def test_cli_writes_the_file_prints_the_table_and_names_the_stages(tmp_path: Path) -> None:
    check, axes = ROOT / "results/h200-gpu-check-2/check", ROOT / "results/h200-gpu-check-1/axes"
    readme = tmp_path / "README.md"
    readme.write_text(f"top\n{README_BEGIN}\nOLD TABLE\n{README_END}\nrest\n", encoding="utf-8")
    out = tmp_path / "docs" / "answers.md"
    result = runner.invoke(app, ["answers", str(check), str(axes), "--out", str(out), "--readme", str(readme)])
    assert result.exit_code == 0, result.output
    assert out.read_text(encoding="utf-8").startswith("# Answers: activation checkpointing of LLaMA-7B")
    assert (out.parent / "answers-layers.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert result.stdout.startswith("| # | claim | verdict | measured |\n")
    waits = "not settled yet: claim 5, claim 6, claim 8, claim 11, claim 12 wait for stage 22-claims-80g"
    assert waits in result.stderr
    text = readme.read_text(encoding="utf-8")
    assert text.startswith("top\n") and text.endswith(f"{README_END}\nrest\n") and "OLD TABLE" not in text
    assert "| [1](docs/answers.md#1-checkpoint-every-layer-or-memory-does-not-drop) |" in text  # relative to it


def test_cli_refuses_a_missing_run_and_a_readme_without_markers(tmp_path: Path) -> None:
    result = runner.invoke(app, ["answers", str(tmp_path / "nope")])
    assert result.exit_code == 2 and "no such run directory" in result.stderr
    bare = tmp_path / "README.md"
    bare.write_text("no markers\n", encoding="utf-8")
    check = ROOT / "results/h200-gpu-check-2/check"
    result = runner.invoke(app, ["answers", str(check), "--readme", str(bare)])
    assert result.exit_code == 2 and "markers" in result.stderr
    assert bare.read_text(encoding="utf-8") == "no markers\n"


def test_verdict_table_links_into_the_page_or_the_file(generated: tuple[str, str]) -> None:
    runs = [load_run(ROOT / "results/h200-gpu-check-2/check")]
    answers = answer_claims(runs, budget=Budget(80 * 2**30, 4 * 2**30))
    assert "| [4](#4-layers-1-16-only-memory-drops-a-lot) |" in verdict_table(answers)
    assert "| [4](docs/answers.md#4-layers-1-16-only-memory-drops-a-lot) |" in verdict_table(answers,
                                                                                         link="docs/answers.md")
    # The anchor exists as a heading in the page.
    assert "\n## 4. Layers 1-16 only: memory drops a lot\n" in generated[0]
