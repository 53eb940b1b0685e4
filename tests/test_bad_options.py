"""Bad options and output paths: one line, exit 2, nothing started (no model built, no run directory)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ckptbench.cli.main import app
from ckptbench.sweep import sweep as bench_sweep
from tests.conftest import MINI

# (id, arguments after the command name; the text the one line must hold)
OPTION_CASES: list[tuple[str, list[str], str]] = [
    ("compare-format-xml", ["compare", "a", "b", "--format", "xml"],
     "error: compare: Invalid value for '--format': 'xml' is not one of 'table', 'markdown', 'csv', 'json'"),
    ("compare-fail-memory-negative", ["compare", "a", "b", "--fail-memory", "-1"],
     "error: compare: Invalid value for '--fail-memory'"),
    ("compare-time-noise-nan", ["compare", "a", "b", "--time-noise", "nan"],
     "error: compare: Invalid value for '--time-noise'"),
    ("compare-fail-time-inf", ["compare", "a", "b", "--fail-time", "inf"],
     "Invalid value for '--fail-time': must be a finite number, got inf"),
    ("compare-memory-tolerance-word", ["compare", "a", "b", "--memory-tolerance", "lots"],
     "Invalid value for '--memory-tolerance'"),
    ("sweep-point-timeout-abc", ["sweep", "c.yaml", "--point-timeout", "abc"],
     "error: sweep: Invalid value for '--point-timeout'"),
    ("sweep-point-timeout-inf", ["sweep", "c.yaml", "--isolate", "--point-timeout", "inf"],
     "'--point-timeout': must be a finite number"),
    ("sweep-without-config", ["sweep"], "error: sweep: Missing argument"),
    ("unknown-option", ["compare", "a", "b", "--colour"], "error: compare: No such option: --colour"),
    ("unknown-command", ["sweeep"], "error: No such command 'sweeep'"),
    ("recommend-format-xml", ["recommend", "a", "--format", "xml"], "error: --format: 'xml' is not one of"),
    ("estimate-format-xml", ["estimate", "c.yaml", "--format", "xml"], "error: estimate: Invalid value for '--format'"),
]


@pytest.mark.parametrize(("case", "args", "expected"), OPTION_CASES, ids=[c[0] for c in OPTION_CASES])
def test_a_bad_option_is_one_line_and_exit_2(tmp_path: Path, case: str, args: list[str], expected: str) -> None:
    result = CliRunner().invoke(app, args)
    lines = result.stderr.splitlines()
    assert result.exit_code == 2, (result.exit_code, result.stderr, result.exception)
    assert len(lines) == 1 and expected in lines[0], lines  # no 'Usage:' box
    assert lines[0].endswith("--help)") or case == "recommend-format-xml", lines[0]
    assert result.stdout == ""


@pytest.fixture
def nothing_starts(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A config, from a folder with a plain file in it; building the runner fails the test: path problems
    must be found before anything runs."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile.txt").write_text("x")
    (tmp_path / "c.yaml").write_text(json.dumps(MINI))

    def started(*_: Any, **__: Any) -> Any:
        raise AssertionError("the sweep started (the runner was built) before its output path was checked")

    monkeypatch.setattr(bench_sweep, "make_runner", started)
    return tmp_path


LONG_NAME = "n" * 300
LONG_PATH = "/".join(["d" * 200] * 22)  # 4,421 characters

# (id, options of `ckptbench sweep c.yaml`, the text the one line must hold)
PATH_CASES: list[tuple[str, list[str], str]] = [
    ("out-empty", ["--out", ""], "error: --out: an empty path"),
    ("out-under-a-file", ["--out", "afile.txt/sub"], "--out afile.txt/sub: "),
    ("out-is-a-file", ["--out", "afile.txt"], "--out afile.txt: it exists and is not a directory"),
    ("out-300-character-name", ["--out", LONG_NAME], "is 300 bytes long, more than the file system allows (255)"),
    ("out-path-over-4096", ["--out", LONG_PATH], "the path is longer than the file system allows (4096 bytes)"),
    ("out-in-proc", ["--out", "/proc/x"], "--out /proc/x: cannot create a folder in /proc"),
    ("results-is-a-file", ["--results", "afile.txt"], "--results afile.txt: it exists and is not a directory"),
    ("results-empty", ["--results", ""], "error: --results: an empty path"),
    ("resume-empty", ["--resume", ""], "error: --resume: an empty path"),
]


@pytest.mark.parametrize(("case", "args", "expected"), PATH_CASES, ids=[c[0] for c in PATH_CASES])
def test_a_bad_output_path_is_one_line_before_anything_runs(
    nothing_starts: Path, case: str, args: list[str], expected: str
) -> None:
    result = CliRunner().invoke(app, ["sweep", "c.yaml", *args])
    lines = result.stderr.splitlines()
    assert result.exit_code == 2, (result.stderr, result.exception)
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], lines
    assert sorted(p.name for p in nothing_starts.iterdir()) == ["afile.txt", "c.yaml"]  # nothing created


@contextlib.contextmanager
def unwritable(folder: Path) -> Iterator[None]:
    """A folder this process cannot write into: chmod for a user, the immutable flag for root."""
    folder.mkdir()
    if os.geteuid() != 0:
        folder.chmod(0o555)
        yield
        folder.chmod(0o755)
        return
    if subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode != 0:
        pytest.skip("running as root without chattr: no folder root cannot write into")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True)


@pytest.mark.parametrize("option", ["--out", "--results"])
def test_an_unwritable_folder_is_one_line_before_anything_runs(nothing_starts: Path, option: str) -> None:
    with unwritable(nothing_starts / "locked"):
        result = CliRunner().invoke(app, ["sweep", "c.yaml", option, "locked/run"])
        assert result.exit_code == 2, (result.stderr, result.exception)
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {option} locked/run: cannot create a folder in "), lines
        assert str(nothing_starts / "locked") in lines[0]
        assert list((nothing_starts / "locked").iterdir()) == []


@pytest.mark.parametrize(("out", "expected"), [("", "--out: an empty path"), ("afile.txt/sub", "is not a directory")])
def test_report_checks_its_out_folder_first(
    mini_run: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, out: str, expected: str
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile.txt").write_text("x")
    result = CliRunner().invoke(app, ["report", str(mini_run[1]), "--out", out])
    assert result.exit_code == 2 and len(result.stderr.splitlines()) == 1 and expected in result.stderr


OUT_CASES = [c for c in PATH_CASES if c[1][0] == "--out"]


@pytest.mark.parametrize(("case", "args", "expected"), OUT_CASES, ids=[c[0] for c in OUT_CASES])
def test_trace_allocator_checks_its_out_folder_first(
    nothing_starts: Path, case: str, args: list[str], expected: str
) -> None:
    # Checked before the config and the GPU: on a GPU machine no point is traced into a folder that cannot hold it.
    result = CliRunner().invoke(app, ["trace-allocator", "c.yaml", *args])
    lines = result.stderr.splitlines()
    assert result.exit_code == 2, (result.stderr, result.exception)
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], lines
    assert sorted(p.name for p in nothing_starts.iterdir()) == ["afile.txt", "c.yaml"]
