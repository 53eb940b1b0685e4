"""Tables that fit the terminal: columns by priority, numbers never shortened, goldens at 80/120/200 columns."""

from __future__ import annotations

import io
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console, RenderableType
from typer.testing import CliRunner

from ckptbench.cli import common
from ckptbench.cli.main import app
from ckptbench.config.grid import Point
from ckptbench.estimator.record import Estimate
from ckptbench.render.estimate import estimate_table
from ckptbench.render.summary import summary_rows, summary_table
from ckptbench.render.tables import Column, FitTable, fit_columns, wrap_text
from ckptbench.results.store import load_run

FIXTURES = Path(__file__).parent / "fixtures"
GOLDEN = FIXTURES / "golden" / "widths"
SYNTHETIC = FIXTURES / "report_runs" / "synthetic-h200-llama7b"
TINY = FIXTURES / "report_runs" / "tiny-capped"
WIDTHS = (80, 120, 200)
UPDATE = os.environ.get("CKPTBENCH_UPDATE_GOLDEN") == "1"  # rewrite goldens after an intended change
runner = CliRunner()


def golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if UPDATE:
        path.write_text(text, encoding="utf-8")
    assert text == path.read_text(encoding="utf-8"), f"{name} differs (CKPTBENCH_UPDATE_GOLDEN=1 rewrites it)"


def rendered(renderable: RenderableType, width: int) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None, legacy_windows=False)
    console.print(renderable)
    return "".join(line.rstrip() + "\n" for line in console.file.getvalue().splitlines())  # type: ignore[attr-defined]


def cli(*args: str, width: int) -> str:
    result = runner.invoke(app, list(args), env={"COLUMNS": str(width)})
    assert result.exit_code in (0, 3), result.output
    return "".join(line.rstrip() + "\n" for line in result.stdout.splitlines())


def assert_fits(text: str, width: int) -> None:
    """Every table line fits (sentences after a table are left to the terminal) and nothing is squeezed."""
    table_lines = [line for line in text.splitlines() if line[:1] in "┏┃┡│└"]
    assert table_lines and max(len(line) for line in table_lines) <= width
    assert "…" not in text  # rich squeezing a cell: never a number cut short


# ------------------------------------------------------------------ the fit mechanism


ROWS = [{"name": "alpha beta gamma", "n": "123,456", "big": "99.99 GiB", "extra": "x" * 30}]
COLS = [Column("name", wrap=True, min_width=5), Column("n", numeric=True), Column("big", priority=1, numeric=True),
        Column("extra", priority=2)]


def test_wide_enough_shows_every_column_at_its_natural_width() -> None:
    fit = fit_columns(COLS, ROWS, 200)
    assert [c.name for c in fit.columns] == ["name", "n", "big", "extra"] and fit.left_out == ()
    assert fit.widths == (16, 7, 9, 30)


def test_narrow_leaves_out_the_least_important_first_and_says_so() -> None:
    fit = fit_columns(COLS, ROWS, 50)
    assert [c.name for c in fit.columns] == ["name", "n", "big"] and fit.left_out == ("extra",)
    fit = fit_columns(COLS, ROWS, 30)
    assert [c.name for c in fit.columns] == ["name", "n"] and fit.left_out == ("big", "extra")
    text = rendered(FitTable(ROWS, COLS), 30)
    assert "not shown at 30 columns: big, extra (widen the terminal or set COLUMNS)" in " ".join(text.split())


def test_numbers_keep_their_width_text_wraps_instead() -> None:
    fit = fit_columns(COLS, ROWS, 26)  # 'name' must give way: it wraps, the number stays whole
    assert dict(zip([c.name for c in fit.columns], fit.widths, strict=True)) == {"name": 12, "n": 7}
    assert fit.total_width == 26
    text = rendered(FitTable(ROWS, COLS), 26)
    assert "123,456" in text and "alpha beta" in text and "gamma" in text
    assert_fits(text, 26)


def test_an_optional_column_never_makes_an_essential_one_wrap() -> None:
    # at 41 'big' would fit only by wrapping 'name' (16 -> 15 cells): it is left out instead
    assert fit_columns(COLS, ROWS, 41).left_out == ("big", "extra")
    assert fit_columns(COLS, ROWS, 42).left_out == ("extra",)


@pytest.mark.parametrize("width", range(12, 60, 3))
def test_a_fit_never_exceeds_the_width_nor_narrows_a_number(width: int) -> None:
    cols = [Column("id"), Column("tokens", priority=1, numeric=True), Column("bytes", priority=2, numeric=True)]
    rows = [{"id": "abcdef", "tokens": "123,456,789", "bytes": "1023.99 GiB"}]
    fit = fit_columns(cols, rows, width)
    assert all(w == 11 for c, w in zip(fit.columns, fit.widths, strict=True) if c.numeric)
    assert fit.total_width <= max(width, 6 + 4)  # only the essential column may exceed a tiny width


def test_when_only_one_optional_column_fits_the_more_important_one_wins() -> None:
    cols = [Column("a"), Column("minor", priority=3, numeric=True), Column("major", priority=1, numeric=True)]
    rows = [{"a": "x", "minor": "12345", "major": "67890"}]
    fit = fit_columns(cols, rows, 20)  # room for 'a' and one 5-cell column
    assert [c.name for c in fit.columns] == ["a", "major"] and fit.left_out == ("minor",)


def test_a_column_of_dashes_gives_way_first() -> None:
    cols = [Column("a"), Column("mfu", priority=1), Column("act", priority=3)]
    rows = [{"a": "x", "mfu": "-", "act": "1.00"}, {"a": "y", "mfu": "-", "act": "2.00"}]
    assert fit_columns(cols, rows, 14).left_out == ("mfu",)  # room for one: the one with numbers


def test_a_wide_low_priority_column_does_not_hide_a_narrow_one() -> None:
    cols = [Column("a"), Column("wide", priority=1), Column("narrow", priority=2, numeric=True)]
    rows = [{"a": "x", "wide": "w" * 60, "narrow": "1.00"}]
    assert [c.name for c in fit_columns(cols, rows, 30).columns] == ["a", "narrow"]


def test_wrapped_lists_break_after_commas_never_inside_a_number() -> None:
    assert wrap_text("0,2,4,6,8,10,12,14,16,18,20,22,24,26,28,30", 12).splitlines() == [
        "0,2,4,6,8,", "10,12,14,16,", "18,20,22,24,", "26,28,30"]
    assert wrap_text("backward of the loss and logits", 16).splitlines() == ["backward of the", "loss and logits"]


@pytest.mark.parametrize("width", range(70, 261, 19))
def test_summary_never_cuts_a_number_at_any_width(width: int) -> None:
    run = load_run(SYNTHETIC)
    text = rendered(summary_table(run), width)
    assert_fits(text, width)
    for row in summary_rows(run):  # the essential numbers, each whole on its line, at every width
        for column in ("batch", "seq", "peak", "step ms"):
            assert f" {row[column]} │" in text, (column, row[column])
    assert "oom (tried" in text and "CUDA out of memory" not in text


# ------------------------------------------------------------------ goldens at 80, 120, 200 columns


@pytest.mark.parametrize("width", WIDTHS)
def test_summary_golden(width: int) -> None:
    text = rendered(summary_table(load_run(SYNTHETIC)), width)
    assert_fits(text, width)
    golden(f"summary-synthetic-{width}.txt", text)


@pytest.mark.parametrize("width", WIDTHS)
def test_layouts_golden(width: int) -> None:
    text = cli("layouts", "configs/llama7b.yaml", width=width)
    assert_fits(text, width)
    golden(f"layouts-llama7b-{width}.txt", text)
    if width >= 120:  # the full layout name and every layer index
        assert "│ all@attn+mlp │" in text and "0,2,4,6,8,10,12,14,16,18,20,22,24,26,28,30" in text


@pytest.mark.parametrize("width", WIDTHS)
def test_compare_golden(width: int) -> None:
    runs = FIXTURES / "runs"
    text = cli("compare", str(runs / "base"), str(runs / "mem10"), "--only-changed", width=width)
    assert_fits(text, width)
    golden(f"compare-base-mem10-{width}.txt", text)


@pytest.mark.parametrize("width", WIDTHS)
def test_recommend_golden(width: int) -> None:
    text = cli("recommend", str(SYNTHETIC), "--budget", "80", width=width)
    assert_fits(text, width)
    golden(f"recommend-synthetic-{width}.txt", text)


@pytest.mark.parametrize("width", WIDTHS)
def test_estimate_golden(width: int) -> None:
    # Estimates built from the run's measurements: the golden pins the table, not the estimator.
    estimates, measured = estimates_like(TINY)
    text = rendered(estimate_table(estimates, name="tiny-capped", measured=measured), width)
    assert_fits(text, width)
    golden(f"estimate-tiny-{width}.txt", text)


# ------------------------------------------------------------------ plain text: the body joined here, as rich would


class _AsciiFile(io.StringIO):
    encoding = "ascii"  # rich then draws its boxes in ASCII


def _both(table: FitTable, width: int, file: type[io.StringIO] = io.StringIO, *, colour: bool = False
          ) -> tuple[str, str, bool]:
    """What a console prints of ``table`` (its body joined by FitTable) and of rich's own table, unstripped; whether
    the first left its body to rich. ``colour``: a truecolor terminal, else a console without colours."""
    texts, by_rich = [], []
    original = FitTable._table

    def made(self: FitTable, *args: object, rows: bool = True) -> object:
        by_rich.append(rows)
        return original(self, *args, rows=rows)  # type: ignore[arg-type]

    for renderable in (table, table.table(width)):
        console = Console(file=file(), width=width, color_system="truecolor" if colour else None,
                          force_terminal=colour, legacy_windows=False)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(FitTable, "_table", made)
            console.print(renderable)
        texts.append(console.file.getvalue())  # type: ignore[attr-defined]
    return texts[0], texts[1], any(by_rich)


def _tables() -> Iterator[tuple[str, FitTable]]:
    estimates, measured = estimates_like(TINY)
    yield "estimate", estimate_table(estimates, name="tiny-capped", measured=measured)
    yield "summary", summary_table(load_run(SYNTHETIC))
    cols = [Column("name", wrap=True, min_width=6, breaks="@"), Column("value", numeric=True),
            Column("note", priority=2, wrap=True, min_width=8), Column("extra", priority=3)]
    rows = [{"name": "every:2@selective, last:6", "value": "1,234.5 GiB", "note": "a few words that wrap here",
             "extra": "x"},
            {"name": "none", "value": "7", "note": "", "extra": ""},
            {"name": "all", "value": "12 s  ", "note": "one\ntwo lines", "extra": "yes"},
            {"name": "ascii ×", "value": "1", "note": "-", "extra": "-"}]  # a wider character: rich's own path
    yield "mixed", FitTable(rows, cols, title="a [bold]title[/] that is long enough to wrap at forty columns",
                            caption="a caption", styles=[None, "yellow", None, None], title_justify="left")
    yield "plain rows", FitTable(rows[:3], cols, caption="only a caption")
    yield "no rows", FitTable([], cols, title="empty")


@pytest.mark.parametrize("width", [24, 40, 57, 80, 120, 200])
def test_plain_tables_print_what_rich_prints_byte_for_byte(width: int) -> None:
    for name, table in _tables():
        for file, colour in ((io.StringIO, False), (_AsciiFile, False), (io.StringIO, True)):
            mine, theirs, by_rich = _both(table, width, file, colour=colour)
            assert mine == theirs, f"{name} at {width} columns ({file.__name__}, colour {colour})"
            # what this compares: the body joined here, except where a cell needs rich (a wider character), the
            # terminal is too narrow for the columns (their headers wrap), or colours show a row's style
            fit = fit_columns(table.columns, table.rows, width)
            narrow = sum(fit.widths) + 3 * len(fit.widths) + 1 > width or any(
                w < len(c.name) for c, w in zip(fit.columns, fit.widths, strict=True))
            styled = colour and any(table.styles)
            assert by_rich == (name == "mixed" or narrow or styled), f"{name} at {width} columns, colour {colour}"


def test_plain_rows_take_the_joined_body_a_character_rich_measures_does_not() -> None:
    from ckptbench.render import tables

    estimates, measured = estimates_like(TINY)
    table = estimate_table(estimates, name="tiny-capped", measured=measured)
    fit = fit_columns(table.columns, table.rows, 200)
    assert tables._plain_lines(table.rows, fit) is not None  # what the byte-for-byte test compares is this path
    # a character rich measures or changes: the whole table left to rich
    assert tables._plain_lines([{c.name: "a\tb" for c in fit.columns}], fit) is None
    coloured = Console(file=io.StringIO(), width=200, force_terminal=True, color_system="truecolor")
    coloured.print(table)
    assert "\x1b[" in coloured.file.getvalue()  # type: ignore[attr-defined]  # rich's styles: the bold header


# ------------------------------------------------------------------ the width of stdout


@pytest.fixture
def no_terminal(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(common, "_any_terminal", lambda: False)
    monkeypatch.delenv("COLUMNS", raising=False)
    yield


def test_stdout_width_follows_columns_even_when_piped(no_terminal: None, monkeypatch: pytest.MonkeyPatch) -> None:
    assert common.out.width == common.NO_TERMINAL_WIDTH  # no terminal anywhere and no COLUMNS
    monkeypatch.setenv("COLUMNS", "91")
    assert common.out.width == 91


def test_cli_tables_honour_columns() -> None:
    narrow, wide = (cli("layouts", "configs/llama7b.yaml", width=w) for w in (72, 100))
    assert max(len(line) for line in narrow.splitlines()) <= 72 < max(len(line) for line in wide.splitlines()) <= 100
    assert "┃ wraps" not in narrow and "┃ wraps" in wide


def test_h200_estimate_at_80_columns_shows_every_predicted_peak() -> None:
    """`COLUMNS=80 ckptbench estimate results/h200-gpu-check-2/check`: 17 points, each peak a number."""
    text = cli("estimate", "results/h200-gpu-check-2/check", width=80)
    assert_fits(text, 80)
    rows = [line for line in text.splitlines() if line.startswith("│ ")]
    assert len(rows) == 17
    for row in rows:
        cells = [c.strip() for c in row.strip("│").split("│")]
        assert re.fullmatch(r"\d+\.\d\d GiB", cells[3]), row  # est. peak
        assert cells[1].isdigit() and cells[2] == "2048", row  # batch and seq have their width


def estimates_like(run_dir: Path) -> tuple[list[Estimate], dict[str, int | str]]:
    """Estimates shaped like a run's points, for testing the renderer only: each is the run's own
    measured peak split by its measured static parts (a real estimate of the axes run takes ~20 s)."""
    run = load_run(run_dir)
    estimates: list[Estimate] = []
    measured: dict[str, int | str] = {}
    for rec in run.points:
        static = {k: getattr(rec.memory, k) or 0 for k in ("params_bytes", "grads_bytes", "optimizer_state_bytes")}
        peak = rec.peak_allocated_bytes
        breakdown = {"params": static["params_bytes"], "grads": 0, "optimizer_state": static["optimizer_state_bytes"],
                     "activations": max(0, (peak or 0) - sum(static.values())), "logits_loss": 0, "transient": 0,
                     "other": static["grads_bytes"]}
        note = None if peak is not None else f"{rec.status}: nothing measured to build it from"
        estimates.append(Estimate(point=Point.from_key(rec.key), target="cuda", method="fast", peak_bytes=peak,
                                  breakdown=breakdown if peak else {}, static=static, budget_bytes=None, note=note,
                                  peak_at="backward of the loss and logits" if peak else None))
        measured[rec.key_id] = peak if peak is not None else rec.status
    return estimates, measured


@pytest.mark.parametrize("width", [80, 160, 330])
def test_axes_estimate_never_squeezes_a_column(width: int) -> None:
    estimates, measured = estimates_like(Path("results/h200-gpu-check-1/axes"))
    text = rendered(estimate_table(estimates, name="llama7b-axes", measured=measured), width)
    assert_fits(text, width)
    header = next(line for line in text.splitlines() if line.startswith("┃"))
    names = [c.strip() for c in header.strip("┃").split("┃")]
    # Comparing the prediction with the measurement is why a run directory is passed: never left out.
    assert names[:7] == ["layout", "batch", "seq", "setup", "est. peak", "measured", "error"]
    rows = [[c.strip() for c in line.strip("│").split("│")] for line in text.splitlines() if line.startswith("│")]
    for cells in rows:  # a point's first line: every number whole
        if cells[1]:
            assert cells[1].isdigit() and cells[2] == "2048", cells
            assert all(re.fullmatch(r"\d+\.\d\d GiB|-", c) for c in cells[4:6]), cells
    # Text folds onto more lines but nothing of it is lost.
    setups = "".join(cells[3] for cells in rows)
    assert "optimizer=adamw_foreach" in setups and "attn_implementation=eager" in setups
    assert "every:2@selective" in "".join(cells[0] for cells in rows)


def test_axes_estimate_golden_at_80_columns() -> None:
    """A run with a setup column at 80 columns: layout and setup fold, every number whole, measured and error kept."""
    estimates, measured = estimates_like(Path("results/h200-gpu-check-1/axes"))
    golden("estimate-axes-80.txt", rendered(estimate_table(estimates, name="llama7b-axes", measured=measured), 80))


def test_selective_layouts_say_what_they_wrap() -> None:
    from ckptbench.render.layouts import layout_rows
    from tests.conftest import tiny_config

    rows = {r["layout"]: r for r in layout_rows(tiny_config(sweep={"layout": ["none", "all@selective", "all@mlp"]}))}
    assert rows["all@selective"]["wraps"] == "decoder layer, per-op (selective)"
    assert rows["all@mlp"]["wraps"] == "mlp" and rows["none"]["wraps"] == "-"


def test_sweep_summary_of_a_gpu_run_keeps_tokens_per_s_at_80_columns() -> None:
    """A GPU-shaped run at 80 columns: the long status wraps (a size whole on one line) before tok/s gives way."""
    text = rendered(summary_table(load_run(SYNTHETIC)), 80)
    assert_fits(text, 80)
    header = next(line for line in text.splitlines() if line.startswith("┃"))
    assert [c.strip() for c in header.strip("┃").split("┃")] == [
        "layout", "batch", "seq", "peak", "step ms", "tok/s", "status"]
    assert "│ 13,237 │" in text and "not shown at 80 columns" in text and "tok/s," not in text
    assert "1.95 GiB)" in text  # the tried size and its unit on one line


def test_sweep_summary_with_a_setup_column_cuts_no_number_at_80_columns() -> None:
    text = rendered(summary_table(load_run(Path("results/h200-gpu-check-1/axes"))), 80)
    assert_fits(text, 80)
    rows = [[c.strip() for c in line.strip("│").split("│")] for line in text.splitlines() if line.startswith("│")]
    firsts = [cells for cells in rows if cells[1]]
    assert all(cells[2] == "2048" and re.fullmatch(r"\d+\.\d\d GiB|-", cells[4]) for cells in firsts), firsts
    assert "every:2@selective" in "".join(cells[0] for cells in rows)
    assert "attn_implementation=eager" in "".join(cells[3] for cells in rows)
