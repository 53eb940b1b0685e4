"""Shared fixtures: tiny configs built through the same code path as LLaMA-7B."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from ckptbench.config.load import parse_config
from ckptbench.config.schema import SweepConfig
from ckptbench.estimator.trace_cache import ENV_DIR as TRACE_CACHE_ENV
from ckptbench.estimator.workers import WORKERS_ENV

# The estimator's traces are kept on disk (estimator/trace_cache.py). The tests never read or write the user's cache:
# they have a folder of their own, made once by the pytest process that starts (pytest-xdist's workers inherit it),
# used by the tests marked ``trace_cache`` (``disk_trace_cache`` below); the others trace afresh, as many of them count
# traces or patch what a trace runs, which the cache's version (the code's hash) does not see.
if "PYTEST_XDIST_WORKER" not in os.environ:
    _OWN_CACHE = not os.environ.get("CKPTBENCH_TEST_CACHE_DIR")
    os.environ[TRACE_CACHE_ENV] = os.environ.get("CKPTBENCH_TEST_CACHE_DIR") or tempfile.mkdtemp(prefix="ckptbench-t-")

if "PYTEST_XDIST_WORKER" in os.environ:
    # pytest-xdist already runs one worker per core: estimates (and the commands tests start) stay in their process,
    # instead of forking more workers onto busy cores. tests/test_speed.py asks for workers explicitly.
    os.environ.setdefault(WORKERS_ENV, "1")


def tiny_data(**overrides: Any) -> dict[str, Any]:
    """Config data for a CPU sweep of the tiny preset; keyword arguments replace top-level fields."""
    data: dict[str, Any] = {
        "name": "t",
        "device": "cpu",
        "model": {"preset": "tiny"},
        "warmup_steps": 1,
        "measured_steps": 2,
        "sweep": {"layout": ["none"], "batch_size": [2], "seq_len": [128], "precision": ["fp32"]},
    }
    data.update(overrides)
    return data


def tiny_config(**overrides: Any) -> SweepConfig:
    """The validated config of tiny_data(**overrides)."""
    return parse_config(tiny_data(**overrides))


@pytest.fixture(autouse=True)
def disk_trace_cache(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The trace cache off (``CKPTBENCH_CACHE_DIR=off``), but for tests marked ``trace_cache``: the tests' own
    folder, shared by the run's workers."""
    if "trace_cache" not in request.keywords:
        monkeypatch.setenv(TRACE_CACHE_ENV, "off")


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """One intra-op thread: tiny models run faster on a busy 2-core machine, and losses are deterministic."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# The smallest sweep that still has every part of a run: 4 points (2 layouts x 2 batch sizes) of a
# one-layer model, in about a second. Damaged copies of it feed the robustness tests.
MINI: dict[str, Any] = tiny_data(
    name="mini",
    model={"preset": "tiny", "overrides": {"num_hidden_layers": 1, "hidden_size": 32, "intermediate_size": 64,
                                           "vocab_size": 64}},
    measured_steps=2,
    optimizer="sgd",
    sweep={"layout": ["none", "all"], "batch_size": [1, 2], "seq_len": [8], "precision": ["fp32"]},
)


@pytest.fixture(scope="session")
def mini_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(config file, pristine run directory) of MINI, measured once per session; copy it before changing it."""
    from ckptbench.sweep.sweep import run_sweep

    root = tmp_path_factory.mktemp("mini")
    config = root / "mini.yaml"
    config.write_text(json.dumps(MINI))  # JSON is YAML
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run_sweep(parse_config(MINI), out=root / "run", predict=False)
    finally:
        torch.set_num_threads(before)
    return config, root / "run"


def copy_run(run: Path, to: Path) -> Path:
    """A copy of a run directory (its lock file too) to damage."""
    shutil.copytree(run, to)
    return to


def quiet_load(path: Path) -> Any:
    """load_run without the warnings it emits (they are in Run.warnings)."""
    from ckptbench.results.store import load_run

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_run(path)


@pytest.fixture(autouse=True)
def wide_stdout(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tables on stdout are as wide as COLUMNS says (cli/common.py); fix it so that text read by tests
    does not depend on the terminal pytest runs in. Tests of other widths set their own."""
    monkeypatch.setenv("COLUMNS", "200")


@pytest.fixture(autouse=True)
def quiet_host(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Timing warnings (a busy machine, unsteady steps) depend on whatever else runs on the machine: off,
    so statuses and stderr are the same on every machine, unless a test is marked host_warnings."""
    if "host_warnings" in request.keywords:
        return
    monkeypatch.setattr("ckptbench.measure.environment.busy_warning", lambda load, cpus: None)
    monkeypatch.setattr("ckptbench.measure.environment.spread_warning", lambda step_times_s: None)


# Test files that read what another file's tests make once per process (session fixtures, tests/_est_shared.py):
# under pytest-xdist's --dist loadfile they run on one worker, one after the other, so it is made once.
@pytest.fixture
def no_bitsandbytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """bitsandbytes hidden from the import (CI installs it): what a user without the '8bit' extra sees."""
    import builtins

    real_import = builtins.__import__

    def hidden(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "bitsandbytes" or name.startswith("bitsandbytes."):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", hidden)


SHARED_WORK = {
    "test_answers": "answers", "test_memory_figures": "answers",  # the claims' predictions
    "test_reserved": "h200", "test_estimate": "h200",  # estimates of the committed H200 runs
    "test_report_cmd": "report", "test_layer_report": "report",  # report of the synthetic run
    "test_loss_check": "isolated", "test_host_timing": "isolated",  # the --isolate sweep (isolated_busy_run)
    "test_advise": "advise", "test_advise_sentences": "advise",  # advise's traces and replays (_advise_shared)
}


# The files (or SHARED_WORK groups) that take longest, longest first (seconds on 2 busy cores, December 2026): they
# are handed out first, so that the run does not end with one worker busy on a long file while the other waits;
# the others follow in their usual order. A stale order costs time, never a result.
LONGEST_FIRST = [
    "h200", "test_families", "test_cluster", "test_sharded", "test_robust_inputs", "test_accumulation",
    "test_windows", "isolated", "test_speed", "test_prepared_reuse", "test_damaged_runs", "advise",
    "test_search", "answers", "test_tune", "test_interrupt", "test_fuzz_runs", "test_recommend", "report",
    "test_techniques", "test_axes", "test_campaign", "test_fresh", "test_tracer", "test_tables",
]


def _scope(nodeid: str) -> str:
    """The unit of work of a test under --dist loadfile: its file, or the SHARED_WORK group of its file."""
    path = nodeid.split("::", 1)[0]
    return SHARED_WORK.get(Path(path).stem, path)


def _longest_first(scope: str) -> int:
    """A unit's place in LONGEST_FIRST (the units it does not name come after, in their usual order)."""
    name = scope if scope in LONGEST_FIRST else Path(scope).stem
    return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """--dist loadfile, with the files of SHARED_WORK grouped (pytest-xdist's own xdist_group marks do not reach
    its scheduler under pytest 9: the worker renames a test's _nodeid, which nodeid no longer reads), the longest
    first (LONGEST_FIRST).

    The order is that of the queue of units, set before the first unit is handed out. The workers' collections stay
    as they collected them: the scheduler sends a worker the positions of its tests in its own collection, so a
    reordered copy would send other tests than the unit's (until December 2026 it did: files were split across the
    workers and ran in alphabetical order)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedWorkScheduling(LoadScopeScheduling):
        _ordered = False

        def _split_scope(self, nodeid: str) -> str:
            return _scope(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            if not self._ordered:  # the first hand-out: the queue is complete (xdist fills it before assigning)
                units = sorted(self.workqueue.items(), key=lambda unit: _longest_first(unit[0]))  # stable
                self.workqueue.clear()
                self.workqueue.update(units)
                self._ordered = True
            super()._assign_work_unit(node)

    return SharedWorkScheduling(config, log)


_WORKERS_OF: dict[str, set[str]] = {}  # on the xdist controller: unit -> the workers its tests ran on


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    node = getattr(report, "node", None)  # xdist's controller sets it on the reports its workers send
    gateway = getattr(node, "gateway", None)
    if gateway is not None and report.when == "call":
        _WORKERS_OF.setdefault(_scope(report.nodeid), set()).add(gateway.id)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Under --dist loadfile a unit runs on one worker: a unit split across workers fails the run (the shared
    work of SHARED_WORK would be made once per worker, and the scheduler would not be what it says)."""
    if "PYTEST_XDIST_WORKER" not in os.environ and _OWN_CACHE:
        shutil.rmtree(os.environ[TRACE_CACHE_ENV], ignore_errors=True)
    split = sorted(unit for unit, workers in _WORKERS_OF.items() if len(workers) > 1)
    if split and session.config.getvalue("dist") == "loadfile":
        print(f"\nerror: units ran on more than one worker: {', '.join(split)}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# One --isolate sweep (a fresh process per point: each imports torch) read by tests of two files: the loss
# check's reference in isolated points (tests/test_loss_check.py) and the host judged where the point processes
# ran (tests/test_host_timing.py). The load average reads 99 while it runs, so every point is busy.
ISOLATED_BUSY = tiny_data(
    model={"preset": "tiny", "overrides": {"num_hidden_layers": 2}},
    measured_steps=1,
    sweep={"layout": ["none", "all"], "batch_size": [2], "seq_len": [64], "precision": ["fp32"]},
)


@pytest.fixture(scope="session")
def isolated_busy_run(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The SweepOutcome of ISOLATED_BUSY run with --isolate on a machine whose load average reads 99.0;
    read it, never change it."""
    from ckptbench.measure import environment
    from ckptbench.sweep.sweep import run_sweep

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(environment, "load_average", lambda: 99.0)
        patch.setattr(environment, "busy_warning", _REAL_BUSY_WARNING)  # whatever quiet_host did before
        patch.setattr(environment, "spread_warning", lambda step_times_s: None)
        try:
            return run_sweep(parse_config(ISOLATED_BUSY), out=tmp_path_factory.mktemp("iso") / "run", isolate=True,
                             predict=False)
        finally:
            torch.set_num_threads(before)


def _real_busy_warning() -> Any:
    from ckptbench.measure import environment

    return environment.busy_warning


_REAL_BUSY_WARNING = _real_busy_warning()  # at import, before any test's fixture replaces it


_HOST_RATES: dict[int, float] = {}


@pytest.fixture
def remembered_host_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU guard's host matmul rate (0.2 s of matmuls before every CPU sweep, sweep/cpu_guard.py) measured
    once per thread count and test session, for tests that start many sweeps of tiny configs: the guard still
    decides on a measured rate, and every tiny sweep is far below its limit."""
    from ckptbench.sweep import cpu_guard

    real = cpu_guard.host_matmul_rate

    def rate(*, threads: int, seconds: float = 0.2) -> float:
        if threads not in _HOST_RATES:
            _HOST_RATES[threads] = real(threads=threads, seconds=seconds)
        return _HOST_RATES[threads]

    monkeypatch.setattr(cpu_guard, "host_matmul_rate", rate)
# Estimates shared by the tests of one process (tests/_est_shared.py): a module opts in with
# pytestmark = pytest.mark.usefixtures("shared_estimates").
from tests._est_shared import shared_estimates, synthetic_report_made  # noqa: E402, F401
