"""estimate --snapshot: the predicted allocator timeline, read by PyTorch's own memory visualizer functions.

The snapshot must be what ``torch.cuda.memory._snapshot()`` gives (segments + device_traces), so that
``torch.cuda._memory_viz`` (and pytorch.org/memory_viz) read it; its segments stand at the predicted peak
reserved, which must be the estimate's own figure.
"""

from __future__ import annotations

import gzip
import json
import pickle
import re
from pathlib import Path
from typing import Any

import pytest
import torch.cuda._memory_viz as memory_viz
from typer.testing import CliRunner

from ckptbench.cli.main import app
from ckptbench.config.load import load_config

# Estimates of one config are made once per process and shared (tests/_est_shared.py).
pytestmark = pytest.mark.usefixtures("shared_estimates")

ROOT = Path(__file__).parents[1]
Made = tuple[dict[str, Any], dict[str, Any], Path]


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Made:
    """One tiny point estimated for the H200 with --snapshot: (the snapshot, its estimate, the folder)."""
    folder = tmp_path_factory.mktemp("snap")
    data = load_config(ROOT / "configs" / "tiny.yaml").model_dump(mode="json")
    data["sweep"].update(layout=["all"], batch_size=[2])
    config = folder / "one.yaml"
    config.write_text(json.dumps(data))
    result = CliRunner().invoke(app, ["estimate", str(config), "--gpu", "h200", "--format", "json",
                                      "--snapshot", str(folder / "peak.pickle")])
    assert result.exit_code == 0, result.output
    assert f"snapshot: {folder / 'peak.pickle'}" in result.stderr
    with (folder / "peak.pickle").open("rb") as f:
        snapshot = pickle.load(f)
    (estimate,) = json.loads(result.stdout)
    return snapshot, estimate, folder


def test_memory_viz_reads_it_and_agrees_with_the_predicted_peak(made: Made) -> None:
    snapshot, estimate, _ = made
    peak = estimate["predicted_peak_reserved_bytes"]
    assert sum(seg["total_size"] for seg in snapshot["segments"]) == peak  # segments at the predicted peak
    summary = memory_viz.segsum(snapshot)  # checks its own accounting of every segment's blocks
    reserved = re.search(r"^total_reserved: (.+)$", summary, re.M)
    assert reserved is not None and reserved.group(1) == str(memory_viz.Bytes(peak))
    assert "segments: " in summary
    text = memory_viz.trace(snapshot)
    assert "alloc" in text or "segment" in text
    assert "Active Memory Timeline" in memory_viz.trace_plot(snapshot)
    identity = lambda lines: lines  # noqa: E731  (no flamegraph.pl download)
    assert "ckptbench estimate (predicted)" in memory_viz.memory(snapshot, format_flamegraph=identity)
    assert memory_viz.segments(snapshot, format_flamegraph=identity)


def test_the_trace_replays_to_the_same_peak(made: Made) -> None:
    snapshot, estimate, _ = made
    (trace,) = snapshot["device_traces"]
    reserved = top = 0
    for event in trace:
        if event["action"] in ("segment_alloc", "segment_map"):
            reserved += event["size"]
        elif event["action"] in ("segment_free", "segment_unmap"):
            reserved -= event["size"]
        top = max(top, reserved)
    assert top == estimate["predicted_peak_reserved_bytes"]
    assert {e["action"] for e in trace} >= {"alloc", "free_requested", "free_completed", "segment_alloc"}
    assert any("measured step 1" in e["frames"][0]["name"] for e in trace)


def test_a_cpu_target_is_refused(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["estimate", str(ROOT / "configs" / "tiny.yaml"), "--target", "cpu",
                                      "--snapshot", str(tmp_path / "x.pickle")])
    assert result.exit_code == 2
    assert "--snapshot: a CUDA allocator timeline needs a CUDA target" in result.stderr


# -- trace-allocator --snapshot-from: a recorded trace in the visualizer's format ---------------------------------

MiB = 2**20


def _compact_trace(path: Path) -> int:
    """A small trace in trace-allocator's compact format (estimator/recorded.py); returns its peak reserved."""
    actions = ["alloc", "free_completed", "segment_alloc", "segment_free", "segment_map", "segment_unmap", "oom",
               "empty_cache"]
    big, small = 0x7F0000000000, 0x7F0100000000
    events = [
        ("segment_alloc", big, 20 * MiB), ("alloc", big, 1 * MiB), ("alloc", big + MiB, 4 * MiB),
        ("free_completed", big, 1 * MiB), ("segment_alloc", small, 2 * MiB), ("alloc", small, 512),
        ("alloc", small + 512, 1024),  # the peak: 22 MiB reserved, three blocks live
        ("free_completed", small, 512), ("free_completed", small + 512, 1024), ("empty_cache", 0, 0),
        ("segment_free", small, 2 * MiB), ("free_completed", big + MiB, 4 * MiB),
    ]
    data = {"format": "ckptbench-allocator-trace", "version": 1,
            "meta": {"total_bytes": 80 * 2**30, "key": {"layout": "all", "batch_size": 2}, "allocator_conf": ""},
            "actions": actions, "events": [[actions.index(a), addr, size, 0] for a, addr, size in events]}
    path.write_bytes(gzip.compress(json.dumps(data).encode()))
    return 22 * MiB


def test_a_recorded_trace_converts_to_a_snapshot_memory_viz_reads(tmp_path: Path) -> None:
    from ckptbench.estimator.recorded import load_trace

    trace = tmp_path / "all-b2.json.gz"
    peak = _compact_trace(trace)
    assert load_trace(trace).peak_reserved() == peak  # the reader the replay tests use agrees
    result = CliRunner().invoke(app, ["trace-allocator", "--snapshot-from", str(trace)])
    assert result.exit_code == 0, result.output
    target = tmp_path / "all-b2.pickle"
    assert f"snapshot: {target} (recorded peak reserved 22.00 MiB" in result.stderr
    with target.open("rb") as f:
        snapshot = pickle.load(f)
    assert sum(seg["total_size"] for seg in snapshot["segments"]) == peak  # segments at the recorded peak
    summary = memory_viz.segsum(snapshot)
    reserved = re.search(r"^total_reserved: (.+)$", summary, re.M)
    assert reserved is not None and reserved.group(1) == str(memory_viz.Bytes(peak))
    allocated = re.search(r"^total_allocated: (.+)$", summary, re.M)
    assert allocated is not None and allocated.group(1) == str(memory_viz.Bytes(4 * MiB + 512 + 1024))
    assert "Active Memory Timeline" in memory_viz.trace_plot(snapshot)
    identity = lambda lines: lines  # noqa: E731
    assert "recorded on the GPU" in memory_viz.memory(snapshot, format_flamegraph=identity)
    actions = [e["action"] for e in snapshot["device_traces"][0]]
    assert "empty_cache" not in actions and actions.count("free_requested") == actions.count("free_completed") == 4
    out = tmp_path / "named.pickle"
    assert CliRunner().invoke(app, ["trace-allocator", "--snapshot-from", str(trace), "--out", str(out)]).exit_code == 0
    assert out.read_bytes() == target.read_bytes()


@pytest.mark.parametrize(("make", "args", "message"), [
    (lambda p: p.write_bytes(gzip.compress(b"{}")), [], "not a ckptbench-allocator-trace v1 file"),
    (lambda p: p.write_bytes(b"\x1f\x8b broken"), [], "unreadable trace"),
    (lambda p: None, [], "no such trace file"),
    (lambda p: _compact_trace(p), ["--out", "{trace}"], "that is the trace itself"),
    (lambda p: _compact_trace(p), ["configs/tiny.yaml"], "give no CONFIG with it"),
])
def test_snapshot_from_refuses_in_one_line(tmp_path: Path, make: Any, args: list[str], message: str) -> None:
    trace = tmp_path / "t.json.gz"
    make(trace)
    before = trace.read_bytes() if trace.exists() else None
    result = CliRunner().invoke(app, ["trace-allocator", "--snapshot-from", str(trace),
                                      *(a.format(trace=trace) for a in args)])
    assert result.exit_code == 2 and message in result.stderr, result.output
    assert len(result.stderr.strip().splitlines()) == 1
    assert (trace.read_bytes() if trace.exists() else None) == before


def test_a_snapshot_never_replaces_a_runs_own_file(tmp_path: Path) -> None:
    import shutil

    run = Path(shutil.copytree(ROOT / "results" / "h200-gpu-check-2" / "check", tmp_path / "run",
                               ignore=shutil.ignore_patterns("report")))
    before = (run / "run.json").read_bytes()
    result = CliRunner().invoke(app, ["estimate", str(ROOT / "configs" / "tiny.yaml"), "--gpu", "h200",
                                      "--snapshot", str(run / "run.json")])
    assert result.exit_code == 2
    assert "never writes over a run's own files" in result.output
    assert (run / "run.json").read_bytes() == before
