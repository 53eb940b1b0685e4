"""The ``ckptbench`` process ends as soon as its command has (cli/process_end.py): the status Python would exit with,
its threads, atexit handlers and streams done first, the interpreter's teardown skipped."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ckptbench.cli.process_end import exit_status

# A process that holds an object only the teardown frees, an atexit handler and a thread still running when the
# command returns: each says so on standard error.
_SPY = """
import atexit, os, sys, threading, time

class FreedByTheTeardown:
    def __del__(self):
        os.write(2, b"teardown;")

held = FreedByTheTeardown()
atexit.register(lambda: os.write(2, b"atexit;"))
threading.Thread(target=lambda: (time.sleep(0.3), os.write(2, b"thread;"))).start()
from ckptbench.cli.main import run
sys.argv = ["ckptbench", *sys.argv[1:]]
run()
"""


@pytest.mark.parametrize(("args", "code"), [(["gpus", "--format", "json"], 0), (["advise", "--gpu", "nope"], 2)])
def test_the_command_line_ends_after_its_threads_and_atexit_handlers_without_the_teardown(
    args: list[str], code: int
) -> None:
    done = subprocess.run([sys.executable, "-c", _SPY, *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == code, done.stderr[-500:]
    assert done.stderr.endswith("thread;atexit;"), done.stderr[-500:]  # in the interpreter's order; no teardown
    if code == 0:
        assert json.loads(done.stdout)  # the whole output, flushed
    else:
        assert "error:" in done.stderr and "nope" in done.stderr


def test_python_m_ckptbench_keeps_its_exit_codes() -> None:
    ok = subprocess.run([sys.executable, "-m", "ckptbench", "gpus", "--format", "csv"], capture_output=True,
                        text=True, timeout=120)
    assert ok.returncode == 0 and ok.stdout.count("\n") > 5, ok.stderr[-500:]
    bad = subprocess.run([sys.executable, "-m", "ckptbench", "estimate", "--no-such-option"], capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and "--no-such-option" in bad.stderr


def test_exit_status_is_python_s(capsys: pytest.CaptureFixture[str]) -> None:
    assert (exit_status(None), exit_status(0), exit_status(3), exit_status(True)) == (0, 0, 3, 1)
    assert exit_status("stopped") == 1 and capsys.readouterr().err == "stopped\n"
