"""issue 22, robustness: what a user types, a damaged file or a full disk gives one clear line and a non-zero
exit, loses nothing and never runs unbounded."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ckptbench.cli.main import app
from ckptbench.results.store import POINTS_FILE, RUN_FILE

FIXTURES = Path(__file__).parent / "fixtures"


def invoke(args: list[str]) -> Any:
    """The command through typer's runner; a traceback is a failure of the test, not a result."""
    result = CliRunner().invoke(app, args)
    crashed = result.exception is not None and not isinstance(result.exception, SystemExit)
    assert not crashed, (args, repr(result.exception))
    assert "Traceback" not in result.output, result.output
    return result


def bounded_cli(args: list[str], *, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    """``python -m ckptbench ARGS`` in a process of at most 2 GiB of address space and ``timeout_s``: an
    unbounded read fails the test (MemoryError or the timeout) instead of taking the machine with it."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 * 2**30, 2 * 2**30))

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1]), "COLUMNS": "200"}
    try:
        return subprocess.run([sys.executable, "-m", "ckptbench", *args], capture_output=True, text=True,
                              timeout=timeout_s, preexec_fn=limit, env=env, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail(f"ckptbench {' '.join(args)} ran past {timeout_s:g} s (an unbounded read or a blocked one)")


def error_line(result: Any) -> str:
    """The one line a refused command prints."""
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


@pytest.fixture
def few_run(tmp_path: Path) -> Path:
    """A copy of a small committed run (two layouts, a few points) to write around."""
    return Path(shutil.copytree(FIXTURES / "runs" / "few", tmp_path / "run"))


# --- 1. no command writes over a run's own files -------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["answers", "{run}", "--out", "{run}/run.json"],
        ["answers", "{run}", "--out", "{run}/points.jsonl"],
        ["answers", "{run}", "--out", "{link}"],  # a link to points.jsonl
        ["answers", "{run}", "--readme", "{run}/run.json"],
        ["report", "{run}", "--out", "{run}/summary.md", "--no-estimate"],  # a folder would be made there
    ],
    ids=["answers-run.json", "answers-points", "answers-link", "answers-readme", "report-summary"],
)
def test_no_command_writes_over_a_run_s_own_files(few_run: Path, tmp_path: Path, args: list[str]) -> None:
    (tmp_path / "link.md").symlink_to(few_run / POINTS_FILE)
    before = {name: (few_run / name).read_bytes() for name in (RUN_FILE, POINTS_FILE)}
    result = invoke([a.format(run=few_run, link=tmp_path / "link.md") for a in args])
    assert result.exit_code == 2
    assert "never writes over a run's own files" in error_line(result)
    assert {name: (few_run / name).read_bytes() for name in before} == before
    assert sorted(p.name for p in few_run.iterdir()) == sorted(before)


# --- 2. bounded reads: never a FIFO, a device or a huge file ------------------------------------------------


@pytest.fixture
def odd_files(tmp_path: Path) -> dict[str, Path]:
    """A FIFO, a link to /dev/zero and a sparse file of 2 GiB (no disk used)."""
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    zero = tmp_path / "zero.yaml"
    zero.symlink_to("/dev/zero")
    huge = tmp_path / "huge.yaml"
    with open(huge, "wb") as fh:
        fh.truncate(2 * 2**30)
    return {"fifo": fifo, "zero": zero, "huge": huge, "dev-zero": Path("/dev/zero")}


# Each case is a process of its own (a failure must not take the machine with it): a few, not every pair.
@pytest.mark.parametrize(
    ("command", "kind"),
    [("sweep", "fifo"), ("sweep", "zero"), ("sweep", "huge"), ("sweep", "dev-zero"), ("layouts", "fifo"),
     ("layouts", "zero"), ("answers-readme", "fifo"), ("answers-readme", "dev-zero")],
)
def test_a_config_or_readme_that_is_no_regular_file_or_huge_is_refused_at_once(
    few_run: Path, odd_files: dict[str, Path], command: str, kind: str
) -> None:
    path = str(odd_files[kind])
    args = ["answers", str(few_run), "--readme", path] if command == "answers-readme" else [command, path]
    result = bounded_cli(args, timeout_s=30)
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}: "), result.stderr[-2000:]
    why = "larger than 16 MiB" if kind == "huge" else ("a FIFO" if kind == "fifo" else "a character device")
    assert why in lines[0]


@pytest.mark.parametrize(
    ("command", "kind"), [("compare", "fifo"), ("recommend", "zero"), ("report", "huge")]
)
def test_points_jsonl_that_is_no_regular_file_or_huge_is_refused_at_once(
    few_run: Path, odd_files: dict[str, Path], tmp_path: Path, command: str, kind: str
) -> None:
    points = few_run / POINTS_FILE
    points.unlink()
    if kind == "fifo":
        os.mkfifo(points)
    elif kind == "zero":
        points.symlink_to("/dev/zero")
    else:
        with open(points, "wb") as fh:
            fh.truncate(2 * 2**30 + 1)
    args = {
        "compare": ["compare", str(few_run), str(few_run)],
        "recommend": ["recommend", str(few_run), "--budget", "80"],
        "report": ["report", str(few_run), "--out", str(tmp_path / "report"), "--no-estimate"],
    }[command]
    result = bounded_cli(args, timeout_s=30)
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {points}: "), result.stderr[-2000:]


# --- 3. damaged values that reach a formatter anyway --------------------------------------------------------


def test_sizes_beyond_a_float_are_formatted_not_raised() -> None:
    from ckptbench.units import GIB_UNIT, MIB_UNIT, fmt_bytes

    assert (fmt_bytes(10**4000), GIB_UNIT(10**4000), MIB_UNIT(-(10**4000), signed=True)) == (
        "inf GiB", "inf GiB", "-inf MiB")
    assert GIB_UNIT.value(10**4000) == float("inf")


def test_json_nested_thousands_deep_costs_only_its_field() -> None:
    from ckptbench.results.json_text import TooDeep, loads_bounded, loads_object_fields

    deep = "[" * 5000 + "]" * 5000
    text = '{"a": 1, "deep": ' + deep + ', "s": "}],\\"", "n": null, "o": {"x": [1, {"y": 2}]}}'
    assert loads_object_fields(text) == ({"a": 1, "s": '}],"', "n": None, "o": {"x": [1, {"y": 2}]}}, ["deep"])
    assert loads_object_fields('{"a": ' + "[" * 70 + "]" * 70 + "}") == ({}, ["a"])  # deep, not recursing
    with pytest.raises(TooDeep):
        loads_bounded(deep)
