"""Benchmark ckptbench itself: where a user waits for the tool rather than for the GPU (issue 24).

Measures, in one run so that every figure can be read as a ratio to the others on the same (possibly
busy) machine:

- ``estimate`` of the 66-point ``configs/llama7b.yaml`` and the 704-point
  ``configs/llama7b-estimate-grid.yaml`` as a user gets it (``estimate_points``, on every core), then in one
  process: the traces, the estimates, the allocator replay's share (the estimates with the replay minus
  without it), seconds per point, and the same estimates on the replay's pure-Python loop when the C one is built;
- each command's start-up: ``--help``, ``compare``, ``recommend`` and ``answers --measured-only`` (and whole, with its
  predictions) on committed runs, and
  ``estimate`` of ``configs/tiny.yaml`` (its whole command), each as a fresh process, next to a bare
  ``python -c pass`` and to the import of the torch-free package;
- a tiny CPU sweep (``configs/tiny.yaml``): its whole command over the time in its steps (run.json timing);
- ``compare`` of two synthetic runs of 1k / 5k / 20k points, and ``report --no-estimate`` of a 1k-point run;
- a calibration loop (fixed pure-Python work) so that two machines, or one machine at two loads, compare.

Writes ``results/tool-speed/<date>-<host>[-<tag>]/bench.json`` and ``bench.md`` with the machine's facts
(measure/environment.py's collector). Run from the repository root::

    PYTHONPATH=$PWD python scripts/bench_tool.py --tag before

``--before REV`` runs the whole-command comparison instead (scripts/bench_whole_commands.py): the thread's question
cold and asked again (the same card, another card, another precision), the 66-point estimate warm and the 704-point
estimate cold, as fresh processes with their own trace cache folders, this checkout and ``REV`` alternating.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # the synthetic runs are the tests' (tests/_synthetic_runs.py)
    sys.path.insert(0, str(ROOT))
from tests._synthetic_runs import COMMITTED_RUN, synthetic_run  # noqa: E402

PYTHON = sys.executable
AXES_RUN = ROOT / "results" / "h200-gpu-check-1" / "axes"


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "120"}


def timed_command(args: Sequence[str], *, repeat: int = 3, timeout_s: float | None = None) -> dict[str, Any]:
    """The best of ``repeat`` wall times of a fresh process (the best: noise only ever adds time); past
    ``timeout_s`` the command is stopped and recorded as not finished (``best_s`` None)."""
    times: list[float] = []
    for _ in range(repeat):
        start = time.perf_counter()
        try:
            done = subprocess.run([PYTHON, *args], cwd=ROOT, env=_env(), capture_output=True, text=True,
                                  check=False, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return {"command": " ".join(args), "best_s": None, "times_s": times, "timed_out_after_s": timeout_s}
        times.append(time.perf_counter() - start)
        if done.returncode not in (0, 3):
            raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    return {"command": " ".join(args), "best_s": min(times), "times_s": times}


def calibration_s() -> float:
    """Seconds of a fixed pure-Python workload (dict and list churn, like the replay's): the machine's unit."""
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        table: dict[int, int] = {}
        acc = 0
        for i in range(400_000):
            table[i & 4095] = i
            acc += table.get((i * 7) & 4095, 0) & 15
        best = min(best, time.perf_counter() - start)
    return best


def bench_estimate(config: str) -> dict[str, Any]:
    """One config's estimate as a user gets it (``estimate_points``: on every core), then taken apart in one
    process: the traces, the estimates, the allocator replay's share (the estimates with the card's replay
    minus the same estimates without a card), seconds per point."""
    from ckptbench.config.load import load_config
    from ckptbench.estimator import estimator as api
    from ckptbench.estimator.workers import worker_count

    cfg = load_config(ROOT / config)
    points = cfg.points_list()
    warm = load_config(ROOT / "configs" / "tiny.yaml")  # what a process pays once (lazy imports), paid before
    api.estimate_points(warm, warm.points_list()[:1], target="cuda", workers=1)
    start = time.perf_counter()
    estimates = api.estimate_points(cfg, points, target="cuda")
    total = time.perf_counter() - start
    est = api.Estimator(cfg, target="cuda", gpu=api.card(None))
    t0 = time.perf_counter()
    traces = est.run_traces(points, workers=1)
    traces_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    serial = est.estimate_each(points, workers=1)
    estimates_s = time.perf_counter() - t1
    bare = api.Estimator(cfg, target="cuda", gpu=None)  # the same traces, no card: nothing replayed
    for name in ("_costs", "_optim", "_full", "_traces", "_failed", "_classes"):
        setattr(bare, name, getattr(est, name))
    t2 = time.perf_counter()
    bare.estimate_each(points, workers=1)
    no_replay = time.perf_counter() - t2
    replay = max(estimates_s - no_replay, 0.0)
    one_process = traces_s + estimates_s
    from ckptbench.estimator import allocator

    loop = "c" if allocator.NATIVE is not None else "python"
    python_loop_s = None
    if allocator.NATIVE is not None:  # the same estimates on the pure-Python loop (no compiler; the device's runs)
        native, allocator.NATIVE = allocator.NATIVE, None
        try:
            t3 = time.perf_counter()
            same = est.estimate_each(points, workers=1) == serial
            python_loop_s = time.perf_counter() - t3
        finally:
            allocator.NATIVE = native
        if not same:
            raise RuntimeError(f"{config}: the C and the pure-Python replay loops disagree")
    return {
        "config": config, "points": len(points), "traces": traces, "workers": worker_count(None, traces),
        "total_s": total, "identical_in_one_process": serial == estimates,
        "one_process_s": one_process, "traces_s": traces_s, "estimates_s": estimates_s,
        "estimates_without_replay_s": no_replay, "replay_s": replay,
        "replay_share": replay / one_process if one_process else None, "per_point_s": total / len(points),
        "replay_loop": loop, "estimates_python_loop_s": python_loop_s,
        "ooms": sum(1 for e in estimates if e.reserved is not None and e.reserved.oom is not None),
    }


def _count_traces(cfg: Any, points: Sequence[Any]) -> int:
    from ckptbench.estimator import estimator as api

    return len(api.Estimator(cfg, target="cuda", gpu=None).jobs(points))


def startup() -> dict[str, Any]:
    """Each command's wall time as a fresh process (committed runs; the tiny config for estimate)."""
    run2, run1 = str(COMMITTED_RUN.relative_to(ROOT)), str(AXES_RUN.relative_to(ROOT))
    commands = {
        "python": ["-c", "pass"],
        "import ckptbench": ["-c", "import ckptbench"],
        "--help": ["-m", "ckptbench", "--help"],
        "compare": ["-m", "ckptbench", "compare", run2, run2],
        "recommend": ["-m", "ckptbench", "recommend", run2, "--budget", "80"],
        "answers": ["-m", "ckptbench", "answers", run2, run1, "--measured-only"],
        "answers with predictions": ["-m", "ckptbench", "answers", run2, run1],
        "estimate tiny": ["-m", "ckptbench", "estimate", "configs/tiny.yaml"],
        "estimate llama7b (66 points)": ["-m", "ckptbench", "estimate", "configs/llama7b.yaml"],
        "import torch": ["-c", "import torch"],
    }
    out = {name: timed_command(args) for name, args in commands.items()}
    for name in ("--help", "compare", "recommend", "answers"):
        probe = subprocess.run(
            [PYTHON, "-c", _TORCH_PROBE, *commands[name][2:]], cwd=ROOT, env=_env(), capture_output=True, text=True,
            check=False,
        )
        out[name]["imports_torch"] = probe.stdout.strip().splitlines()[-1:] == ["torch"]
    return out


# Runs the CLI in-process and says whether torch got imported (stdout's last line).
_TORCH_PROBE = """
import sys
from ckptbench.cli.main import app
try:
    app(sys.argv[1:], standalone_mode=False)
except BaseException:
    pass
sys.stdout.write("\\n" + ("torch" if "torch" in sys.modules else "no torch") + "\\n")
"""


def tiny_sweep(work: Path) -> dict[str, Any]:
    """The tiny CPU sweep's whole command over its steps (run.json timing)."""
    out = work / "tiny"
    start = time.perf_counter()
    subprocess.run([PYTHON, "-m", "ckptbench", "sweep", "configs/tiny.yaml", "--out", str(out)], cwd=ROOT,
                   env=_env(), capture_output=True, check=True)
    wall = time.perf_counter() - start
    timing = json.loads((out / "run.json").read_text())["timing"]
    keys = ("command_wall_s", "startup_s", "environment_s", "predictions_s", "steps_s", "point_overhead_s",
            "between_points_s", "finish_s")
    facts = {k: timing.get(k) for k in keys}
    steps = timing.get("steps_s")
    return {"wall_s": wall, **facts, "wall_over_steps": timing["command_wall_s"] / steps if steps else None}


def timed_with_cpu(args: Sequence[str], *, timeout_s: float) -> dict[str, Any]:
    """``timed_command`` once, with the process's CPU seconds (user + system) and the load at its start: on a
    busy 2-core machine the wall time grows with the load, the CPU time much less."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load = os.getloadavg()[0]
    out = timed_command(args, repeat=1, timeout_s=timeout_s)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    out["cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    out["load_1m"] = load
    return out


def bench_compare(work: Path, sizes: Sequence[int], *, timeout_s: float) -> dict[str, Any]:
    """``compare`` of two synthetic runs of each size (fresh process): JSON output (``str(n)``) and the default
    table (``f"{n} table"``, COLUMNS=120, what a user at a terminal waits for)."""
    out: dict[str, Any] = {}
    for n in sizes:
        base = synthetic_run(work / f"base-{n}", n)
        new = synthetic_run(work / f"new-{n}", n, scale=1.02)
        out[str(n)] = timed_with_cpu(["-m", "ckptbench", "compare", str(base), str(new), "--format", "json"],
                                     timeout_s=timeout_s)
        out[f"{n} table"] = timed_with_cpu(["-m", "ckptbench", "compare", str(base), str(new)], timeout_s=timeout_s)
    return out


def bench_report(work: Path, points: int, *, timeout_s: float) -> dict[str, Any]:
    """``report --no-estimate`` of a synthetic run (fresh process)."""
    run = synthetic_run(work / f"report-{points}", points)
    return timed_with_cpu(["-m", "ckptbench", "report", str(run), "--no-estimate", "--out", str(work / "rep")],
                          timeout_s=timeout_s)


def machine() -> dict[str, Any]:
    from ckptbench.measure.environment import collect

    return collect("cpu")


def markdown(result: dict[str, Any]) -> str:
    """A short summary of bench.json."""
    m, lines = result["machine"], []
    lines.append(f"# ckptbench tool speed: {result['created_at']} on {m['hostname']}")
    lines.append("")
    lines.append(f"{m['cpus_available']} CPUs available, load {m['load_average_1m']} at the start; "
                 f"python {m['python']}, torch {m['torch']}; git {m['git_sha']}; "
                 f"calibration unit {result['calibration_s']:.3f} s.")
    lines.append("")
    lines.append("| estimate | points | traces | total s | s/point | workers | one process s | traces s | replay s "
                 "| replay share | replay loop | estimates s, pure-Python loop |")
    lines.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |")
    for e in result.get("estimate", []):
        lines.append(f"| {e['config']} | {e['points']} | {e['traces']} | {e['total_s']:.1f} | {e['per_point_s']:.3f} "
                     f"| {e.get('workers', 1)} | {e.get('one_process_s', e['total_s']):.1f} | {e['traces_s']:.1f} "
                     f"| {e['replay_s']:.1f} | {e['replay_share']:.0%} | {e.get('replay_loop', 'python')} "
                     f"| {_maybe(e.get('estimates_python_loop_s'))} |")
    lines.append("")
    lines.append("| command (fresh process) | best s | x python | imports torch |")
    lines.append("| --- | ---: | ---: | --- |")
    base = result["startup"]["python"]["best_s"] if "startup" in result else None
    for name, s in result.get("startup", {}).items():
        lines.append(f"| {name} | {s['best_s']:.2f} | {s['best_s'] / base:.1f} | {s.get('imports_torch', '')} |")
    if "tiny_sweep" in result:
        t = result["tiny_sweep"]
        lines.append("")
        lines.append(f"tiny sweep: {t['command_wall_s']:.1f} s in all, {t['steps_s']:.1f} s of steps "
                     f"({t['wall_over_steps']:.2f}x the steps), start-up {t['startup_s']:.1f} s.")
    if "compare" in result:
        lines.append("")
        lines.append("compare (JSON, fresh process): " + ", ".join(
            f"{n} points {_secs(c)}" for n, c in result["compare"].items() if not n.endswith(" table")))
        tables = [(n.split()[0], c) for n, c in result["compare"].items() if n.endswith(" table")]
        if tables:
            lines.append("compare (table at 120 columns, fresh process): " + ", ".join(
                f"{n} points {_secs(c)}" for n, c in tables))
    if "report" in result:
        lines.append(f"report --no-estimate of {result['report_points']} points: {_secs(result['report'])}")
    return "\n".join(lines) + "\n"


def _maybe(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f}"


def _secs(timed: dict[str, Any]) -> str:
    best = timed.get("best_s")
    if best is None:
        return f"not finished in {timed['timed_out_after_s']:.0f} s"
    cpu = f" (cpu {timed['cpu_s']:.1f} s, load {timed['load_1m']:.1f})" if "cpu_s" in timed else ""
    return f"{best:.1f} s{cpu}"


def _step(name: str, fn: Callable[[], Any], timings: dict[str, float]) -> Any:
    print(f"bench: {name} ...", file=sys.stderr, flush=True)
    start = time.perf_counter()
    value = fn()
    timings[name] = time.perf_counter() - start
    print(f"bench: {name} done in {timings[name]:.1f} s", file=sys.stderr, flush=True)
    return value


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(a == "--before" or a.startswith("--before=") for a in argv):
        from scripts.bench_whole_commands import main as whole_commands

        whole_commands(argv)
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "tool-speed")
    parser.add_argument("--tag", default="", help="appended to the result folder's name (before, after)")
    parser.add_argument("--skip", action="append", default=[],
                        choices=["estimate", "grid", "startup", "sweep", "compare", "report"])
    parser.add_argument("--compare-sizes", default="1000,5000,20000")
    parser.add_argument("--report-points", type=int, default=1000)
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds after which compare/report are stopped")
    args = parser.parse_args(argv)
    now = dt.datetime.now(dt.timezone.utc)
    result: dict[str, Any] = {"created_at": now.isoformat(timespec="seconds"), "tag": args.tag}
    bench_s: dict[str, float] = {}
    result["machine"] = _step("machine", machine, bench_s)
    result["calibration_s"] = _step("calibration", calibration_s, bench_s)
    with tempfile.TemporaryDirectory(prefix="ckptbench-bench-") as tmp:
        work = Path(tmp)
        if "startup" not in args.skip:
            result["startup"] = _step("start-up", startup, bench_s)
        grids = (("configs/llama7b.yaml", "estimate"), ("configs/llama7b-estimate-grid.yaml", "grid"))
        configs = [c for c, skip in grids if skip not in args.skip]
        if configs:
            result["estimate"] = [
                _step(f"estimate {c}", functools.partial(bench_estimate, c), bench_s) for c in configs
            ]
        if "sweep" not in args.skip:
            result["tiny_sweep"] = _step("tiny sweep", lambda: tiny_sweep(work), bench_s)
        if "compare" not in args.skip:
            sizes = [int(s) for s in args.compare_sizes.split(",") if s]
            result["compare"] = _step("compare", lambda: bench_compare(work, sizes, timeout_s=args.timeout), bench_s)
        if "report" not in args.skip:
            result["report_points"] = args.report_points
            report = lambda: bench_report(work, args.report_points, timeout_s=args.timeout)  # noqa: E731
            result["report"] = _step("report", report, bench_s)
    result["bench_s"] = bench_s
    host = socket.gethostname().split(".")[0]
    folder = args.out / f"{now:%Y-%m-%d}-{host}{'-' + args.tag if args.tag else ''}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "bench.json").write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    (folder / "bench.md").write_text(markdown(result))
    print(folder / "bench.md")
    sys.stdout.write(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
