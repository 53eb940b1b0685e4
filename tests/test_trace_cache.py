"""The trace cache (estimator/trace_cache.py): estimates from cached traces equal fresh ones byte for byte, a cache of
another version is ignored, a damaged entry is as if absent, writes are atomic and bounded, `ckptbench cache` shows
and clears it, and an answer from cached traces imports neither torch nor transformers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ckptbench.cli.main import app
from ckptbench.config.load import parse_config
from ckptbench.estimator import trace_cache
from ckptbench.estimator.estimator import Estimator, card
from ckptbench.estimator.trace_cache import TraceCache

from .conftest import tiny_data

# A four-layer model (traced as short models and re-assembled) at two batches and three layouts, with 8-bit-free
# AdamW: the optimizer, short-model and allocator-replay paths all take part.
CFG = parse_config(tiny_data(
    device="cuda", optimizer="adamw_fused",
    model={"preset": "tiny", "overrides": {"num_hidden_layers": 4}},
    sweep={"layout": ["none", "all", "first:2"], "batch_size": [1, 2], "seq_len": [64], "precision": ["bf16"]},
))
POINTS = CFG.points_list()


def _estimates(est: Estimator) -> str:
    est.run_traces(POINTS, workers=1)
    return "\n".join(repr(e) for e in est.estimate_each(POINTS, workers=1))


def _count_traces(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    import ckptbench.estimator.trace as trace

    calls: list[str] = []
    for name in ("trace_step", "trace_optimizer"):

        def counted(*args: Any, _real: Any = getattr(trace, name), _name: str = name, **kwargs: Any) -> Any:
            calls.append(_name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(trace, name, counted)
    return calls


def test_estimates_from_cached_traces_are_byte_identical(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _count_traces(monkeypatch)
    cache = TraceCache(tmp_path)
    tracing = Estimator(CFG, gpu=card("a100-80gb"), cache=cache)
    fresh = _estimates(tracing)  # traced here: the estimates of fresh traces (and the cache filled)
    traced = len(calls)
    assert traced > 2 and cache.size().entries >= traced
    again = _estimates(Estimator(CFG, gpu=card("a100-80gb"), cache=cache))
    assert len(calls) == traced, "a cached trace was traced again"
    assert again == fresh
    # another card with the same cuBLAS workspace replays the same cached traces, as the tracing Estimator would
    other = _estimates(Estimator(CFG, gpu=card("a100-40gb"), cache=cache))
    assert len(calls) == traced
    assert other == _estimates(tracing.on_card(card("a100-40gb"))) != fresh
    # without the cache, nothing is read or written
    assert _estimates(Estimator(CFG, gpu=card("a100-80gb"), cache=None)) == fresh and len(calls) == 2 * traced


def test_an_estimate_asked_again_is_read_not_replayed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The estimates replayed from cached traces are kept too: asked again (a new Estimator: a later command) on the
    same card they are read back, equal, with no allocator replay; another card or budget replays."""
    import ckptbench.estimator.estimator as estimator_module

    replays: list[int] = []
    real = estimator_module.predict_reserved

    def counted(*args: Any, **kwargs: Any) -> Any:
        replays.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(estimator_module, "predict_reserved", counted)
    cache = TraceCache(tmp_path)
    first = _estimates(Estimator(CFG, gpu=card("a100-80gb"), cache=cache))
    replayed = len(replays)
    assert replayed > 0
    again = Estimator(CFG, gpu=card("a100-80gb"), cache=cache)
    assert _estimates(again) == first and len(replays) == replayed
    points = CFG.points_list()
    one_by_one = "\n".join(repr(again.estimate(p)) for p in points)  # the memo
    assert one_by_one == first and len(replays) == replayed
    fresh = Estimator(CFG, gpu=card("a100-80gb"), cache=cache)  # one by one from the disk
    fresh.run_traces(points, workers=1)
    assert "\n".join(repr(fresh.estimate(p)) for p in points) == first and len(replays) == replayed
    other = _estimates(Estimator(CFG, gpu=card("a100-40gb"), cache=cache))
    assert len(replays) == 2 * replayed and other != first
    budget = Estimator(CFG, gpu=card("a100-80gb"), cache=cache)
    budget.run_traces(points, workers=1)
    smaller = "\n".join(repr(e) for e in budget.estimate_each(points, budget_bytes=2**30, workers=1))
    assert smaller != first and len(replays) == 3 * replayed
    # written once by the first Estimator: the keys of a point's estimate and of each trace differ
    assert cache.size().entries >= replayed + len(points)


def test_estimates_written_by_forked_workers_are_counted_and_read_back(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """With two workers each process keeps the estimates it made (``estimate_each``'s parts, this process's and the
    forked one's, in parallel): a later command reads them all back, equal, with no replay, and the folder's count,
    kept once by this process, holds what they all wrote."""
    import ckptbench.estimator.estimator as estimator_module

    cache = TraceCache(tmp_path)
    est = Estimator(CFG, gpu=card("a100-80gb"), cache=cache)
    est.run_traces(POINTS, workers=1)
    writers = tmp_path / "writers"
    real = TraceCache.write_many

    def noted(self: TraceCache, items: Any) -> int:
        with writers.open("a") as f:  # (a file: the forked process's calls are not seen here otherwise)
            f.write(f"{os.getpid()}\n")
        return real(self, items)

    monkeypatch.setattr(TraceCache, "write_many", noted)
    first = est.estimate_each(POINTS, workers=2)
    assert len(writers.read_text().split()) >= 1
    assert int((tmp_path / "traces" / "size").read_text()) == cache.size().bytes
    replays: list[int] = []
    monkeypatch.setattr(estimator_module, "predict_reserved", lambda *a, **k: replays.append(1))
    again = Estimator(CFG, gpu=card("a100-80gb"), cache=cache)
    again.run_traces(POINTS, workers=1)
    assert again.estimate_each(POINTS, workers=1) == first and not replays


def test_peaks_are_assembled_once_for_every_card_and_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The byte model's peaks of a short trace's points are kept on disk (``keep_peaks``, one entry a trace) without
    the card's cuBLAS workspaces: a later command, on this card or another (H100: other workspaces), assembles none,
    and its allocated peaks and estimates are those assembled afresh."""
    import ckptbench.estimator.estimator as estimator_module

    cache = TraceCache(tmp_path)
    first = Estimator(CFG, gpu=card("a100-80gb"), cache=cache)
    fresh = _estimates(first)
    first.keep_peaks()
    kept = cache.size().entries
    first.keep_peaks()  # nothing new: nothing written
    assert cache.size().entries == kept
    fresh_h100 = _estimates(Estimator(CFG, gpu=card("h100-80gb"), cache=None))
    peaks_h100 = Estimator(CFG, gpu=card("h100-80gb"), cache=None)
    peaks_h100.run_traces(POINTS, workers=1)
    allocated = [peaks_h100.allocated_peak(p) for p in POINTS]

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a kept peak was assembled again")

    monkeypatch.setattr(estimator_module, "assemble", refused)
    again = Estimator(CFG, gpu=card("h100-80gb"), cache=cache)
    again.run_traces(POINTS, workers=1)
    assert [again.allocated_peak(p) for p in POINTS] == allocated
    assert "\n".join(repr(e) for e in again.estimate_each(POINTS, workers=1)) == fresh_h100 != fresh


def test_a_refused_trace_is_kept_as_its_refusal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A technique the estimator does not trace (torchao's CPU offload of the optimizer): refused once, then read
    back as the same refusal without tracing again."""
    calls = _count_traces(monkeypatch)
    cfg = parse_config(tiny_data(device="cuda", model=CFG.model.model_dump(),
                                 sweep={"layout": ["none"], "batch_size": [1], "seq_len": [64], "precision": ["bf16"],
                                        "optimizer_offload": ["cpu"]}))
    cache = TraceCache(tmp_path)
    first = _estimates_of(Estimator(cfg, gpu=card("a100-80gb"), cache=cache), cfg)
    traced = len(calls)
    assert "not estimated" in first and traced >= 1
    again = _estimates_of(Estimator(cfg, gpu=card("a100-80gb"), cache=cache), cfg)
    assert again == first and len(calls) == traced


def _estimates_of(est: Estimator, cfg: Any) -> str:
    points = cfg.points_list()
    est.run_traces(points, workers=1)
    return "\n".join(repr(e) for e in est.estimate_each(points, workers=1))


def test_a_cache_of_another_version_is_ignored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = TraceCache(tmp_path)
    cache.put(("k", 1), {"made": "by this version"})
    assert cache.get(("k", 1)) == {"made": "by this version"}
    for package, version in [("torch", "0.0.1"), ("transformers", "9.9.9"), ("ckptbench", "0" * 16)]:
        changed = tuple((p, version if p == package else v) for p, v in trace_cache.versions())
        with monkeypatch.context() as patch:
            patch.setattr(trace_cache, "versions", lambda changed=changed: changed)
            assert cache.get(("k", 1)) is None, package
    # a file of another version put where this version looks (a hash collision, a copied folder): still refused
    path = cache._path(repr(("k", 1)))
    data = path.read_bytes()
    with monkeypatch.context() as patch:
        patch.setattr(trace_cache, "versions", lambda: (("torch", "0.0.1"),))
        cache.put(("k", 1), "other")
        other = cache._path(repr(("k", 1))).read_bytes()
    path.write_bytes(other)
    assert cache.get(("k", 1)) is None
    path.write_bytes(data)
    assert cache.get(("k", 1)) == {"made": "by this version"}


def test_the_code_hash_changes_with_the_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "ckptbench"
    (package / "estimator").mkdir(parents=True)
    module = package / "estimator" / "trace_cache.py"
    module.write_text("a = 1\n")
    monkeypatch.setattr(trace_cache, "__file__", str(module))
    trace_cache.code_hash.cache_clear()
    try:
        before = trace_cache.code_hash()
        (package / "other.py").write_text("b = 2\n")
        trace_cache.code_hash.cache_clear()
        assert trace_cache.code_hash() != before
    finally:
        trace_cache.code_hash.cache_clear()


def test_damaged_entries_are_absent_and_writes_are_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = TraceCache(tmp_path)
    cache.put("key", list(range(1000)))
    path = cache._path(repr("key"))
    path.write_bytes(path.read_bytes()[:100])  # cut
    assert cache.get("key") is None
    path.write_bytes(b"not a pickle")
    assert cache.get("key") is None
    cache.put("key", [1, 2])
    assert cache.get("key") == [1, 2]

    def full_disk(*args: Any, **kwargs: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(trace_cache.pickle, "dump", full_disk)
    cache.put("key", [3])  # costs the cache, never the caller
    cache.put("new", [3])
    assert cache.get("key") == [1, 2] and cache.get("new") is None
    monkeypatch.undo()
    cache.put("unpicklable", lambda: None)  # a value pickle refuses: not kept, and no error
    assert cache.get("unpicklable") is None
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")], "a temporary file was left"


def test_the_cache_is_bounded_least_recently_used_first(tmp_path: Path) -> None:
    cache = TraceCache(tmp_path, limit=10_000)
    for i in range(12):
        cache.put(("k", i), b"x" * 1500)
        os.utime(cache._path(repr(("k", i))), (1000 + i, 1000 + i))
    assert cache.size().bytes <= 10_000
    assert cache.get(("k", 11)) is not None and cache.get(("k", 0)) is None


def test_the_folder_is_walked_only_past_the_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the folder holds is counted as entries are written: a command writing hundreds of estimates does not
    stat every entry each time (a 20,000-entry cache made an answer 1.5 s slower); past the bound, or with the count
    lost, it is walked and the count set right."""
    cache = TraceCache(tmp_path, limit=200_000)  # (an entry of 1,000 bytes: about 1,400 with its key and versions)
    walks: list[int] = []
    real = TraceCache._files

    def counted(self: TraceCache) -> Any:
        walks.append(1)
        return real(self)

    monkeypatch.setattr(TraceCache, "_files", counted)
    cache.put_many((("k", i), b"x" * 1000) for i in range(40))
    for i in range(40, 80):
        cache.put(("k", i), b"x" * 1000)
    assert len(walks) == 1  # the first write, with no count yet
    assert int((tmp_path / "traces" / "size").read_text()) == cache.size().bytes
    cache.put_many((("k", i), b"x" * 1000) for i in range(80, 200))  # past 200,000 bytes: walked, bounded
    assert len(walks) == 3 and cache.size().bytes <= 200_000
    (tmp_path / "traces" / "size").write_text("not a number")
    cache.put(("k", 0), b"y")
    assert len(walks) == 5


def test_cache_command_shows_and_clears(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(trace_cache.ENV_DIR, str(tmp_path / "c"))
    TraceCache(tmp_path / "c").put("x", 1)
    shown = CliRunner().invoke(app, ["cache"])
    assert shown.exit_code == 0 and f"trace cache: {tmp_path / 'c'}" in shown.stdout
    assert "1 entry (traces and the estimates" in shown.stdout
    cleared = CliRunner().invoke(app, ["cache", "clear"])
    assert cleared.exit_code == 0 and cleared.stdout.startswith("removed 1 entry (")
    assert TraceCache(tmp_path / "c").size().entries == 0
    monkeypatch.setenv(trace_cache.ENV_DIR, "off")
    off = CliRunner().invoke(app, ["cache", "clear"])
    assert off.exit_code == 0 and "the trace cache is off" in off.stdout
    monkeypatch.delenv(trace_cache.ENV_DIR)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert trace_cache.default_root() == tmp_path / "xdg" / "ckptbench"


def test_an_answer_from_cached_traces_imports_neither_torch_nor_transformers(tmp_path: Path) -> None:
    """advise asked twice: the second (another card) replays the cached traces without importing either."""
    code = (
        "import json, sys\n"
        "from ckptbench.cli.main import app\n"
        "try:\n"
        "    app(sys.argv[1:], standalone_mode=False)\n"
        "finally:\n"
        "    print(json.dumps(sorted(m for m in ('torch', 'transformers') if m in sys.modules)), file=sys.stderr)\n"
    )
    env = {**os.environ, trace_cache.ENV_DIR: str(tmp_path), "CKPTBENCH_WORKERS": "1"}
    ask = ["advise", "--model", "tiny", "--batch", "2", "--seq", "256"]

    def run(gpu: str) -> tuple[str, list[str]]:
        done = subprocess.run([sys.executable, "-c", code, *ask, "--gpu", gpu], capture_output=True, text=True,
                              env=env, timeout=300)
        assert done.returncode == 0, done.stderr
        return done.stdout, json.loads(done.stderr.strip().splitlines()[-1])

    _, cold = run("a100-80gb")
    assert cold == ["torch", "transformers"]
    answer, warm = run("a100-40gb")
    assert warm == [], f"imported {warm} although every trace was cached"
    assert "a100" in answer.lower()
