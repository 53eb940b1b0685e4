"""The command's tracer (estimator/tracer.py): a process forked as the command starts, which imports torch and
transformers beside the command line's own start and runs the command's traces. It only moves work: the estimates it
helps make equal those made without it, and the command's process then imports neither torch nor transformers."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from multiprocessing.connection import Client
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ckptbench.cli.main import app
from ckptbench.config.grid import Point
from ckptbench.estimator import trace_cache, tracer
from ckptbench.estimator.estimator import Estimator
from ckptbench.estimator.tracer import Tracer, TracerGone, wanted
from ckptbench.estimator.workers import WORKERS_ENV, Background
from tests.conftest import tiny_config


def _pid(*, progress: Callable[[Any], None] | None = None) -> int:
    if progress is not None:
        progress("one")
        progress("two")
    return os.getpid()


def _warns() -> int:
    warnings.warn("said in the tracer", UserWarning, stacklevel=1)
    return 1


def _fails() -> int:
    raise ValueError("refused")


def _session_pid(t: Tracer) -> int:
    return int(t.call(_pid))


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> Iterator[Tracer]:
    """A tracer forked from this process, serving it as the command line's would (this process has torch: it is told
    it has not, as the command line's has not)."""
    found = Tracer.fork()
    assert found is not None
    monkeypatch.setattr(tracer, "_tracer", found)
    monkeypatch.setattr(tracer, "_first_asked", False)
    monkeypatch.setattr(tracer, "torch_here", lambda: False)
    try:
        yield found
    finally:
        found.stop()


def test_a_call_runs_in_the_tracer_or_in_one_process_forked_for_this_process_calls(served: Tracer) -> None:
    heard: list[str] = []
    assert served.call(_pid, here=True, on_progress=heard.append) == served.pid
    assert heard == ["one", "two"]
    first = served.call(_pid)
    assert first not in (served.pid, os.getpid())
    assert served.call(_pid) == first  # the same session: the process keeps what each call made
    with Background(lambda: _session_pid(served), workers=2) as other:  # a forked process: a session of its own
        assert other.result() not in (first, served.pid)
    assert served.submit(_pid).result() not in (first, served.pid)  # a call beside: a process of its own
    assert served.used and not served.gone


def test_warnings_come_back_and_a_failure_leaves_the_call_here(served: Tracer) -> None:
    with pytest.warns(UserWarning, match="said in the tracer"):
        assert served.call(_warns) == 1
    with pytest.raises(TracerGone, match="ValueError: refused"):
        served.call(_fails, here=True)
    assert served.gone and tracer.serving() is None
    assert tracer.where_imported(_pid) == os.getpid()  # run here, as without a tracer


def test_only_a_process_with_the_key_can_call_it(served: Tracer) -> None:
    with pytest.raises(multiprocessing.AuthenticationError):
        Client(served.address, family="AF_UNIX", authkey=os.urandom(32))
    assert served.call(_pid, here=True) == served.pid  # it goes on serving


def test_an_unused_tracer_is_released_and_a_used_one_kept(served: Tracer) -> None:
    tracer.release_unused()
    assert served.gone and tracer.serving() is None
    with pytest.raises(ProcessLookupError):  # ended and reaped
        os.kill(served.pid, 0)
    again = Tracer.fork()
    assert again is not None
    try:
        tracer._tracer = again
        again.call(_pid, here=True)
        tracer.release_unused()
        assert not again.gone
        os.kill(again.pid, 0)
    finally:
        again.stop()


@pytest.mark.parametrize(("argv", "env", "expected"), [
    (["advise", "--model", "llama-7b"], {}, True),
    (["estimate", "configs/tiny.yaml", "--workers", "2"], {}, True),
    (["advise", "--help"], {}, False),
    (["gpus"], {}, False),
    (["sweep", "configs/tiny.yaml"], {}, False),
    (["estimate", "configs/tiny.yaml", "--workers", "1"], {}, False),
    (["estimate", "configs/tiny.yaml", "--workers=1"], {}, False),
    (["advise", "--model", "llama-7b"], {tracer.TRACER_ENV: "0"}, False),
    (["advise", "--model", "llama-7b"], {WORKERS_ENV: "1"}, False),
])
def test_which_command_lines_start_a_tracer(monkeypatch: pytest.MonkeyPatch, argv: list[str], env: dict[str, str],
                                            expected: bool) -> None:
    monkeypatch.setenv(WORKERS_ENV, "2")
    monkeypatch.delenv(tracer.TRACER_ENV, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert wanted(argv) is expected


def _points() -> tuple[Any, list[Point]]:
    cfg = tiny_config(sweep={"layout": ["none", "all"], "batch_size": [2], "seq_len": [64], "precision": ["fp32"]})
    return cfg, cfg.points_list()


def test_estimates_with_the_tracer_equal_those_without(served: Tracer) -> None:
    """Traces run by the tracer (the first in it, the next in a session, one beside) make the estimates traced here
    make, and the estimator that asked has every trace (nothing left to run)."""
    cfg, points = _points()
    accumulated = [dataclasses.replace(p, micro_batches=2) for p in points]
    other_batch = [dataclasses.replace(p, batch_size=3) for p in points]
    there = Estimator(cfg, target="cuda", cache=None)
    heard_there: list[Any] = []
    assert there.run_traces(points, on_progress=heard_there.append) > 0
    with there.traced_beside(accumulated) as take:
        there.predict(other_batch[0])  # (a call of its own while the traces beside run)
        take()
    for asked in (points, accumulated, other_batch[:1]):
        assert not there.jobs(asked)
    tracer._tracer = None  # the same estimates made here
    here = Estimator(cfg, target="cuda", cache=None)
    heard_here: list[Any] = []
    here.run_traces(points, workers=1, on_progress=heard_here.append)
    assert heard_there == heard_here  # each trace heard of once, the first before the tracer has it
    here.run_traces([*accumulated, *other_batch[:1]], workers=1)
    for p in (*points, *accumulated, other_batch[0]):
        assert there.estimate(p) == here.estimate(p), p


def test_the_command_process_imports_no_torch_and_answers_as_without_it(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A cold question with its tracer: the command's process imports neither torch nor transformers, and its answer
    is the one a command without a tracer gives."""
    code = (
        "import json, sys\n"
        "sys.argv[0] = 'ckptbench'  # the command line's own process (cli/__init__.py starts the tracer there)\n"
        "from ckptbench.cli.main import app\n"
        "try:\n"
        "    app(sys.argv[1:], standalone_mode=False)\n"
        "finally:\n"
        "    print(json.dumps(sorted(m for m in ('torch', 'transformers') if m in sys.modules)), file=sys.stderr)\n"
    )
    ask = ["advise", "--model", "tiny", "--batch", "2", "--seq", "256", "--gpu", "a100-40gb"]
    env = {**os.environ, trace_cache.ENV_DIR: str(tmp_path / "cache"), WORKERS_ENV: "2", "COLUMNS": "120"}
    env.pop(tracer.TRACER_ENV, None)
    done = subprocess.run([sys.executable, "-c", code, *ask], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stderr.strip().splitlines()[-1]) == []
    assert (tmp_path / "cache" / "traces").is_dir()  # the traces kept on disk (by the tracer)
    assert len(list((tmp_path / "cache").rglob("*.asked"))) == 1  # the model answered: asked again, no tracer
    monkeypatch.setenv(trace_cache.ENV_DIR, str(tmp_path / "alone"))
    alone = CliRunner(env={"COLUMNS": "120"}).invoke(app, ask)
    assert alone.exit_code == 0, alone.output
    assert done.stdout == alone.stdout


def test_a_subject_answered_before_starts_no_tracer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A command on a subject answered with this cache (advise's model, estimate's config) starts no tracer: its traces
    are likely on disk. Another model does; ``cache clear`` forgets what was answered."""
    monkeypatch.setenv(trace_cache.ENV_DIR, str(tmp_path))
    monkeypatch.setenv(WORKERS_ENV, "2")
    monkeypatch.delenv(tracer.TRACER_ENV, raising=False)
    monkeypatch.setattr(tracer, "torch_here", lambda: False)
    forked: list[str] = []
    monkeypatch.setattr(Tracer, "fork", classmethod(lambda cls: forked.append("forked")))

    def started(*argv: str) -> bool:
        monkeypatch.setattr(tracer, "_tracer", None)
        forked.clear()
        tracer.start(list(argv))
        return bool(forked)

    ask = ("advise", "--model", "llama-7b", "--gpu", "a100-80gb")
    assert started(*ask)
    tracer.answered()
    assert not started(*ask) and not started("advise", "--gpu", "h100-80gb", "--model=llama-7b", "--batch", "4")
    assert started("advise", "--model", "mistral-7b")
    config = tmp_path / "c.yaml"
    config.write_text("name: c\n")
    assert started("estimate", str(config))
    tracer.answered()
    monkeypatch.chdir(tmp_path)
    assert not started("estimate", "c.yaml")  # the same file
    trace_cache.TraceCache(tmp_path).clear()
    assert started(*ask) and not list(tmp_path.rglob("*.asked"))


def test_a_tracer_that_ended_leaves_the_traces_here(served: Tracer) -> None:
    """The tracer killed (out of memory, a signal): the next call finds it gone and the traces run here, the same."""
    os.kill(served.pid, signal.SIGKILL)
    os.waitpid(served.pid, 0)
    cfg, points = _points()
    there = Estimator(cfg, target="cuda", cache=None)
    assert there.run_traces(points) > 0 and served.gone
    tracer._tracer = None
    here = Estimator(cfg, target="cuda", cache=None)
    here.run_traces(points, workers=1)
    assert [there.estimate(p) for p in points] == [here.estimate(p) for p in points]
