"""Fanned-out sweeps (--executor local|slurm, through submitit): same points and statuses as a plain
sweep, interruption and resume, dying jobs, the Slurm path on submitit's own executors with the sbatch
script it writes, what waits for what, and runs on mixed GPU models."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import submitit
import yaml
from typer.testing import CliRunner

from ckptbench.cli.main import app
from ckptbench.config.cluster import ClusterSpec, SlurmSpec
from ckptbench.config.load import load_config
from ckptbench.measure.loss_check import LossReferences
from ckptbench.measure.progress import Progress
from ckptbench.processes.executors import Request, SlurmPool, cancel
from ckptbench.processes.fanout import attach_pool, make_fanout
from ckptbench.processes.job import run_point_job
from ckptbench.processes.request import PointRequest
from ckptbench.processes.schedule import prerequisites, ready
from ckptbench.results.record import Scalar
from ckptbench.results.store import load_run
from ckptbench.sweep.sweep import run_sweep
from tests.conftest import tiny_config, tiny_data

ROOT = Path(__file__).parents[1]
TWO_LAYERS = {"preset": "tiny", "overrides": {"num_hidden_layers": 2}}
SMALL = {"layout": ["none", "all", "first:1"], "batch_size": [1], "seq_len": [32], "precision": ["fp32"]}
LOCAL2 = ClusterSpec.model_validate({"executor": "local", "local": {"jobs": 2}})


def _sweep(*args: str) -> Any:
    return CliRunner().invoke(app, ["sweep", *args], catch_exceptions=False)


@pytest.mark.slow
def test_local_executor_on_tiny_yaml_gives_the_plain_sweeps_points(tmp_path: Path) -> None:
    # tiny.yaml's model and options on 4 of its 12 points (each fanned-out point is a fresh process that
    # imports torch): the reference layout, a sub-layer checkpointed one, and the batch chain of each.
    data = yaml.safe_load((ROOT / "configs" / "tiny.yaml").read_text())
    data["sweep"] = {**data["sweep"], "layout": ["none", "all@attn+mlp"]}
    config = tmp_path / "tiny4.yaml"
    config.write_text(yaml.safe_dump(data))
    plain = _sweep(str(config), "--out", str(tmp_path / "plain"), "--no-predict")
    fanned = _sweep(str(config), "--out", str(tmp_path / "fanned"), "--no-predict",
                    "--executor", "local", "--jobs", "2")
    assert plain.exit_code == fanned.exit_code == 0, fanned.output
    a, b = load_run(tmp_path / "plain"), load_run(tmp_path / "fanned")
    assert {r.key_id: r.status for r in a.points} == {r.key_id: r.status for r in b.points}
    assert len(b.points) == len(load_config(config).points_list()) == 4
    for rec in b.points:
        assert rec.executor == "local" and rec.job_id and rec.isolated and rec.host
    # the CPU tracker counts the same bytes in a fresh job as in the sweep's own process
    assert {r.key_id: r.peak_allocated_bytes for r in a.points} == {r.key_id: r.peak_allocated_bytes for r in b.points}
    assert (b.meta.options.cluster or {})["executor"] == "local" and b.meta.status == "complete"
    assert (tmp_path / "fanned" / "summary.md").exists()


def _jobs_alive(run_dir: Path) -> list[str]:
    """Command lines of processes still serving this run's jobs (submitit job processes)."""
    alive = []
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if str(run_dir / "jobs") in cmd:
            alive.append(cmd)
    return alive


@pytest.mark.slow
def test_ctrl_c_cancels_the_jobs_and_resume_adds_only_the_missing_points(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a terminal sends it: SIGINT to the whole process group (the sweep and submitit's controllers);
    one line, no traceback, the hung job cancelled, and --resume runs only what is missing.

    (Also the test of issue 22's Ctrl-C to a local-executor sweep, once in tests/test_robust_inputs.py: one
    fanned-out sweep interrupted serves both.)"""
    config = tmp_path / "small.yaml"
    config.write_text(yaml.safe_dump(tiny_data(model=TWO_LAYERS, sweep=SMALL, measured_steps=1)))
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CKPTBENCH_TEST_HANG": "layout=all",
           "CKPTBENCH_ENABLE_TEST_HOOKS": "1", "OMP_NUM_THREADS": "1"}  # the hooks are test-only
    cmd = [sys.executable, "-m", "ckptbench", "sweep", str(config), "--out", str(run_dir), "--no-predict",
           "--executor", "local", "--jobs", "2"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            start_new_session=True)
    points = run_dir / "points.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not _jobs_alive(run_dir):
        time.sleep(0.2)
    while time.monotonic() < deadline and (not points.exists() or len(points.read_text().splitlines()) < 2):
        time.sleep(0.5)  # 'none' (the reference) and 'first:1' finish; 'all' hangs in its job
    assert len(points.read_text().splitlines()) == 2
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert [line for line in err.splitlines() if line.startswith("interrupted:")] == [err.strip().splitlines()[-1]]
    assert json.loads((run_dir / "run.json").read_text())["status"] == "interrupted"
    deadline = time.monotonic() + 30
    while _jobs_alive(run_dir) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _jobs_alive(run_dir) == []  # the hung job was cancelled, not left holding its device

    # The resume in this process (what is tested is which points run, not a fresh process's start).
    monkeypatch.setenv("CKPTBENCH_ENABLE_TEST_HOOKS", "1")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # for the resumed point's job
    monkeypatch.delenv("CKPTBENCH_TEST_HANG", raising=False)
    done = CliRunner().invoke(app, ["sweep", str(config), "--resume", str(run_dir), "--executor", "local"])
    assert done.exit_code == 0, (done.output, done.exception)
    lines = [json.loads(line)["key"]["layout"] for line in points.read_text().splitlines()]
    assert sorted(lines) == ["all", "first:1", "none"]  # each point once: nothing ran twice
    assert {r.status for r in load_run(run_dir).points} == {"ok"}


def test_a_job_that_dies_becomes_an_error_point(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CKPTBENCH_ENABLE_TEST_HOOKS", "1")  # the hooks are test-only
    monkeypatch.setenv("CKPTBENCH_TEST_JOB_CRASH", "layout=all")
    cfg = tiny_config(model=TWO_LAYERS, sweep={**SMALL, "layout": ["none", "all"]}, measured_steps=1)
    out = run_sweep(cfg, out=tmp_path / "run", cluster=LOCAL2, predict=False)
    by = {r.key["layout"]: r for r in load_run(out.run_dir).points}
    assert by["none"].status == "ok" and out.status == "complete"
    assert by["all"].status == "error" and by["all"].executor == "local"
    assert by["all"].reason and by["all"].reason.startswith("the job ended without a record")
    assert "CKPTBENCH_TEST_JOB_CRASH" in (by["all"].reason or "")  # the job's stderr tail


@pytest.mark.slow
def test_slurm_path_runs_on_submitits_debug_executor(tmp_path: Path) -> None:
    """The Slurm pool (arrays, in-flight cap, parameters) with submitit's DebugExecutor in place of Slurm."""
    cfg = tiny_config(model=TWO_LAYERS, sweep={**SMALL, "layout": ["none", "all"]}, measured_steps=1)
    spec = ClusterSpec.model_validate({"executor": "slurm", "slurm": {"partition": "gpu", "array_parallelism": 2,
                                                                       "sbatch": {"qos": "high"}}})
    runner, environment = make_fanout(cfg, spec, timeout_s=None)
    attach_pool(runner, tmp_path, make_executor=submitit.DebugExecutor)
    runner.pool.poll_s = 0.05  # type: ignore[union-attr]  # the debug executor runs a job when asked if done
    records = []

    def collect(event: Progress) -> None:
        if event.record is not None:
            records.append(event.record)

    runner.run(cfg.points_list(), collect)
    assert environment.executor == "slurm" and environment.device_type == "cpu"
    assert records[0].key["layout"] == "none"  # the loss reference runs first
    assert {r.status for r in records} == {"ok"} and {r.executor for r in records} == {"slurm"}
    assert all(r.loss_check and r.loss_check.reference == "none" for r in records[1:])
    params = runner.pool.executor.parameters  # type: ignore[union-attr]
    assert params["partition"] == "gpu" and params["array_parallelism"] == 2
    assert params["additional_parameters"] == {"qos": "high"} and params["gpus_per_node"] == 1


FAKE_SBATCH = """#!/bin/sh
n=$(($(cat "$CAPTURE/count" 2>/dev/null || echo 0) + 1)); echo $n > "$CAPTURE/count"
cp "$1" "$CAPTURE/sbatch-$n.sh"; echo "Submitted batch job $((4000 + n))"
"""


def test_sbatch_scripts_submitit_writes_for_the_cluster_section(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Submitted through submitit's real SlurmExecutor to a stand-in sbatch that keeps the scripts."""
    bin_dir, capture = tmp_path / "bin", tmp_path / "capture"
    bin_dir.mkdir()
    capture.mkdir()
    scripts = {"sbatch": FAKE_SBATCH, "srun": "#!/bin/sh\nexit 0\n",
               "scancel": '#!/bin/sh\necho "$@" >> "$CAPTURE/scancel"\n'}
    for name, text in scripts.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CAPTURE", str(capture))
    spec = SlurmSpec(partition="gpu", time_min=30, array_parallelism=2, account="proj", cpus_per_task=8,
                     mem_gb=64, sbatch={"qos": "high", "exclusive": True}, setup=["module load cuda/12.4"])
    pool = SlurmPool(tmp_path / "jobs", spec, "tiny")
    def request(**key: Scalar) -> PointRequest:
        return PointRequest(config={}, key=key, parent_pid=os.getpid())

    batch = [Request(request(layout=x)) for x in ("none", "all", "first:1")] + [Request(request(), 2)]
    subs = pool.submit(run_point_job, batch, None)  # (the fake sbatch runs no job)
    first, second = (capture / "sbatch-1.sh").read_text(), (capture / "sbatch-2.sh").read_text()
    sbatch = [line for line in first.splitlines() if line.startswith("#SBATCH")]
    for expected in ("--partition=gpu", "--time=30", "--gpus-per-node=1", "--array=0-2%2", "--account=proj",
                     "--qos=high", "--exclusive", "--job-name=ckptbench-tiny", "--nodes=1", "--ntasks-per-node=1",
                     "--cpus-per-task=8", "--mem=64GB"):
        assert f"#SBATCH {expected}" in sbatch, expected
    assert "module load cuda/12.4" in first and "submitit.core._submit" in first
    assert "#SBATCH --gpus-per-node=2" in second and "--array" not in second  # a sharded point: its own job
    assert [s.job.job_id for s in subs] == ["4001_0", "4001_1", "4001_2", "4002"]
    assert not pool.can_start(1)  # 4 in flight >= array_parallelism
    cancel(subs)
    assert (capture / "scancel").read_text().split() == ["4001_0", "4001_1", "4001_2", "4002"]


def test_cli_options_override_the_cluster_section() -> None:
    from ckptbench.config.cluster import with_overrides
    from ckptbench.errors import ConfigError

    cfg = tiny_config(cluster={"executor": "local", "slurm": {"partition": "a", "sbatch": {"qos": "low"}}})
    spec = with_overrides(cfg.cluster, executor="slurm", partition="b", time_min=5, sbatch=["qos=high", "exclusive"])
    assert (spec.executor, spec.slurm.partition, spec.slurm.time_min) == ("slurm", "b", 5)
    assert spec.slurm.sbatch == {"qos": "high", "exclusive": True}
    with pytest.raises(ConfigError, match=r"cluster\.slurm\.array_parallelism"):
        with_overrides(cfg.cluster, array_parallelism=0)
    with pytest.raises(ConfigError, match="--sbatch"):
        with_overrides(cfg.cluster, sbatch=["qos="])


# -- what waits for what (pure) -------------------------------------------------------------------------


def test_points_wait_for_their_loss_reference_and_the_smaller_batch_only() -> None:
    cfg = tiny_config(sweep={"layout": ["none", "all"], "batch_size": [1, 2], "seq_len": [32], "precision": ["fp32"],
                             "parallel": ["none", "fsdp2:2"]})
    points = cfg.points_list()
    name = {p.key_id: f"{p.parallel}/{p.layout}/b{p.batch_size}" for p in points}
    waits = prerequisites(points, [], skip_after_oom=True, reference_cells=LossReferences().reference_cells)
    got = {name[k]: sorted(name[x] for x in v) for k, v in waits.items()}
    assert got == {
        "none/none/b1": [],
        "none/none/b2": ["none/none/b1"],
        "none/all/b1": ["none/none/b1"],
        "none/all/b2": ["none/all/b1", "none/none/b2"],
        # a sharded point's reference is the unsharded 'none' of its cell
        "fsdp2:2/none/b1": ["none/none/b1"],
        "fsdp2:2/none/b2": ["fsdp2:2/none/b1", "none/none/b2"],
        "fsdp2:2/all/b1": ["none/none/b1"],
        "fsdp2:2/all/b2": ["fsdp2:2/all/b1", "none/none/b2"],
    }
    first = {name[k] for k in ready(waits, finished=set(), started=set())}
    assert first == {"none/none/b1"}
    # resumed: the references already ran, so only the batch chains wait
    rest = [p for p in points if p.layout != "none"]
    waits = prerequisites(rest, [p for p in points if p.layout == "none"], skip_after_oom=False,
                          reference_cells=LossReferences().reference_cells)
    assert all(v == set() for v in waits.values())


# -- runs whose points ran on different GPU models --------------------------------------------------------

RUNS = ROOT / "tests" / "fixtures" / "runs"


def _copy_with_gpus(name: str, dest: Path, gpus: list[str]) -> Path:
    shutil.copytree(RUNS / name, dest)
    lines = (dest / "points.jsonl").read_text().splitlines()
    records = [{**json.loads(line), "gpu_name": gpus[i % len(gpus)]} for i, line in enumerate(lines)]
    (dest / "points.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return dest


def test_a_run_on_mixed_gpu_models_says_so_and_compare_refuses_it(tmp_path: Path) -> None:
    from ckptbench.analysis.compare import compare_refs
    from ckptbench.render.summary import run_header

    base = _copy_with_gpus("base", tmp_path / "base", ["NVIDIA H100"])
    new = _copy_with_gpus("mem10", tmp_path / "new", ["NVIDIA H100", "NVIDIA A100"])
    assert "points ran on different GPU models: NVIDIA A100 (2), NVIDIA H100 (2)" in run_header(load_run(new))
    assert "different GPU models" not in run_header(load_run(base))
    refused = compare_refs(base, new)
    assert {p.mark for p in refused.points} == {"not comparable"}
    assert any("ran on different GPU models" in n for n in refused.notes)
    args = ["compare", str(base), str(new), "--fail-memory", "2"]
    gated = CliRunner().invoke(app, args)  # nothing compared: the gate judged nothing, and that is no pass (issue 35)
    assert gated.exit_code == 2 and "the gates judged nothing" in gated.stderr
    allowed = CliRunner().invoke(app, [*args, "--allow-mixed-gpus"])
    assert allowed.exit_code == 3 and "gate failed" in allowed.output  # the 10% growth, once compared


def test_resume_accepts_a_run_written_before_the_parallel_axis_and_cluster_section(tmp_path: Path) -> None:
    cfg = tiny_config(model=TWO_LAYERS, sweep={**SMALL, "layout": ["none"]}, measured_steps=1)
    run_dir = run_sweep(cfg, out=tmp_path / "run", predict=False).run_dir
    meta = json.loads((run_dir / "run.json").read_text())
    del meta["config"]["sweep"]["parallel"], meta["config"]["cluster"]  # as an older ckptbench wrote it
    (run_dir / "run.json").write_text(json.dumps(meta))
    again = run_sweep(cfg, resume=run_dir, predict=False)
    assert again.already_done == 1 and again.records == []


def test_slurm_without_slurm_is_one_line_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ckptbench.cli.main import app

    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))  # no sbatch, no srun
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(tiny_data(model=TWO_LAYERS, sweep=SMALL, measured_steps=1)))
    result = CliRunner().invoke(app, ["sweep", str(config), "--out", str(tmp_path / "run"), "--executor", "slurm"])
    assert result.exit_code == 2, (result.stderr, result.exception)
    assert result.stderr.splitlines() == [
        "error: --executor slurm: no Slurm here (sbatch is not on PATH); run the sweep from a Slurm login node, "
        "or use --executor local"
    ]
    assert not (tmp_path / "run").exists()


def test_a_plain_sweep_needs_no_submitit() -> None:
    """Only a fanned-out sweep imports submitit: a GPU machine without it still runs every other command."""
    code = (
        "import sys; sys.modules['submitit'] = None\n"  # 'import submitit' now raises ImportError
        "import ckptbench.sweep.sweep, ckptbench.search.tune_search, ckptbench.cli.main\n"
        "from ckptbench.processes.executors import LocalPool\n"
        "try:\n    LocalPool(folder=__import__('pathlib').Path('.'), gpus=[])\nexcept ImportError:\n    print('lazy')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "lazy", out.stderr
