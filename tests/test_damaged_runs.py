"""Damaged run directories through every reading command: a bad record is skipped naming its line, a bad
run.json field is dropped naming it, nothing crashes, no valid record is lost, no run is made unreadable."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ckptbench.cli.main import app
from ckptbench.results.repair import repair_points_file
from ckptbench.results.store import POINTS_FILE, RUN_FILE
from tests.conftest import copy_run, quiet_load

Record = dict[str, Any]
# `estimate RUN` and report's breakdown trace run.json's config once, not once per command; the CPU guard
# measures the host once, not before every resumed sweep (tests/_est_shared.py, tests/conftest.py)
pytestmark = pytest.mark.usefixtures("shared_estimates", "remembered_host_rate")


class _Deep:
    """A JSON value nested 5,000 deep: json.dumps would recurse, so it is written as text (see damage)."""

    TEXT = "[" * 5000 + "]" * 5000


DEEP = _Deep()


def _dumps(record: Any) -> str:
    """json.dumps, with a _Deep value written as its text."""
    if isinstance(record, dict) and any(isinstance(v, _Deep) for v in record.values()):
        plain = {k: v for k, v in record.items() if not isinstance(v, _Deep)}
        deep = ", ".join(f"{json.dumps(k)}: {v.TEXT}" for k, v in record.items() if isinstance(v, _Deep))
        return json.dumps(plain)[:-1] + ", " + deep + "}"
    return json.dumps(record)


def commands(run: Path, config: Path, tmp: Path) -> dict[str, list[str]]:
    """Every command that reads a run, with the arguments that make it read all of it."""
    return {
        "compare": ["compare", str(run), str(run)],
        "recommend": ["recommend", str(run), "--budget", "1"],
        "report": ["report", str(run), "--out", str(tmp / "report")],
        "estimate": ["estimate", str(run)],
        "resume": ["sweep", str(config), "--resume", str(run), "--no-predict"],
    }


def invoke(args: list[str]) -> Any:
    result = CliRunner().invoke(app, args)
    crashed = result.exception is not None and not isinstance(result.exception, SystemExit)
    assert not crashed, (args[0], repr(result.exception))
    assert "Traceback" not in result.output, result.output
    return result


def lines_of(run: Path) -> list[str]:
    return (run / POINTS_FILE).read_text().splitlines()


def damage(run: Path, line: int, change: Callable[[Record], Any]) -> None:
    """Replace record ``line`` (1-based) of points.jsonl by what ``change`` makes of it."""
    lines = lines_of(run)
    lines[line - 1] = _dumps(change(json.loads(lines[line - 1])))
    (run / POINTS_FILE).write_text("\n".join(lines) + "\n")


def _with(**fields: Any) -> Callable[[Record], Record]:
    return lambda r: {**r, **fields}


def _without(*names: str) -> Callable[[Record], Record]:
    return lambda r: {k: v for k, v in r.items() if k not in names}


def _key(change: Callable[[dict[str, Any]], dict[str, Any]]) -> Callable[[Record], Record]:
    return lambda r: {**r, "key": change(dict(r["key"]))}


# (id, how record 2 is damaged, whether it is still a valid record: skipped records are named by line)
RECORD_CASES: list[tuple[str, Callable[[Record], Any], bool]] = [
    ("key-is-5", _with(key=5), False),
    ("key-is-a-list", _with(key=[1, 2]), False),
    ("key-is-null", _with(key=None), False),
    ("peak-is-a-word", _with(peak_allocated_bytes="lots"), False),
    ("peak-is-nan", _with(peak_allocated_bytes=float("nan")), False),
    ("peak-is-infinite", _with(peak_reserved_bytes=float("inf")), False),
    ("peak-overflows-int64", _with(peak_allocated_bytes=10**30), False),
    ("times-are-words", _with(step_times_s=["a", "b"]), False),
    ("times-are-negative", _with(step_times_s=[-1, -1, -1]), False),
    ("memory-is-a-list", _with(memory=[1]), False),
    ("no-status", _without("status"), False),
    ("only-a-key", lambda r: {"key": r["key"]}, False),
    ("losses-are-words", _with(losses=["x"]), False),
    ("not-an-object", lambda r: [r], False),
    # issue 22: values that crashed the plots, units.py, render/compare.py or json itself
    ("batch-is-a-word", _key(lambda k: {**k, "batch_size": "two"}), False),
    ("batch-is-nan", _key(lambda k: {**k, "batch_size": float("nan")}), False),
    ("batch-is-true", _key(lambda k: {**k, "batch_size": True}), False),
    ("extra-key-is-nan", _key(lambda k: {**k, "new_axis": float("nan")}), False),
    ("context-is-10-to-4000", _with(context_bytes=10**4000), False),
    ("times-are-subnormal", _with(step_times_s=[5e-324] * 3), False),
    ("times-are-huge", _with(step_times_s=[1e308] * 3), False),
    ("warmup-is-huge", _with(warmup_times_s=[1e308]), False),
    ("nested-5000-deep", _with(plan=DEEP), False),
    ("no-step-times", _without("step_times_s"), True),
    ("no-peaks", _without("peak_allocated_bytes", "peak_reserved_bytes"), True),
    ("key-lacks-a-field", _key(lambda k: {f: v for f, v in k.items() if f != "seq_len"}), True),
    ("key-has-an-extra-field", _key(lambda k: {**k, "new_axis": 3}), True),
]


@pytest.mark.parametrize(("case", "change", "valid"), RECORD_CASES, ids=[c[0] for c in RECORD_CASES])
def test_a_damaged_record_is_skipped_by_line_and_the_others_are_kept(
    mini_run: tuple[Path, Path], tmp_path: Path, case: str, change: Callable[[Record], Any], valid: bool
) -> None:
    _, pristine = mini_run
    run = copy_run(pristine, tmp_path / "run")
    damage(run, 2, change)
    loaded = quiet_load(run)
    kept = [json.loads(line) for i, line in enumerate(lines_of(run)) if i != 1 or valid]
    assert [p.to_json() for p in loaded.points] == kept  # in file order, nothing lost
    named = [w for w in loaded.warnings if "line 2 " in w]
    assert (named == []) is valid, loaded.warnings
    for name in ("compare", "recommend"):  # the cheap readers, per case; all of them below, on all cases
        assert invoke(commands(run, Path("unused"), tmp_path)[name]).exit_code == 0


def test_a_line_that_is_not_utf8_costs_only_that_line(mini_run: tuple[Path, Path], tmp_path: Path) -> None:
    run = copy_run(mini_run[1], tmp_path / "run")
    data = (run / POINTS_FILE).read_bytes().split(b"\n")
    (run / POINTS_FILE).write_bytes(b"\n".join([data[0], b'{"key": "\xff\xfe"}', *data[1:]]))
    loaded = quiet_load(run)
    assert len(loaded.points) == 4 and len(loaded.warnings) == 1 and "line 2 (not JSON)" in loaded.warnings[0]


def test_a_run_with_no_points_yet_is_read_without_a_crash(mini_run: tuple[Path, Path], tmp_path: Path) -> None:
    run = copy_run(mini_run[1], tmp_path / "run")
    (run / POINTS_FILE).write_text("")  # killed before its first point
    cmds = commands(run, mini_run[0], tmp_path)
    # compare: no point in common is refused (a gate must not pass on nothing); report: 'no finished points yet'
    for name, code in (("compare", 2), ("recommend", 0), ("report", 2)):
        result = invoke(cmds[name])
        assert result.exit_code == code, name
        assert "Traceback" not in result.output, name


def test_every_reading_command_takes_all_damaged_records_at_once(mini_run: tuple[Path, Path], tmp_path: Path) -> None:
    config, pristine = mini_run
    run = copy_run(pristine, tmp_path / "run")
    good = lines_of(run)
    bad = [_dumps(change(json.loads(good[1]))) for _, change, _ in RECORD_CASES]
    (run / POINTS_FILE).write_text("\n".join([good[0], *bad, *good[2:]]) + "\n")
    before = quiet_load(run)
    assert len(before.warnings) == sum(not valid for *_, valid in RECORD_CASES)
    for name, args in commands(run, config, tmp_path).items():
        assert invoke(args).exit_code == 0, name
    after = quiet_load(run)
    assert lines_of(run)[: len(bad) + 4] == [good[0], *bad, *good[2:]]  # resume appended, changed nothing
    assert {p.key_id for p in before.points} <= {p.key_id for p in after.points}
    assert after.meta.status == "complete" and {p.status for p in after.points} == {"ok"}


@pytest.mark.parametrize(
    ("case", "change"),
    [
        ("key-lacks-a-field", RECORD_CASES[16][1]),
        ("key-has-an-extra-field", RECORD_CASES[17][1]),
        ("losses-are-words", RECORD_CASES[12][1]),
    ],
)
def test_resume_runs_again_a_point_whose_record_it_cannot_use(
    mini_run: tuple[Path, Path], tmp_path: Path, case: str, change: Callable[[Record], Any]
) -> None:
    config, pristine = mini_run
    run = copy_run(pristine, tmp_path / "run")
    damage(run, 2, change)
    result = invoke(commands(run, config, tmp_path)["resume"])
    assert result.exit_code == 0, result.stderr
    assert "1 ran now" in result.stderr  # the damaged record's point, and only it
    after = quiet_load(run)
    assert after.meta.status == "complete" and len(lines_of(run)) == 5
    assert sorted(p.key_id for p in after.points if "new_axis" not in p.key and p.key.get("seq_len")) == sorted(
        p.key_id for p in quiet_load(pristine).points
    )


# (id, run.json field, damaged value, exit code per command: compare, recommend, report, estimate, resume;
#  text of the resume/estimate refusal)
META_CASES = [
    ("config-null", "config", None, (0, 0, 0, 2, 2), "holds no config"),
    ("environment-a-list", "environment", [1], (0, 0, 0, 0, 2), "measured with device_type None"),
    ("searches-damaged", "searches", [{"kind": "batch_max", "answer": {"num_checkpointed": 3}}], (0, 0, 0, 0, 0), ""),
    ("options-nested-5000-deep", "options", DEEP, (0, 0, 0, 0, 0), ""),
    ("unknown-field-nested-5000-deep", "zz_new", DEEP, (0, 0, 0, 0, 0), ""),
]


@pytest.mark.parametrize(("case", "field", "value", "codes", "why"), META_CASES, ids=[c[0] for c in META_CASES])
def test_a_damaged_run_json_field_is_dropped_with_a_warning(
    mini_run: tuple[Path, Path], tmp_path: Path, case: str, field: str, value: Any, codes: tuple[int, ...], why: str
) -> None:
    config, pristine = mini_run
    run = copy_run(pristine, tmp_path / "run")
    meta = json.loads((run / RUN_FILE).read_text())
    (run / RUN_FILE).write_text(_dumps({**meta, field: value}))
    loaded = quiet_load(run)
    assert field not in loaded.meta.model_fields_set and any(f"ignored field {field!r}" in w for w in loaded.warnings)
    assert len(loaded.points) == 4
    for (name, args), code in zip(commands(run, config, tmp_path).items(), codes, strict=True):
        result = invoke(args)
        assert result.exit_code == code, (name, result.stderr)
        if code == 2:  # one error line, after the warning that names the dropped field
            lines = result.stderr.strip().splitlines()
            errors = [line for line in lines if not line.startswith("warning: ")]
            assert len(errors) == 1 and why in errors[0], result.stderr
    assert len(quiet_load(run).points) == 4  # still readable, every record still there


# ---------------------------------------------------------------- a half-written last record

REC = '{"key": {"layout": "all"}, "status": "ok"}'


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (f"{REC}\n", f"{REC}\n"),
        (f"{REC}\n{REC[:20]}", f"{REC}\n"),  # a crash mid-write
        (f"{REC}\n{REC[:20]}\n", f"{REC}\n"),  # ... followed by a newline
        (f"{REC}\n{REC[:20]}\n\n  \n", f"{REC}\n"),  # ... and blank lines
        (f"{REC}\n{REC}", f"{REC}\n{REC}\n"),  # complete, only its newline missing: kept
        (f"{REC}\n{REC}\n\n", f"{REC}\n{REC}\n\n"),
        (f"{REC[:20]}\n", ""),
        (f"{REC}\ngarbage\n{REC}\n", f"{REC}\ngarbage\n{REC}\n"),  # a bad middle line is skipped on load
        ("", ""),
    ],
)
def test_repair_cuts_a_half_written_last_record_whatever_follows(tmp_path: Path, before: str, after: str) -> None:
    path = tmp_path / POINTS_FILE
    path.write_text(before)
    assert repair_points_file(path) is (before != after)
    assert path.read_text() == after


@pytest.mark.parametrize("tail", ["\n", "\n\n"])
def test_a_truncated_line_that_ends_in_a_newline_no_longer_corrupts_the_run(
    mini_run: tuple[Path, Path], tmp_path: Path, tail: str
) -> None:
    """The issue's recipe: line 3 cut to 100 characters keeping its newline (or followed by a blank line)."""
    config, pristine = mini_run
    run = copy_run(pristine, tmp_path / "run")
    lines = lines_of(run)
    (run / POINTS_FILE).write_text("\n".join(lines[:2]) + "\n" + lines[2][:100] + tail)
    result = invoke(commands(run, config, tmp_path)["resume"])
    assert result.exit_code == 0, result.stderr
    after = quiet_load(run)
    assert after.warnings == [] and after.meta.status == "complete"  # the cut line is gone, not buried
    assert lines_of(run)[:2] == lines[:2] and len(lines_of(run)) == 4
    for name in ("resume", "compare", "recommend"):  # and the run stays whole for every later command
        assert invoke(commands(run, config, tmp_path)[name]).exit_code == 0


def test_records_reduced_to_key_and_status_are_reported_and_plotted(
    mini_run: tuple[Path, Path], tmp_path: Path
) -> None:
    config, pristine = mini_run
    run = copy_run(pristine, tmp_path / "run")
    bare = [{"key": r["key"], "status": r["status"]} for r in map(json.loads, lines_of(run))]
    (run / POINTS_FILE).write_text("".join(json.dumps(r) + "\n" for r in bare))
    assert len(quiet_load(run).points) == 4  # valid records: nothing is skipped ...
    for name, args in commands(run, config, tmp_path).items():
        if name != "resume":  # ... and every reader draws and prints them (resume would measure them again)
            assert invoke(args).exit_code == 0, name
    assert {p.name for p in (tmp_path / "report").glob("*.png")} >= {"peak_memory.png", "speed.png"}


@pytest.mark.parametrize("name", ["recommend", "report", "estimate", "compare"])
def test_a_skipped_record_is_one_clean_warning_line(mini_run: tuple[Path, Path], tmp_path: Path, name: str) -> None:
    config, pristine = mini_run
    run = copy_run(pristine, tmp_path / "run")
    damage(run, 2, _key(lambda k: {**k, "batch_size": "two"}))
    args = ["compare", str(run), str(pristine)] if name == "compare" else commands(run, config, tmp_path)[name]
    result = invoke(args)
    assert result.exit_code == 0, result.stderr
    named = [line for line in result.stderr.splitlines() if "line 2" in line]
    assert len(named) == 1 and named[0].startswith("warning: ") and "batch_size must be int" in named[0], named
    assert "UserWarning" not in result.stderr and "store.py" not in result.stderr
