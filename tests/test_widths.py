"""issue 35: every table command at 20, 40, 60 and 80 columns: no number is cut, and every column that is not shown
is named. At 40 columns numbers were cut (recommend's tok/s '1' for 1,000, estimate's seq '3' for 32, compare's
'25.' for 25.55 MiB); at 20 values vanished with no 'not shown' note.

Each table is compared with the same table at 200 columns: in every column shown, the tokens that hold a digit
(its numbers, 's=2048', 'first:16') must be the same, in the same order; every column of the wide table that is
missing is named under the table ('not shown at N columns: ...')."""

from __future__ import annotations

import io
import itertools
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from rich.cells import cell_len
from rich.console import Console, RenderableType
from typer.testing import CliRunner

from ckptbench.cli.main import app
from ckptbench.results.store import load_run

FIXTURES = Path(__file__).parent / "fixtures"
SYNTHETIC = FIXTURES / "report_runs" / "synthetic-h200-llama7b"
TINY_RUN = FIXTURES / "report_runs" / "tiny-capped"
WIDTHS = (20, 40, 60, 80)
WIDE = 200
_BREAKS = (",", "@", "=", "_")  # wrapped text breaks after these without a space (render/tables.py)
_DIGIT = re.compile(r"\d")


@dataclass
class Table:
    """One rendered table: its column names, each column's text (lines joined), the text after it."""

    names: list[str]
    text: dict[str, str]
    width: int
    after: str


def _key(name: str) -> str:
    return "".join(name.split())


def _join(lines: list[str]) -> str:
    """A column's lines as one text: a line that ends where text may break without a space joins the next."""
    out = ""
    for line in (x.strip() for x in lines):
        if not line:
            continue
        out += line if not out or out.endswith(_BREAKS) else " " + line
    return out


def parse(text: str) -> list[Table]:
    """Every rich table in ``text`` (heavy header, light body)."""
    lines = text.splitlines()
    tables: list[Table] = []
    i = 0
    while i < len(lines):
        top = lines[i]
        if not top.lstrip().startswith("┏"):
            i += 1
            continue
        left = top.index("┏")
        edges = [left, *(j for j, ch in enumerate(top) if ch == "┳"), top.index("┓")]
        cols = list(itertools.pairwise(edges))
        header: list[list[str]] = [[] for _ in cols]
        body: list[list[str]] = [[] for _ in cols]
        i += 1
        while i < len(lines) and not lines[i].lstrip().startswith("└"):
            line = lines[i]
            target = header if line.lstrip().startswith("┃") else body if line.lstrip().startswith("│") else None
            if target is not None:
                for k, (a, b) in enumerate(cols):
                    target[k].append(line[a + 1:b])
            i += 1
        bottom = i
        i += 1
        after = []
        while i < len(lines) and not lines[i].lstrip().startswith("┏") and lines[i].strip():
            after.append(lines[i].strip())
            i += 1
        names = [" ".join(" ".join(h).split()) for h in header]
        tables.append(Table(names, {n: _join(b) for n, b in zip(names, body, strict=True)},
                            max(cell_len(x) for x in lines[lines.index(top):bottom + 1]), " ".join(after)))
    return tables


def digit_tokens(text: str) -> list[str]:
    return [t for t in text.split() if _DIGIT.search(t)]


def check_width(narrow_text: str, wide_text: str, width: int) -> None:
    """No table line wider than ``width``, nothing squeezed ('…'), no number cut, every missing column named."""
    narrow, wide = parse(narrow_text), parse(wide_text)
    assert len(narrow) == len(wide) and narrow, (len(narrow), len(wide), narrow_text)
    assert "…" not in narrow_text
    for n, w in zip(narrow, wide, strict=True):
        assert n.width <= width, (width, n.width, narrow_text)
        by_key = {_key(name): name for name in w.names}
        for name in n.names:
            wide_name = by_key.get(_key(name))
            assert wide_name is not None, (name, w.names)
            assert digit_tokens(n.text[name]) == digit_tokens(w.text[wide_name]), (width, name, n.text[name])
        shown = {_key(name) for name in n.names}
        missing = [name for name in w.names if _key(name) not in shown]
        if missing:
            note = " ".join(n.after.split())
            assert f"not shown at {width} columns:" in note, (width, n.after)
            for name in missing:
                assert name in note, (width, name, note)


def rendered(renderable: RenderableType, width: int) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None, legacy_windows=False)
    console.print(renderable)
    return console.file.getvalue()  # type: ignore[attr-defined]


def cli(args: list[str], width: int) -> str:
    result = CliRunner().invoke(app, args, env={"COLUMNS": str(width)})
    assert result.exit_code in (0, 3), result.output
    return result.stdout


def at_every_width(make: Callable[[int], str]) -> None:
    wide = make(WIDE)
    for width in WIDTHS:
        check_width(make(width), wide, width)


# ------------------------------------------------------------------ the commands


@pytest.mark.parametrize("run", [SYNTHETIC, Path("results/h200-gpu-check-1/axes")], ids=["synthetic", "axes"])
def test_sweep_summary(run: Path) -> None:
    from ckptbench.render.summary import summary_table

    table = summary_table(load_run(run))
    at_every_width(lambda w: rendered(table, w))


def test_layouts() -> None:
    at_every_width(lambda w: cli(["layouts", "configs/llama7b.yaml"], w))


@pytest.mark.parametrize(("base", "new"), [("runs/base", "runs/mem10"), ("runs/oom", "runs/base")],
                         ids=["mem10", "oom"])
def test_compare(base: str, new: str) -> None:
    at_every_width(lambda w: cli(["compare", str(FIXTURES / base), str(FIXTURES / new)], w))


def test_recommend() -> None:
    at_every_width(lambda w: cli(["recommend", str(SYNTHETIC), "--budget", "80"], w))


def test_gpus() -> None:
    at_every_width(lambda w: cli(["gpus"], w))


def test_tune() -> None:
    from ckptbench.analysis.recommend import recommend
    from ckptbench.render.tune import rich_tune, tune_search

    run = load_run(FIXTURES / "tune" / "searched")
    search = tune_search(run)
    assert search is not None
    rec = recommend(run, budget_bytes=36 * 2**20, headroom_bytes=0)  # as tests/test_tune_render.py
    answer = rich_tune(search, rec, run=run)
    at_every_width(lambda w: rendered(answer, w))


@pytest.mark.parametrize("gpu", [None, "h100-80gb"], ids=["cpu-target", "on-a-card"])
def test_estimate(gpu: str | None) -> None:
    """`ckptbench estimate configs/tiny.yaml` (and --gpu: the verdict columns), estimated once, rendered at each
    width as the command renders it."""
    from ckptbench.config.load import load_config
    from ckptbench.estimator.estimator import estimate_config
    from ckptbench.estimator.gpus import gpu_model
    from ckptbench.render.estimate import estimate_table

    cfg = load_config(Path("configs/tiny.yaml"))
    card = gpu_model(gpu) if gpu else None
    estimates = estimate_config(cfg, target="cuda" if gpu else None, gpu=card, default_gpu=card, workers=1)
    table = estimate_table(estimates, name=cfg.name)
    at_every_width(lambda w: rendered(table, w))


def test_estimate_beside_a_run() -> None:
    """Beside a run's measurements (measured and error columns), as `estimate RUN` shows them."""
    from ckptbench.render.estimate import estimate_table
    from tests.test_tables import estimates_like

    estimates, measured = estimates_like(TINY_RUN)
    table = estimate_table(estimates, name="tiny-capped", measured=measured)
    at_every_width(lambda w: rendered(table, w))


def test_advise() -> None:
    from ckptbench.advise.advice import advise
    from ckptbench.advise.request import AdviseRequest
    from ckptbench.render.advise import advise_renderable

    advice = advise(AdviseRequest(model="tiny", seqs=(64,), batches=(2, 8)))
    answer = advise_renderable(advice)
    at_every_width(lambda w: rendered(answer, w))


def test_a_cut_number_is_caught() -> None:
    """The check itself: the same table with a number cut short, or a column gone unnamed, fails it."""
    from ckptbench.render.summary import summary_table

    wide = rendered(summary_table(load_run(SYNTHETIC)), WIDE)
    narrow = rendered(summary_table(load_run(SYNTHETIC)), 80)
    with pytest.raises(AssertionError):
        check_width(narrow.replace("13,237", "13,2  "), wide, 80)
    with pytest.raises(AssertionError):
        check_width(re.sub(r"not shown at 80 columns:.*", "", narrow, flags=re.S), wide, 80)
