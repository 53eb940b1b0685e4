"""docs/answers.md and the README's verdict table are what `ckptbench answers` generates from the committed runs."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ckptbench.advise.answers_predictions import predict_for_claims
from ckptbench.answers.claims import Answers, answer_claims
from ckptbench.answers.evidence import Scope
from ckptbench.answers.predictions import Pred, Predictions
from ckptbench.answers.verdicts import Budget, Part, Verdict
from ckptbench.cli.main import app
from ckptbench.render.answers import README_BEGIN, README_END, answers_markdown, readme_block, verdict_table
from ckptbench.results.store import load_run
from ckptbench.units import parse_headroom, parse_size

# Estimates of one config are made once per process and shared (tests/_est_shared.py).
pytestmark = pytest.mark.usefixtures("shared_estimates")

ROOT = Path(__file__).resolve().parents[1]
ANSWERS = ROOT / "docs" / "answers.md"
runner = CliRunner()


def committed_command() -> list[str]:
    """The command recorded in docs/answers.md (the only way the file is made)."""
    text = ANSWERS.read_text(encoding="utf-8")
    found = re.search(r"```bash\n(ckptbench answers .*)\n```", text)
    assert found, "docs/answers.md does not record the command that generated it"
    return shlex.split(found.group(1))


def regenerate(args: list[str]) -> tuple[str, str, Answers]:
    """(answers.md, README block, the answers) from the recorded arguments, read from the repository root; the
    predictions are made once here (the estimator: about 25 s of CPU time) and shared by the module's tests."""
    first_option = next(i for i, a in enumerate(args) if a.startswith("--"))
    runs, options = args[2:first_option], args[first_option:]
    measured_only = "--measured-only" in options
    options = [o for o in options if o != "--measured-only"]
    opts = dict(zip(options[::2], options[1::2], strict=True))
    budget = parse_size(opts["--budget"])
    loaded = [load_run(ROOT / r) for r in runs]
    for run, given in zip(loaded, runs, strict=True):
        run.path = Path(given)  # cited as given on the command line (run from the repository root)
    limit = Budget.for_runs(budget, parse_headroom(opts["--headroom"], budget_bytes=budget), loaded)
    predictions = None if measured_only else predict_for_claims(loaded, scope=Scope(), limit_bytes=limit.limit_bytes)
    answers = answer_claims(loaded, budget=limit, predictions=predictions)
    return (answers_markdown(answers, command=shlex.join(args), plot_name="answers-layers.png"),
            readme_block(answers, link=opts["--out"]), answers)


@pytest.fixture(scope="module")
def generated(shared_estimates: None) -> tuple[str, str, Answers]:
    return regenerate(committed_command())


@pytest.fixture(scope="module")
def predicted(generated: tuple[str, str, Answers]) -> Predictions:
    return generated[2].predictions


def test_committed_answers_are_what_the_runs_generate(generated: tuple[str, str, Answers]) -> None:
    assert ANSWERS.read_text(encoding="utf-8") == generated[0]


def test_readme_carries_the_generated_verdict_table(generated: tuple[str, str, Answers]) -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert generated[1] in readme
    # Right after the two set-up commands, which stay first.
    tests_command = readme.index("python -m pytest -q -n auto --dist loadfile\n```")
    assert tests_command < readme.index(README_BEGIN) < readme.index("## Commands")


def test_every_claim_has_a_verdict_and_open_claims_name_a_stage(generated: tuple[str, str, Answers]) -> None:
    text = generated[0]
    for n in range(1, 15):
        assert re.search(rf"^## {n}\. ", text, re.M), n
    assert text.count("**Verdict: ") == 14
    for section in re.split(r"^## \d+\. ", text, flags=re.M)[1:]:
        if "not settled yet" in section.split("\n\n", 3)[2]:
            assert "Waits for: `" in section


def test_cli_writes_the_file_prints_the_table_and_names_the_stages(
    tmp_path: Path, predicted: Predictions, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ckptbench.cli.answers as cli_answers

    monkeypatch.setattr(cli_answers, "_predictions", lambda runs, limit: predicted)  # made once, by the fixture
    check, axes = ROOT / "results/h200-gpu-check-2/check", ROOT / "results/h200-gpu-check-1/axes"
    readme = tmp_path / "README.md"
    readme.write_text(f"top\n{README_BEGIN}\nOLD TABLE\n{README_END}\nrest\n", encoding="utf-8")
    out = tmp_path / "docs" / "answers.md"
    result = runner.invoke(app, ["answers", str(check), str(axes), "--out", str(out), "--readme", str(readme)])
    assert result.exit_code == 0, result.output
    assert out.read_text(encoding="utf-8").startswith("# Answers: activation checkpointing of LLaMA-7B")
    assert (out.parent / "answers-layers.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert result.stdout.startswith("| # | claim | verdict | deciding numbers |\n")
    assert "not settled yet: claim 8 waits for stage 22-claims-80g" in result.stderr
    assert "not settled yet: claim 12, claim 14 wait for stage 30" in result.stderr
    text = readme.read_text(encoding="utf-8")
    assert text.startswith("top\n") and text.endswith(f"{README_END}\nrest\n") and "OLD TABLE" not in text
    assert "| [1](docs/answers.md#1-checkpoint-every-layer-or-memory-does-not-drop) |" in text  # relative to it


def test_cli_measured_only_leaves_what_no_run_measured_open() -> None:
    check, axes = ROOT / "results/h200-gpu-check-2/check", ROOT / "results/h200-gpu-check-1/axes"
    result = runner.invoke(app, ["answers", str(check), str(axes), "--measured-only"])
    assert result.exit_code == 0, result.output
    assert "(predicted)" not in result.stdout and "(fitted)" not in result.stdout
    assert "\n**Verdict: not settled yet.**\n" in result.stdout.split("## 5. ")[1]
    assert "--measured-only" in result.stdout  # the command recorded on the page
    assert "None: this page was generated from measured points only" in result.stdout


def test_cli_refuses_a_missing_run_and_a_readme_without_markers(tmp_path: Path) -> None:
    result = runner.invoke(app, ["answers", str(tmp_path / "nope")])
    assert result.exit_code == 2 and "no such run directory" in result.stderr
    bare = tmp_path / "README.md"
    bare.write_text("no markers\n", encoding="utf-8")
    check = ROOT / "results/h200-gpu-check-2/check"
    result = runner.invoke(app, ["answers", str(check), "--readme", str(bare)])
    assert result.exit_code == 2 and "markers" in result.stderr
    assert bare.read_text(encoding="utf-8") == "no markers\n"


def test_verdict_table_links_into_the_page_or_the_file(generated: tuple[str, str, Answers]) -> None:
    runs = [load_run(ROOT / "results/h200-gpu-check-2/check")]
    answers = answer_claims(runs, budget=Budget(80 * 2**30, 4 * 2**30))
    assert "| [4](#4-layers-1-16-only-memory-drops-a-lot) |" in verdict_table(answers)
    assert "| [4](docs/answers.md#4-layers-1-16-only-memory-drops-a-lot) |" in verdict_table(answers,
                                                                                         link="docs/answers.md")
    # The anchor exists as a heading in the page.
    assert "\n## 4. Layers 1-16 only: memory drops a lot\n" in generated[0]


def _part(answers: Answers, number: int, label: str) -> Part:
    return next(p for p in answers.answers[number - 1].parts if p.label == label)


def test_the_committed_verdicts_from_predictions(generated: tuple[str, str, Answers]) -> None:
    """The verdicts the predictions settle on the committed runs, each number labelled."""
    a = generated[2]
    H, F, OPEN = Verdict.HOLDS, Verdict.FAILS, Verdict.OPEN
    # Claim 11, the claim's case: none in 8 micro-batches of 1 against batch 8, which needs checkpointing.
    acc = _part(a, 11, "none, batch 1 x 8")
    assert acc.verdict is H and a.answers[10].basis == "predicted"
    assert [p.label for p in acc.predicted] == ["none b=1 s=2048 bf16 micro_batches=8", "first:24 b=8 s=2048 bf16"]
    assert "ran out of memory (measured" in acc.text and "10,270 tok/s (fitted)" in acc.text
    assert "1.09x as fast" in acc.text
    # Claim 12: mixed precision cannot fit an 80 GB card even with every layer checkpointed (predicted).
    amp = _part(a, 12, "mixed precision (amp_bf16)")
    assert amp.verdict is F and "needs 104.80 GiB reserved (its bound) and 100.79 GiB allocated (predicted)" in amp.text
    assert "no layout makes it fit an 80 GB card" in amp.text
    # Claim 7 on allocated and reserved: at batch 2 they disagree in direction.
    fine = _part(a, 7, "saves more at batch 2")
    assert fine.verdict is F and "disagree in direction: lower allocated, higher reserved" in fine.text
    # Claims 5 and 6 settled from predictions.
    assert [p.verdict for p in a.answers[4].parts] == [F, H, F]
    assert "range:8-12 goes from 67.9 GB (63.22 GiB, measured) to 64.9 GB (60.47 GiB, predicted)" in \
        a.answers[4].parts[0].text
    assert _part(a, 6, "last:4").verdict is F and not a.answers[5].partly_open
    # Claim 1 and the bottom line: the fewest first:k that fit at batch 8, found by prediction.
    assert "first:24, 24 of 32 layers, needs 73.01 GiB (predicted)" in _part(a, 1, "batch 8").text
    row = next(r for r in a.card if r.batch_size == 8)
    assert row.predicted is not None and row.predicted.value == 24 and not row.pending
    # The none b=8 out-of-memory error does not depend on the process here: the fresh-process replay agrees.
    assert any("does not depend on the process" in n and "253.52 MiB" in n for n in a.answers[0].notes)
    # Nothing stays open that a prediction can settle: only step times nothing can fit, and torchao's 8-bit AdamW.
    open_parts = {(n, p.label) for n, ans in enumerate(a.answers, 1) for p in ans.parts if p.verdict is OPEN}
    assert open_parts == {(8, "first:8 b=8 offload=all"), (8, "every:4 b=8 offload=all"),
                          (10, "speed at seq 1024 and 512"), (12, "8-bit AdamW (torchao)"),
                          (14, "less slowdown than checkpointing")}


def test_every_predicted_or_fitted_number_on_the_page_says_so(generated: tuple[str, str, Answers]) -> None:
    """Each predicted point's needed bytes (reserved, its bound) and fitted tokens/s appear in a sentence only with
    their label (tables label their columns instead)."""
    text, a = generated[0], generated[2]
    measured = {f"{r.peak_reserved_bytes / 2**30:.2f} GiB" for run in a.runs for r in run.points
                if r.peak_reserved_bytes}
    # A prediction is quoted by what it needs: its peak reserved raised to its bound (results/fit.py).
    figures = {f"{need / 2**30:.2f} GiB": "predicted" for p in a.predictions.points.values()
               if p.peak_reserved_bytes is not None and (need := Pred(p, None).needed) is not None}
    figures = {k: v for k, v in figures.items() if k not in measured}
    for p in a.predictions.points.values():
        t = a.predictions.time(p.key)
        if t is not None:
            figures[f"{t.tokens_per_s:,.0f} tok/s"] = "fitted"
    assert len(figures) > 20
    seen = 0
    for line in text.splitlines():
        if line.startswith("|"):
            continue
        for fragment in re.split(r"; |\. ", line):
            for shown, label in figures.items():
                if shown in fragment:
                    seen += 1
                    assert f"{shown} ({label}" in fragment or f"{label})" in fragment, (shown, fragment)
    assert seen > 20
