"""The GPU campaign: the staged driver (scripts/gpu_check.sh), its stages' configs, DRY forms and time estimates."""

from __future__ import annotations

import importlib.util
import math
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from ckptbench.config.load import load_config, parse_config
from ckptbench.results.store import load_run
from scripts.campaign_lib.gpu_time import calibrate, estimate_sweep
from scripts.campaign_lib.shrink import dry_config, scale_layout

ROOT = Path(__file__).resolve().parents[1]
STAGES = ROOT / "scripts" / "gpu_stages"


def campaign() -> Any:
    spec = importlib.util.spec_from_file_location("campaign", ROOT / "scripts" / "campaign.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stage(folder: Path, name: str, body: str, *, seconds: int | None = None) -> None:
    head = f"#!/usr/bin/env bash\n# gpu-seconds: {seconds}\n" if seconds is not None else "#!/usr/bin/env bash\n"
    (folder / f"{name}.sh").write_text(head + body + "\n", encoding="utf-8")


def drive(tmp: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHON": sys.executable, "DRY": "1", "CAMPAIGN": "test-campaign",
            "STAGES": str(tmp / "stages"), "COMMITTED": str(tmp / "committed"), **env}
    return subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), str(tmp / "out")], env=full,
                          capture_output=True, text=True, timeout=300, check=False)


@pytest.fixture(scope="module")
def driven(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    tmp = tmp_path_factory.mktemp("campaign")
    (tmp / "stages").mkdir()
    stage(tmp / "stages", "10-first", 'echo "CK=$CK R=${R##*/} DRY=$DRY"; echo data > "$R/out.txt"', seconds=5)
    stage(tmp / "stages", "20-broken", 'tar tzf "$TEST_OUT/gpu_results.tar.gz" > "$R/packed-before.txt"\n'
          'echo partial > "$R/partial.txt"; exit 3')
    stage(tmp / "stages", "30-committed", "echo must-not-run; exit 1")
    stage(tmp / "stages", "40-incomplete", 'echo rerun > "$R/out.txt"')
    stage(tmp / "stages", "50-big", "echo must-not-run", seconds=100_000)
    (tmp / "stages" / "lib.sh").write_text("echo not-a-stage\n", encoding="utf-8")
    done = tmp / "committed" / "test-campaign"
    (done / "30-committed" / "run").mkdir(parents=True)
    (done / "30-committed" / "run" / "run.json").write_text("{}", encoding="utf-8")
    (done / "40-incomplete" / "run").mkdir(parents=True)
    (done / "40-incomplete" / "run" / "run.json").write_text("{}", encoding="utf-8")
    (done / "40-incomplete" / "INCOMPLETE").write_text("exit 130\n", encoding="utf-8")
    return tmp, drive(tmp, TEST_OUT=str(tmp / "out"), GPU_BUDGET_S="5000")


def test_driver_runs_stages_in_order_and_says_what_it_skipped(driven: Any) -> None:
    tmp, result = driven
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "must-not-run" not in out and "not-a-stage" not in out
    assert f"CK={sys.executable} -m ckptbench R=10-first DRY=1" in out
    summary = out[out.index("summary ("):]
    lines = [line.strip() for line in summary.splitlines()[1:6]]
    assert lines[0].startswith("10-first: ran, exit 0") and lines[0].endswith("(estimate 5 s)")
    assert lines[1].startswith("20-broken: ran, exit 3")
    assert lines[2] == f"30-committed: skipped (committed: {tmp}/committed/test-campaign/30-committed holds a run)"
    assert lines[3].startswith("40-incomplete: ran, exit 0")  # a committed run marked INCOMPLETE runs again
    assert re.fullmatch(r"50-big: skipped \(estimate 100000 s > \d+ s of budget left\)", lines[4])


def test_driver_packs_after_every_stage(driven: Any) -> None:
    tmp, _ = driven
    with tarfile.open(tmp / "out" / "gpu_results.tar.gz") as tar:
        names = set(tar.getnames())
        before = tar.extractfile("results/test-campaign/20-broken/packed-before.txt")
        assert before is not None
        packed_before = before.read().decode()
    base = "results/test-campaign/"
    assert {base + "10-first/out.txt", base + "10-first/DONE", base + "20-broken/partial.txt",
            base + "20-broken/INCOMPLETE", base + "40-incomplete/DONE", base + "gpu_check.log"} <= names
    assert not any("30-committed" in n or "50-big" in n for n in names)
    assert base + "10-first/out.txt" in packed_before  # stage 10 was packed before stage 20 started
    assert (tmp / "out" / "gpu_check.log").read_text().count("== ") >= 5


def test_driver_only_and_force(tmp_path: Path) -> None:
    (tmp_path / "stages").mkdir()
    stage(tmp_path / "stages", "10-a", "echo ran-a")
    stage(tmp_path / "stages", "20-b", "echo ran-b")
    (tmp_path / "committed" / "test-campaign" / "20-b").mkdir(parents=True)
    (tmp_path / "committed" / "test-campaign" / "20-b" / "DONE").write_text("", encoding="utf-8")
    result = drive(tmp_path, ONLY="20-b", FORCE="1")
    assert result.returncode == 0, result.stderr
    assert "ran-b" in result.stdout and "ran-a" not in result.stdout
    assert "10-a: skipped (not in ONLY)" in result.stdout


def test_the_parts_are_exactly_the_full_grids() -> None:
    for full in ("llama7b", "llama7b-a100"):
        whole = load_config(ROOT / "configs" / f"{full}.yaml")
        parts = [load_config(p) for p in sorted((ROOT / "configs" / "parts").glob(f"{full}-b*.yaml"))]
        assert len(parts) == 3
        keys = [p.key_id for cfg in parts for p in cfg.points_list()]
        assert sorted(keys) == sorted(p.key_id for p in whole.points_list()) and len(set(keys)) == len(keys)
        same = {"name", "sweep", "points", "points_mode"}
        for cfg in parts:
            assert cfg.model_dump(exclude=same) == whole.model_dump(exclude=same), cfg.name


def test_stage_estimates_are_the_computed_ones() -> None:
    tool = campaign()
    checked = 0
    for path in sorted(STAGES.glob("[0-9][0-9]-*.sh")):
        configs = tool.stage_configs(path)
        text = path.read_text()
        header = re.search(r"^# gpu-seconds: (\d+)$", text, re.M)
        assert header, path.name
        # What a stage runs besides its configs' sweeps (tests, trace processes, a sweep repeated): declared apart.
        beyond = re.search(r"^# gpu-seconds-beyond-sweeps: (\d+) \(.+\)$", text, re.M)
        if configs:
            total = sum(t.seconds for t in tool.estimates(configs))
            extra = int(beyond.group(1)) if beyond else 0
            assert int(header.group(1)) == math.ceil((total + extra) / 10) * 10, path.name
            assert total <= 240, f"{path.name}: about {total:.0f} s; split it (a GPU window is about 15 minutes)"
            checked += 1
    assert checked >= 12


def test_the_estimate_matches_the_committed_check_sweep() -> None:
    runs = [load_run(ROOT / "results/h200-gpu-check-2/check"), load_run(ROOT / "results/h200-gpu-check-1/axes")]
    cal = calibrate(runs)
    check = estimate_sweep(cal, load_config(ROOT / "configs/llama7b-check.yaml"))
    # results/h200-gpu-check-2/gpu_check.log: the check sweep took 92 s (01:51:53 to 01:53:25); one point OOM'd.
    assert check.ooms == 1 and check.runs == 16
    assert 0.85 * 92 <= check.seconds <= 1.15 * 92, check.describe()
    axes = estimate_sweep(cal, load_config(ROOT / "configs/llama7b-axes.yaml"))
    assert 0.85 * 151 <= axes.seconds <= 1.15 * 151, axes.describe()  # 01:25:01 to 01:27:32


@pytest.mark.parametrize(("layout", "small"), [
    ("first:16", "first:4"), ("last:6", "last:2"), ("range:8-12", "range:2-3"), ("every:4+3", "every:4+3"),
    ("layers:0,5,9", "layers:0,1,2"), ("all@attn+mlp", "all@attn+mlp"), ("first:31", "first:7"),
    ("first:1", "first:1"), ("none", "none"), ("fit", "fit"), ("every:16", "every:8"),
])
def test_layouts_keep_their_shape_on_the_small_model(layout: str, small: str) -> None:
    assert scale_layout(layout, 32, 8) == small


def test_every_stage_config_has_a_valid_cpu_form() -> None:
    import yaml

    tool = campaign()
    configs = {c for p in STAGES.glob("[0-9][0-9]-*.sh") for c in tool.stage_configs(p)}
    assert len(configs) >= 13
    for name in sorted(configs):
        data = yaml.safe_load((ROOT / name).read_text())
        small = parse_config(dry_config(data))  # validates, including the CPU checks
        real = load_config(ROOT / name)
        assert small.device == "cpu" and small.model.preset == "tiny"
        assert bool(small.search_templates()) == bool(real.search_templates()), name
        assert len(small.points_list()) + len(small.search_templates()) > 0, name
        if real.memory_cap_gib:
            assert small.memory_cap_gib is not None and small.memory_cap_gib < real.memory_cap_gib / 100


def test_dry_form_drops_what_a_cpu_cannot_run() -> None:
    data = {
        "name": "x", "device": "cuda", "memory_cap_gib": 80, "budget_gib": 76, "warmup_steps": 2, "measured_steps": 5,
        "model": {"preset": "llama-7b"},
        "sweep": {"layout": ["none", "all", "first:16", "last:6"], "batch_size": [1, 2, 4, 8], "seq_len": [2048],
                  "precision": ["bf16", "fp16"], "offload": ["none", "all"], "compile": [False, True]},
        "points": [{"layout": "range:8-12", "batch_size": 6, "offload": "ckpt_inputs", "precision": "amp_fp16"}],
    }
    small = dry_config(data)
    assert small["sweep"] == {"layout": ["none", "all", "first:4"], "batch_size": [1, 8], "seq_len": [64],
                              "precision": ["fp32"], "offload": ["none"], "compile": [False]}
    assert small["points"] == [{"layout": "range:2-3", "batch_size": 6, "offload": "none", "precision": "amp_bf16"}]
    # The cap keeps its ratio to the static part: 80 GiB over LLaMA-7B's 8 bytes/parameter, in fp32 on the tiny model.
    assert small["memory_cap_gib"] == pytest.approx(80 * (1.67e6 * 16) / (6.74e9 * 8), rel=0.02)
    cfg = parse_config(small)
    assert cfg.device == "cpu" and cfg.model.num_layers == 8 and len(cfg.points_list()) == 7


def test_dry_form_runs_sharded_points_as_two_gloo_ranks() -> None:
    data = {"name": "x", "device": "cuda", "model": {"preset": "llama-7b"},
            "sweep": {"layout": ["none"], "batch_size": [2], "seq_len": [2048], "precision": ["bf16"],
                      "parallel": ["none", "ddp:8", "fsdp2:1", "fsdp2:8:noreshard", "fsdp2:2"]},
            "points": [{"parallel": "ddp:4"}]}
    small = dry_config(data)
    assert small["sweep"]["parallel"] == ["none", "ddp:2", "fsdp2:2", "fsdp2:2:noreshard"]
    assert small["points"] == [{"parallel": "ddp:2"}]
    assert parse_config(small).device == "cpu"


def test_a_failed_required_stage_stops_the_campaign(tmp_path: Path) -> None:
    (tmp_path / "stages").mkdir()
    stage(tmp_path / "stages", "01-smoke", "# required: the CUDA path\necho smoke > \"$R/out.txt\"; exit 1")
    stage(tmp_path / "stages", "02-next", "echo must-not-run")
    result = drive(tmp_path)
    assert result.returncode == 0, result.stderr
    assert "must-not-run" not in result.stdout
    assert "02-next: not started (01-smoke failed: a required stage)" in result.stdout
    with tarfile.open(tmp_path / "out" / "gpu_results.tar.gz") as tar:  # what the failed stage wrote came back
        assert "results/test-campaign/01-smoke/INCOMPLETE" in tar.getnames()
    # Passing, it stops nothing.
    stage(tmp_path / "stages", "01-smoke", "# required: the CUDA path\necho smoke")
    result = drive(tmp_path)
    assert "must-not-run" in result.stdout and "not started" not in result.stdout


def test_traces_and_snapshots_come_back_apart_in_parts(tmp_path: Path) -> None:
    (tmp_path / "stages").mkdir()
    stage(tmp_path / "stages", "10-traces", 'mkdir -p "$R/traces"\n'
          'head -c 20000000 /dev/urandom > "$R/traces/a.json.gz"\n'
          'echo snap > "$R/peak.pickle"; echo small > "$R/summary.md"')
    result = drive(tmp_path)
    assert result.returncode == 0, result.stderr
    out = tmp_path / "out"
    with tarfile.open(out / "gpu_results.tar.gz") as tar:
        names = set(tar.getnames())
    assert "results/test-campaign/10-traces/summary.md" in names
    assert not any(n.endswith((".json.gz", ".pickle")) for n in names)
    parts = sorted(out.glob("gpu_traces.tgz.part-*"))
    assert [p.name for p in parts] == ["gpu_traces.tgz.part-00", "gpu_traces.tgz.part-01"]
    assert all(p.stat().st_size <= 15 * 2**20 for p in parts)
    joined = tmp_path / "traces.tgz"
    joined.write_bytes(b"".join(p.read_bytes() for p in parts))
    with tarfile.open(joined) as tar:
        assert sorted(tar.getnames()) == ["results/test-campaign/10-traces/peak.pickle",
                                          "results/test-campaign/10-traces/traces/a.json.gz"]


def test_compare_snapshots_counts_segments_by_size(tmp_path: Path) -> None:
    import pickle
    from collections import Counter

    spec = importlib.util.spec_from_file_location("compare_snapshots", ROOT / "scripts" / "compare_snapshots.py")
    assert spec is not None and spec.loader is not None
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    mib = 2**20

    def snap(name: str, sizes: list[int]) -> str:
        path = tmp_path / name
        path.write_bytes(pickle.dumps({"segments": [{"total_size": s} for s in sizes], "device_traces": [[]]}))
        return str(path)

    same = snap("a.pickle", [20 * mib, 2 * mib, 2 * mib])
    assert tool.main([same, snap("b.pickle", [2 * mib, 20 * mib, 2 * mib])]) == 0
    other = snap("c.pickle", [20 * mib, 2 * mib, 22 * mib])
    assert tool.main([same, other, "--out", str(tmp_path / "t.md")]) == 1
    text = (tmp_path / "t.md").read_text()
    assert "| 22 MiB (23068672 B) | 0 | 1 | -1 |" in text and "| 2 MiB (2097152 B) | 2 | 1 | +1 |" in text
    assert text.rstrip().endswith("reserved -45.45% against the recorded 44 MiB.")
    assert tool.segment_sizes({"segments": [{"total_size": 5}, {"total_size": 5}]}) == Counter({5: 2})
    (tmp_path / "bad.pickle").write_bytes(b"not a pickle")
    assert tool.main([same, str(tmp_path / "bad.pickle")]) == 2
