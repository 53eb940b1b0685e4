"""`ckptbench answers`: every claim about checkpointing, judged on committed runs (docs/answers.md), and, where no
run measured a point, on exact memory predictions and step times fitted to the runs."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ckptbench.cli.common import HeadroomOpt, err, fail, warn
from ckptbench.errors import CkptbenchError, ConfigError, RunFailure
from ckptbench.results.fit import DEFAULT_HEADROOM

if TYPE_CHECKING:  # imported when the claims are answered: the CLI stays fast to start
    from ckptbench.answers.claims import Answers
    from ckptbench.answers.predictions import Predictions
    from ckptbench.answers.verdicts import Budget
    from ckptbench.results.store import Run

RunsArg = Annotated[list[str], typer.Argument(
    metavar="RUN...", help="Run directories, preferred first: the first run holding a point is the one cited.")]
AnswersOutOpt = Annotated[Path | None, typer.Option(
    "--out", metavar="FILE", help="Write the Markdown here and its plot next to it (default: print the Markdown).")]
ReadmeOpt = Annotated[Path | None, typer.Option(
    "--readme", metavar="FILE", help="Also replace the verdict table between the answers markers of this README.")]
AnswersBudgetOpt = Annotated[str, typer.Option("--budget", metavar="SIZE", help="The card: GiB (80) or with a unit.")]
NoPredictOpt = Annotated[bool, typer.Option(
    "--measured-only", help="Judge on measured points only: no memory predictions (the estimator), no fitted step "
    "times; faster, and more claims stay not settled.")]


def answers_cmd(
    runs: RunsArg,
    out_file: AnswersOutOpt = None,
    budget: AnswersBudgetOpt = "80",
    headroom: HeadroomOpt = DEFAULT_HEADROOM,
    readme: ReadmeOpt = None,
    measured_only: NoPredictOpt = False,
) -> None:
    """Judge the fourteen claims about checkpointing LLaMA-7B on an 80 GB card from measured runs, and where
    nothing was measured, from exact memory predictions and fitted step times (each labelled)."""
    from ckptbench.render.answers import pending_lines, publish_answers, verdict_table

    command = shlex.join(["ckptbench", "answers", *runs, "--budget", budget, "--headroom", headroom,
                          *(["--measured-only"] if measured_only else []),
                          *(["--out", str(out_file)] if out_file else [])])
    try:
        _check_outputs(out_file, readme)  # before the runs are read: nothing is judged for a file never written
        answers = _answers(runs, budget=budget, headroom=headroom, predict=not measured_only)
        done = publish_answers(answers, out=out_file, readme=readme, command=command)
    except CkptbenchError as exc:
        raise fail(exc) from None
    except OSError as exc:  # a full disk: a failure of the disk (exit 1), not bad input; no file is left cut
        raise fail(RunFailure(f"answers: cannot write {out_file or readme} ({exc.strerror or exc}); the files written "
                              "are whole, none is cut")) from None
    if not answers.in_scope:
        sc = answers.scope
        warn(f"these runs hold no {sc.model} point at seq {sc.seq_len} in {sc.precision}, the setup the claims are "
             "about: no claim can be judged from them")
    for path in done.files:
        err.print(f"wrote {path}", markup=False)
    for line in pending_lines(answers):
        err.print(line, markup=False, soft_wrap=True)
    # stdout: the whole Markdown, or, when it went to a file, the short table the README carries
    typer.echo(done.markdown if out_file is None else verdict_table(answers, link=str(out_file)), nl=False)


def _check_outputs(out_file: Path | None, readme: Path | None) -> None:
    """--out and --readme may not name a run's own files (nor --out the README it also rewrites); the README
    must hold the answers markers."""
    from ckptbench.config.files import read_bounded_text
    from ckptbench.render.answers import MAX_README_BYTES, PLOT_FILE, readme_block_bounds
    from ckptbench.results.paths import check_not_run_file

    if out_file is not None:
        check_not_run_file(out_file, option="--out")
        check_not_run_file(out_file.parent / PLOT_FILE, option="--out")
    if readme is not None:
        check_not_run_file(readme, option="--readme")
        # Before the predictions (tens of seconds): a README without the markers is refused at once. The
        # README is read again when the table is written (publish_answers), which refuses it as well.
        try:
            text = read_bounded_text(readme, limit_bytes=MAX_README_BYTES, what="a README (Markdown)")
        except OSError as exc:  # a README that is not there or cannot be read: the command line's mistake
            raise ConfigError(f"--readme {readme}: cannot read it ({exc.strerror or exc})") from None
        readme_block_bounds(text)


def _answers(runs: list[str], *, budget: str, headroom: str, predict: bool) -> Answers:
    from ckptbench.answers.claims import answer_claims, holds_scope
    from ckptbench.answers.evidence import Scope
    from ckptbench.answers.verdicts import Budget
    from ckptbench.results.store import load_run
    from ckptbench.units import parse_headroom, parse_size

    budget_bytes = parse_size(budget)
    loaded = [load_run(r) for r in runs]
    limit = Budget.for_runs(budget_bytes, parse_headroom(headroom, budget_bytes=budget_bytes), loaded)
    # The predictions are of the claims' own setup (LLaMA-7B's thread): only for runs in its scope
    predictions = _predictions(loaded, limit) if predict and holds_scope(loaded, Scope()) else None
    return answer_claims(loaded, budget=limit, predictions=predictions)


def _predictions(runs: list[Run], limit: Budget) -> Predictions:
    """What the claims need that no run measured: predicted on a CPU (tens of seconds; progress on stderr)."""
    from ckptbench.advise.answers_predictions import predict_for_claims
    from ckptbench.answers.evidence import Scope
    from ckptbench.cli.progress import EstimateProgressBar

    with EstimateProgressBar(err) as bar:
        return predict_for_claims(runs, scope=Scope(), limit_bytes=limit.limit_bytes, on_progress=bar.update)
