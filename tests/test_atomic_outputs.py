"""issue 35: what report, answers and estimate --snapshot write is whole or not there, after a full disk or a signal
half-way through a file; an earlier good file is never replaced by a cut one; a full disk is exit 1 (a failure of
the disk), not 2 (bad input); --snapshot's destination is checked before the estimate."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from matplotlib.figure import Figure

from ckptbench.results.store import RUN_FILE
from tests._cli import invoke

FIXTURES = Path(__file__).parent / "fixtures"
REPO = Path(__file__).resolve().parents[1]
PNG_START, PNG_END = b"\x89PNG\r\n\x1a\n", b"IEND\xaeB`\x82"


def only_line(result: Any) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]


def whole_png(path: Path) -> bool:
    data = path.read_bytes()
    return data.startswith(PNG_START) and data.endswith(PNG_END)


def files_of(folder: Path) -> dict[str, bytes]:
    """Every file in ``folder`` (temporary ones included: none may be left)."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.fixture
def run(tmp_path: Path) -> Path:
    return Path(shutil.copytree(FIXTURES / "runs" / "few", tmp_path / "run"))


def failing_on_call(n: int, real: Callable[..., Any], fail: Callable[[], None]) -> Callable[..., Any]:
    """``real`` for the first n - 1 calls; the n-th writes half of what it would have written, then ``fail``s."""
    calls = [0]

    def wrapped(self: Figure, fname: Any, *args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] < n:
            return real(self, fname, *args, **kwargs)
        real(self, fname, *args, **kwargs)
        Path(fname).write_bytes(Path(fname).read_bytes()[:500])  # cut, as a full disk leaves it
        fail()
        return None

    return wrapped


def disk_full() -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


def ctrl_c() -> None:
    os.kill(os.getpid(), signal.SIGINT)


@pytest.mark.parametrize(("fail", "code", "says"), [
    (disk_full, 1, "cannot write the report (No space left on device); the files written are whole, none is cut"),
    (ctrl_c, 130, "interrupted: ckptbench report stopped by Ctrl-C (SIGINT); no file was left half-written"),
], ids=["full-disk", "ctrl-c"])
def test_report_leaves_no_cut_png_and_keeps_the_earlier_one(
    run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail: Callable[[], None], code: int, says: str
) -> None:
    out = tmp_path / "report"
    assert invoke(["report", str(run), "--out", str(out), "--no-estimate"]).exit_code == 0
    before = files_of(out)
    assert all(whole_png(out / name) for name in before if name.endswith(".png"))
    monkeypatch.setattr(Figure, "savefig", failing_on_call(2, Figure.savefig, fail))  # speed.png, the second
    result = invoke(["report", str(run), "--out", str(out), "--no-estimate"])
    assert result.exit_code == code
    assert says in only_line(result)
    after = files_of(out)
    assert after.keys() == before.keys()  # no temporary file left beside them
    assert after["speed.png"] == before["speed.png"] and whole_png(out / "speed.png")


def test_a_report_on_a_full_disk_is_exit_1_and_writes_no_cut_file(
    run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "fresh"
    monkeypatch.setattr(Figure, "savefig", failing_on_call(3, Figure.savefig, disk_full))  # tradeoff.png
    result = invoke(["report", str(run), "--out", str(out), "--no-estimate"])
    assert result.exit_code == 1
    assert only_line(result) == (f"error: {out}: cannot write the report (No space left on device); the files "
                                 "written are whole, none is cut")
    assert sorted(files_of(out)) == ["peak_memory.png", "speed.png"] and whole_png(out / "speed.png")


def test_answers_on_a_full_disk_is_exit_1_and_keeps_the_earlier_plot(
    run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "answers" / "answers.md"
    args = ["answers", str(run), "--out", str(out), "--measured-only"]
    assert invoke(args).exit_code == 0
    before = files_of(out.parent)
    monkeypatch.setattr(Figure, "savefig", failing_on_call(1, Figure.savefig, disk_full))
    result = invoke(args)
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: answers: cannot write {out} (No space left on device); the files written are whole, none is cut")
    assert files_of(out.parent) == before


# --- estimate --snapshot --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def one_point(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny config of one point (its snapshot is written to the file named, not to one per point)."""
    from tests.conftest import MINI

    data = json.loads(json.dumps(MINI))
    data["sweep"] = {**data["sweep"], "layout": ["all"], "batch_size": [1]}
    path = tmp_path_factory.mktemp("cfg") / "one.yaml"
    path.write_text(json.dumps(data))
    return path


def snapshot_args(config: Path, where: Path) -> list[str]:
    return ["estimate", str(config), "--gpu", "h100-80gb", "--workers", "1", "--snapshot", str(where)]


def test_a_snapshot_on_a_full_disk_is_exit_1_and_keeps_the_earlier_one(
    one_point: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pickle

    where = tmp_path / "snaps" / "snap.pickle"
    assert invoke(snapshot_args(one_point, where)).exit_code == 0
    before = files_of(where.parent)
    assert pickle.loads(before["snap.pickle"])["segments"] is not None

    def cut(obj: Any, fh: Any, *args: Any, **kwargs: Any) -> None:
        fh.write(pickle.dumps(obj)[:100])
        disk_full()

    monkeypatch.setattr(pickle, "dump", cut)
    result = invoke(snapshot_args(one_point, where))
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: --snapshot: cannot write {where} (No space left on device); no snapshot file is left cut")
    assert files_of(where.parent) == before


def test_a_snapshot_through_a_link_to_a_run_s_run_json_never_touches_it(
    one_point: Path, run: Path, tmp_path: Path
) -> None:
    before = (run / RUN_FILE).read_bytes()
    soft = tmp_path / "soft.pickle"
    soft.symlink_to(run / RUN_FILE)
    result = invoke(snapshot_args(one_point, soft))
    assert result.exit_code == 2
    assert "a command never writes over a run's own files" in only_line(result)
    hard = tmp_path / "hard.pickle"
    os.link(run / RUN_FILE, hard)
    assert invoke(snapshot_args(one_point, hard)).exit_code == 0  # the name now holds the snapshot ...
    assert (run / RUN_FILE).read_bytes() == before  # ... and the run's file is as it was
    assert hard.read_bytes() != before


@pytest.mark.parametrize("kind", ["fifo", "dir", "device", "no-cuda"])
def test_a_snapshot_destination_that_cannot_be_written_is_refused_before_the_estimate(
    one_point: Path, kind: str
) -> None:
    """A FIFO blocked the write forever, after the whole estimate: that one runs in a process of its own, bounded in
    time (the others in this one)."""
    short = Path(tempfile.mkdtemp(prefix="ckpt-"))  # the line shortens a path over 80 characters
    where = {"fifo": short / "fifo.pickle", "dir": short, "device": Path("/dev/null"),
             "no-cuda": short / "x.pickle"}[kind]
    args = snapshot_args(one_point, where)
    if kind == "no-cuda":
        args = ["estimate", str(one_point), "--target", "cpu", "--snapshot", str(where)]
    if kind == "fifo":
        os.mkfifo(where)
        env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
        done = subprocess.run([sys.executable, "-m", "ckptbench", *args], capture_output=True, text=True,
                              timeout=60, env=env, check=False)
        code, stderr = done.returncode, done.stderr
    else:
        result = invoke(args)
        code, stderr = result.exit_code, result.stderr
    says = {"fifo": f"error: --snapshot {where}: is a FIFO (named pipe), not a file to write; give a file name",
            "dir": f"error: --snapshot {where}: is a directory, not a file to write; give a file name",
            "device": "error: --snapshot /dev/null: is a character device, not a file to write; give a file name",
            "no-cuda": "error: --snapshot: a CUDA allocator timeline needs a CUDA target (--gpu CARD or --target "
                       "cuda)"}[kind]
    assert (code, stderr.strip()) == (2, says)  # one line, and no estimate ran (no progress before it)
    shutil.rmtree(short)


def test_an_output_folder_on_a_full_disk_is_exit_1_before_any_work(run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where not even the folder check can make its empty folder (ext4 full to the last block), the disk failed:
    exit 1, not 2 (bad input)."""
    def full(*_: Any, **__: Any) -> str:
        raise OSError(errno.ENOSPC, "No space left on device")

    short = Path(tempfile.mkdtemp(prefix="ckpt-"))  # the line shortens a path over 80 characters
    monkeypatch.setattr(tempfile, "mkdtemp", full)
    out = short / "report"
    result = invoke(["report", str(run), "--out", str(out), "--no-estimate"])
    assert result.exit_code == 1
    assert only_line(result) == (f"error: --out {out}: cannot create a folder in {short} (No space left on "
                                 "device); nothing was written")
    assert not out.exists()
    shutil.rmtree(short)
