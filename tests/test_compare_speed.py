"""compare at 20,000 points (issue 24): the quick paths give what the plain ones gave, and the terminal table
fits a terminal in rows too, saying what it left out.

No timings here (scripts/bench_tool.py measures them): each test pins an equality with the plain rule, or a bound
on what is built (rows).
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from rich.console import Console
from typer.testing import CliRunner

from ckptbench.analysis.compare import Comparison, compare_refs
from ckptbench.cli.main import app
from ckptbench.render.compare import LISTED_MAX, TABLE_MAX_ROWS, compare_json, compare_table, display_rows
from ckptbench.render.tables import FitTable
from ckptbench.results import store
from ckptbench.results.record import PointRecord
from ckptbench.results.store import load_run
from tests._synthetic_runs import synthetic_run

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "tests" / "fixtures" / "runs"
EVERY_ROW = "every row: --format markdown, csv or json"


def _text(renderables: list[Any], width: int = 120) -> str:
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    for r in renderables:
        console.print(r, soft_wrap=True)
    return console.export_text()


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """300 points each side, every one 30% slower in the new run (1,800 rows, 900 of them changed)."""
    root = tmp_path_factory.mktemp("big")
    return synthetic_run(root / "base-300", 300), synthetic_run(root / "new-300", 300, scale=1.3)


@pytest.fixture(scope="module")
def big_comp(big: tuple[Path, Path]) -> Comparison:
    return compare_refs(*big)


# -- the terminal table -----------------------------------------------------------------------------------
@pytest.mark.parametrize("new", ["base", "mem10", "slow", "oom", "grid", "few"])
def test_a_table_within_the_limit_is_whole_and_unchanged(new: str) -> None:
    comp = compare_refs(RUNS / "base", RUNS / new, allow_different=True)
    for only_changed in (False, True):
        whole = compare_table(comp, only_changed=only_changed, max_rows=None)
        assert _text(compare_table(comp, only_changed=only_changed)) == _text(whole)
        assert "does not fit a terminal" not in _text(whole)


def test_a_long_table_keeps_the_changed_rows_and_says_what_it_left_out() -> None:
    comp = compare_refs(RUNS / "base", RUNS / "mem10")
    table, *trailer = compare_table(comp, max_rows=3)
    assert isinstance(table, FitTable)
    assert [(r["point"], r["metric"]) for r in table.rows] == [
        ("none b=2 s=64 fp32", "peak allocated"), ("none b=2 s=64 fp32", "peak reserved"),
        ("none b=2 s=64 fp32", "activation"),
    ]
    total = len(display_rows(comp))
    assert total > 3
    lines = [str(t) for t in trailer]
    assert lines[-2] == (f"a table of {total:,} rows does not fit a terminal: 3 shown, left out: the unchanged and "
                         f"within-noise rows; {EVERY_ROW}")
    assert lines[-1].startswith("4 matched points: 1 worse")


def test_the_changed_rows_are_cut_at_whole_points_in_order(big_comp: Comparison) -> None:
    table, *trailer = compare_table(big_comp, max_rows=100)
    assert isinstance(table, FitTable)
    assert len(table.rows) == 99  # 33 points of 3 changed rows; the 34th would pass 100
    first = [p.label for p in big_comp.points[:33]]
    assert list(dict.fromkeys(r["point"] for r in table.rows)) == first
    note = next(str(t) for t in trailer if "does not fit" in str(t))
    assert note == ("a table of 1,800 rows does not fit a terminal: 99 shown, left out: the unchanged and within-noise "
                    f"rows and the changed rows of the last 267 changed points; {EVERY_ROW}")
    # the step-time evidence lines are those of the shown points only
    assert sum("step time worse" in str(t) for t in trailer) == 33


def test_the_table_builds_at_most_the_limit_of_rows(big_comp: Comparison, monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[int] = []
    import ckptbench.render.compare as render_compare

    plain = render_compare.display_rows

    def counting(*args: Any, **kwargs: Any) -> list[dict[str, str]]:
        rows = plain(*args, **kwargs)
        built.append(len(rows))
        return rows

    monkeypatch.setattr(render_compare, "display_rows", counting)
    table = compare_table(big_comp)[0]
    assert isinstance(table, FitTable) and len(table.rows) == 900 <= TABLE_MAX_ROWS
    assert built == [900]  # not 1,800 rows made and then cut


def test_the_cli_table_of_a_long_comparison_fits_and_markdown_has_every_row(big: tuple[Path, Path]) -> None:
    runner = CliRunner(env={"COLUMNS": "120"})
    table = runner.invoke(app, ["compare", str(big[0]), str(big[1])])
    assert table.exit_code == 0, table.output
    body = [line for line in table.stdout.splitlines() if line.startswith("│")]
    assert len(body) == 900
    assert ("a table of 1,800 rows does not fit a terminal: 900 shown, left out: the unchanged and within-noise "
            f"rows; {EVERY_ROW}") in table.stdout
    md = runner.invoke(app, ["compare", str(big[0]), str(big[1]), "--format", "markdown"])
    assert sum(line.startswith("| ") for line in md.stdout.splitlines()) == 1800 + 2  # every row, header, rule


def test_added_and_removed_points_are_listed_up_to_the_limit_then_counted(tmp_path: Path) -> None:
    base = synthetic_run(tmp_path / "base", LISTED_MAX + 20)
    new = synthetic_run(tmp_path / "new", 5)
    comp = compare_refs(base, new)
    assert len(comp.removed) == LISTED_MAX + 15
    lines = [str(t) for t in compare_table(comp)[1:]]
    removed = [line for line in lines if line.startswith("removed (only in base)")]
    assert len(removed) == LISTED_MAX + 1
    assert removed[-1] == "removed (only in base): 15 more points (--format markdown, csv or json lists every one)"
    md = CliRunner().invoke(app, ["compare", str(base), str(new), "--format", "markdown"]).stdout
    assert sum(line.startswith("- removed (only in base)") for line in md.splitlines()) == LISTED_MAX + 15


# -- JSON written as the comparison is met ----------------------------------------------------------------
@pytest.mark.parametrize("new", ["base", "mem10", "oom", "grid", "few"])
def test_json_is_the_documented_shape_written_in_one_pass(new: str, big_comp: Comparison) -> None:
    for comp in (compare_refs(RUNS / "base", RUNS / new, allow_different=True), big_comp):
        whole = comp.to_dict()
        assert compare_json(comp) == json.dumps(whole, indent=2, sort_keys=True) + "\n"
        whole["points"] = [p for p in whole["points"] if p["mark"] not in ("unchanged", "within noise")]
        assert compare_json(comp, only_changed=True) == json.dumps(whole, indent=2, sort_keys=True) + "\n"


# -- reading points.jsonl in one pass ---------------------------------------------------------------------
_LINE = b'{"key": {"layout": "none", "batch_size": 1}, "status": "ok", '
_ODD = [b'"losses": [NaN, Infinity, -Infinity]}', b'"status": "oom"}', b'"zz": 1e400, "yy": 123456789012345678901}',
        b'"peak_allocated_bytes": 1.0}', b'"peak_allocated_bytes": "12"}', b'"search": 1}', b'"search": "true"}',
        b'"reason": "a\tb"}', b'"zz": "\\ud800"}', b'"zz": "\xed\xa0\x80"}', b'"zz": "\xff"}', b'"zz": 01}',
        b'"zz": [1,2,]}', b'"zz": nan}', b'"memory": {"leaked": 0, "qq": [1, {"a": null}]}, "x": {"y": -0.0}}',
        b'"step_times_s": [1, 2.5e-3], "plan": {"a": [1, 2, {"b": 3}]}}', b'"step_times_s": [0.0]}',
        '"reason": "\u2603 \\u00e9"}'.encode()]


@pytest.mark.parametrize("tail", _ODD)
def test_one_pass_reading_gives_the_record_of_the_plain_reading_or_refuses(tail: bytes) -> None:
    line = _LINE + tail
    try:
        plain: Any = PointRecord.read(json.loads(line))
    except (ValueError, ValidationError) as exc:
        plain = type(exc)
    try:
        quick: Any = PointRecord.read_json(line)
    except ValidationError:
        return  # refused: the reader takes the plain path
    assert plain is not ValidationError and not isinstance(plain, type), (line, plain)
    assert repr(quick.model_dump()) == repr(plain.model_dump())
    assert repr(quick.model_extra) == repr(plain.model_extra) and quick.unknown_fields() == plain.unknown_fields()


def _every_run() -> list[Path]:
    fixtures = ROOT / "tests" / "fixtures"
    return sorted({p.parent for p in [*fixtures.rglob("points.jsonl"), *(ROOT / "results").rglob("points.jsonl")]})


def _odd_run(dest: Path) -> Path:
    """A run whose lines hold unknown fields (top level and nested), a damaged line, a line nested too deep, an
    invalid record and a cut-off last line: each costs a note."""
    run = synthetic_run(dest, 3)
    good = (run / "points.jsonl").read_text().splitlines()
    unknown = json.loads(good[1]) | {"zz": [1, {"a": None}]}
    unknown["memory"]["qq"] = 2
    deep = json.loads(good[2]) | {"deep": json.loads("[" * 70 + "]" * 70)}  # kept by a parser unbounded
    lines = [good[0], json.dumps(unknown), "{not json", json.dumps(deep), '{"key": {}, "status": "ok"}', good[2][:40]]
    (run / "points.jsonl").write_text("\n".join(lines))
    return run


@pytest.mark.filterwarnings("ignore")  # damaged runs warn about their lines, alike both ways
def test_runs_read_in_one_pass_as_line_by_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    runs = [*_every_run(), _odd_run(tmp_path / "odd")]
    assert len(runs) > 20
    quick = {p: _loaded(p) for p in runs}

    def refuse(text: bytes) -> PointRecord:
        return PointRecord.model_validate_json(b"{")  # always a ValidationError: every line takes the plain path

    monkeypatch.setattr(store.PointRecord, "read_json", staticmethod(refuse))
    plain = {p: _loaded(p) for p in runs}
    assert quick == plain
    assert len(plain[runs[-1]][0]) == 2 and len(plain[runs[-1]][1]) == 5  # two records, five notes


def _loaded(path: Path) -> Any:
    try:
        run = load_run(path)
    except Exception as exc:  # a run that cannot be read must fail alike both ways
        return ("error", str(exc))
    return [repr(p.model_dump()) for p in run.points], run.warnings


def test_every_gate_failure_is_printed_on_its_own_line(big: tuple[Path, Path]) -> None:
    result = CliRunner(env={"COLUMNS": "60"}).invoke(app, ["compare", str(big[0]), str(big[1]), "--fail-time", "5",
                                                           "--format", "json"])
    assert result.exit_code == 3
    failed = [line for line in result.stderr.splitlines() if line.startswith("gate failed: ")]
    assert len(failed) == 300 and len(set(failed)) == 300  # not wrapped at 60 columns, none left out
    assert failed[0].startswith("gate failed: none b=1 s=2048 bf16: median step time +30.00% > 5% (")


def _steps(fn: Any) -> int:
    """How many Python lines and calls ``fn()`` runs, loop iterations included (sys.settrace): a measure of work
    that no busy machine bends."""
    steps = 0

    def trace(frame: Any, event: str, arg: Any) -> Any:
        nonlocal steps
        steps += 1
        return trace

    sys.settrace(trace)
    try:
        fn()
    finally:
        sys.settrace(None)
    return steps


def test_compare_is_linear_in_the_points(tmp_path: Path) -> None:
    """Four times the points, at most four times the work (reading, comparing, JSON and the table): a step
    quadratic in the points (one set over every key for every key, the old point_labels) makes it about 16."""
    work = {}
    for n in (55, 220):
        base, new = synthetic_run(tmp_path / f"base-{n}", n), synthetic_run(tmp_path / f"new-{n}", n, scale=1.3)

        def run(base: Path = base, new: Path = new) -> None:
            comp = compare_refs(base, new)
            compare_json(comp)
            compare_table(comp)

        work[n] = _steps(run)
    assert work[220] < 4 * work[55], work
