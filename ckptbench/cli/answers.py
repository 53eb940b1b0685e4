"""`ckptbench answers`: every claim about checkpointing, judged on committed runs (docs/answers.md)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ckptbench.analysis.recommend import DEFAULT_HEADROOM
from ckptbench.cli.common import HeadroomOpt, err, fail
from ckptbench.errors import CkptbenchError, ResultsError

if TYPE_CHECKING:  # imported when the claims are answered: the CLI stays fast to start
    from ckptbench.answers.claims import Answers

RunsArg = Annotated[list[str], typer.Argument(
    metavar="RUN...", help="Run directories, preferred first: the first run holding a point is the one cited.")]
AnswersOutOpt = Annotated[Path | None, typer.Option(
    "--out", metavar="FILE", help="Write the Markdown here and its plot next to it (default: print the Markdown).")]
ReadmeOpt = Annotated[Path | None, typer.Option(
    "--readme", metavar="FILE", help="Also replace the verdict table between the answers markers of this README.")]
AnswersBudgetOpt = Annotated[str, typer.Option("--budget", metavar="SIZE", help="The card: GiB (80) or with a unit.")]


def answers_cmd(
    runs: RunsArg,
    out_file: AnswersOutOpt = None,
    budget: AnswersBudgetOpt = "80",
    headroom: HeadroomOpt = DEFAULT_HEADROOM,
    readme: ReadmeOpt = None,
) -> None:
    """Judge the fourteen claims about checkpointing LLaMA-7B on an 80 GB card from measured runs."""
    from ckptbench.render.answers import pending_lines, publish_answers, verdict_table

    command = shlex.join(["ckptbench", "answers", *runs, "--budget", budget, "--headroom", headroom,
                          *(["--out", str(out_file)] if out_file else [])])
    try:
        _check_outputs(out_file, readme)  # before the runs are read: nothing is judged for a file never written
        answers = _answers(runs, budget=budget, headroom=headroom)
        done = publish_answers(answers, out=out_file, readme=readme, command=command)
    except CkptbenchError as exc:
        raise fail(exc) from None
    except OSError as exc:
        raise fail(ResultsError(f"answers: {exc}")) from None
    for path in done.files:
        err.print(f"wrote {path}", markup=False)
    for line in pending_lines(answers):
        err.print(line, markup=False, soft_wrap=True)
    # stdout: the whole Markdown, or, when it went to a file, the short table the README carries
    typer.echo(done.markdown if out_file is None else verdict_table(answers, link=str(out_file)), nl=False)


def _check_outputs(out_file: Path | None, readme: Path | None) -> None:
    """--out and --readme may not name a run's own files (nor --out the README it also rewrites)."""
    from ckptbench.render.answers import PLOT_FILE
    from ckptbench.results.paths import check_not_run_file

    if out_file is not None:
        check_not_run_file(out_file, option="--out")
        check_not_run_file(out_file.parent / PLOT_FILE, option="--out")
    if readme is not None:
        check_not_run_file(readme, option="--readme")


def _answers(runs: list[str], *, budget: str, headroom: str) -> Answers:
    from ckptbench.answers.claims import answer_claims
    from ckptbench.answers.verdicts import Budget
    from ckptbench.results.store import load_run
    from ckptbench.units import parse_headroom, parse_size

    budget_bytes = parse_size(budget)
    limit = Budget(budget_bytes, parse_headroom(headroom, budget_bytes=budget_bytes))
    return answer_claims([load_run(r) for r in runs], budget=limit)
