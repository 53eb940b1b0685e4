"""ckptbench's own speed, measured as a user waits: whole commands (interpreter start and imports included), run as
subprocesses, before and after a change, interleaved on the same machine.

    python scripts/bench_whole_commands.py --before <git-rev> [--repeats 3] [--out results/tool-speed/<name>]

The "before" code is a ``git worktree`` of the revision (the same virtual environment: torch, transformers and the
built C part are shared; the worktree's own C part is built when it has one). Each case runs ``--repeats`` times;
the two versions alternate run by run, so that a change in the machine's load touches both alike. A "cold" case
runs with an empty trace cache (a new folder per run), a "warm" one after a run that filled it (what a person who
asks again waits for). The code before the trace cache has no cache: each of its runs is cold, whatever the case.

Bytecode: a user's ``pip install`` compiles every module once; on a machine that sets PYTHONDONTWRITEBYTECODE
(this one does) every import would compile from source again. The script unsets it for the commands and runs each
command once, untimed, to leave the bytecode in place before timing.

Writes ``tool_speed.json`` (every run's seconds, the machine, the load average before and after) and ``README.md``
(the table: median and range per case and version) under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
THREAD = ["advise", "--model", "llama-7b", "--gpu", "a100-80gb", "--batch", "2", "8", "--seq", "2048"]


@dataclass(frozen=True)
class Case:
    name: str
    args: list[str]
    prime: list[str] | None  # run first (untimed) with the same cache folder: None means a cold cache
    code: str | None = None  # a Python program run instead of ckptbench (the machine's reference)


# The machine's reference, the same program for both versions: the import issue 38 quotes (3.1 s on the machine its
# bars were set on), which no cold command can be faster than. Read the other figures against it: the machine of
# results/tool-speed/2026-12-06-session11 took 3.2 s for it there, 3.2 to 3.7 s that session hour by hour (the
# earlier sessions' machines were faster at imports). The process ends without the interpreter's teardown, as
# ckptbench's commands do (cli/process_end.py): with torch loaded the teardown alone took about a second.
IMPORT_FLOOR = "import os, torch\nfrom transformers import LlamaForCausalLM\nLlamaForCausalLM.__init__\nos._exit(0)"

CASES = [
    Case("reference: python -c 'import torch; from transformers import LlamaForCausalLM'", [], None, IMPORT_FLOOR),
    Case("thread question, cold cache", THREAD, None),
    Case("thread question again, same card", THREAD, THREAD),
    Case("thread question again, another headroom (10%)", [*THREAD, "--headroom", "10%"], THREAD),
    Case("thread question again, another card (a100-40gb)", [*THREAD[:4], "a100-40gb", *THREAD[5:]], THREAD),
    # Hopper's cuBLAS workspace is not Ampere's: the traces are the same (the workspaces are added after), the
    # largest batch's probes may differ (another limit).
    Case("thread question again, another card (h100-80gb)", [*THREAD[:4], "h100-80gb", *THREAD[5:]], THREAD),
    Case("thread question again, amp_bf16", [*THREAD, "--precision", "amp_bf16"], THREAD),
    Case("estimate configs/llama7b.yaml (66 points), warm", ["estimate", "configs/llama7b.yaml"],
         ["estimate", "configs/llama7b.yaml"]),
    Case("estimate configs/llama7b-estimate-grid.yaml (704 points), cold",
         ["estimate", "configs/llama7b-estimate-grid.yaml"], None),
]


def _load() -> float:
    return os.getloadavg()[0]


def _env(tree: Path, cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update({"PYTHONPATH": str(tree), "CKPTBENCH_CACHE_DIR": str(cache), "COLUMNS": "100"})
    return env


def _run(tree: Path, args: list[str], cache: Path, code: str | None = None) -> float:
    command = [sys.executable, "-c", code] if code is not None else [sys.executable, "-m", "ckptbench", *args]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=tree, env=_env(tree, cache), stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{tree}: {' '.join(command[1:])} exited {done.returncode}: {done.stderr[-2000:]}")
    return seconds


def _worktree(rev: str, where: Path) -> Path:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(where), rev], check=True,
                   capture_output=True)
    if (where / "setup.py").exists():  # the C part of the allocator replay, as the checkout has it
        subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace", "-q"], cwd=where, check=True,
                       capture_output=True)
    return where


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="the git revision to compare with (e.g. HEAD~1)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path,
                        default=ROOT / "results" / "tool-speed" / time.strftime("%Y-%m-%d-whole-commands"))
    parser.add_argument("--only", nargs="*", help="case names containing any of these words")
    opts = parser.parse_args(argv)
    cases = [c for c in CASES if not opts.only or any(w in c.name for w in opts.only)]
    scratch = Path(tempfile.mkdtemp(prefix="bench-tool-"))
    before_sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", opts.before], check=True, capture_output=True,
                                text=True).stdout.strip()
    after_sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], check=True, capture_output=True,
                               text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True).stdout.strip())
    trees = {"before": _worktree(before_sha, scratch / "before"), "after": ROOT}
    load_before = _load()
    runs: dict[str, dict[str, list[float]]] = {c.name: {"before": [], "after": []} for c in cases}
    try:
        for tree in trees.values():  # bytecode in place, untimed
            _run(tree, ["gpus"], scratch / "warm-up-cache")
        for case in cases:
            for i in range(opts.repeats):
                for version, tree in trees.items():
                    cache = scratch / f"cache-{version}-{case.name.split()[0]}-{i}"
                    if case.prime is not None and (tree / "ckptbench" / "estimator" / "trace_cache.py").exists():
                        _run(tree, case.prime, cache)  # code without the trace cache keeps nothing to prime
                    runs[case.name][version].append(_run(tree, case.args, cache, case.code))
                    shutil.rmtree(cache, ignore_errors=True)
                print(f"{case.name}: " + ", ".join(f"{v} {runs[case.name][v][-1]:.2f} s" for v in trees), flush=True)
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(trees["before"])],
                       capture_output=True)
        shutil.rmtree(scratch, ignore_errors=True)
    load_after = _load()
    meta = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}",
        "python": platform.python_version(), "before": before_sha, "after": after_sha,
        "after_has_uncommitted_changes": dirty,
        "load_average_1min": {"before": load_before, "after": load_after}, "repeats": opts.repeats,
        "written": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
    opts.out.mkdir(parents=True, exist_ok=True)
    (opts.out / "tool_speed.json").write_text(json.dumps({"meta": meta, "seconds": runs}, indent=1) + "\n")
    lines = [
        "# ckptbench's own speed: whole commands, as a user waits",
        "",
        f"Written by `python scripts/bench_whole_commands.py --before {opts.before}` on {meta['written']}: "
        f"{meta['machine']}, Python {meta['python']}; before = `{before_sha[:10]}`, after = `{after_sha[:10]}`"
        f"{' with uncommitted changes' if dirty else ''}. Each case ran {opts.repeats} times per version, the two "
        "versions alternating; seconds of the whole command (interpreter, imports, work), median and range. "
        f"Load average (1 min): {load_before:.2f} before the runs, {load_after:.2f} after.",
        "",
        "| case | before (s) | after (s) | after / before |",
        "| --- | ---: | ---: | ---: |",
    ]
    for case in cases:
        b, a = runs[case.name]["before"], runs[case.name]["after"]
        lines.append(f"| {case.name} | {statistics.median(b):.2f} ({min(b):.2f}-{max(b):.2f}) | "
                     f"{statistics.median(a):.2f} ({min(a):.2f}-{max(a):.2f}) | "
                     f"{statistics.median(a) / statistics.median(b):.2f} |")
    (opts.out / "README.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
