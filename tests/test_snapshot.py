"""estimate --snapshot: the predicted allocator timeline, read by PyTorch's own memory visualizer functions.

The snapshot must be what ``torch.cuda.memory._snapshot()`` gives (segments + device_traces), so that
``torch.cuda._memory_viz`` (and pytorch.org/memory_viz) read it; its segments stand at the predicted peak
reserved, which must be the estimate's own figure.
"""

from __future__ import annotations

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
