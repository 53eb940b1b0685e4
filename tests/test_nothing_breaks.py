"""issue 35 ("Nothing breaks it", round 4): the cases its other tests do not hold. A model's config.json that is a
FIFO, a device or huge; model fields transformers rejects, refused by every command before any work (in a sweep
config, a config.json, a damaged run's run.json); values a config.json cannot mean (NaN, a negative rope factor, an
integer of thousands of digits); advise's attention for Gemma-2, its "measure to know" recipe and a batch beyond
count; cpu_threads a host cannot run; a signal while the command's modules are imported, and one ignored from the
start (nohup)."""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from ckptbench.cli.main import app
from ckptbench.results.store import RUN_FILE
from tests._cli import invoke
from tests.conftest import MINI

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures"
# A config.json of a small LLaMA: its own fields, as a checkpoint's file holds them.
CONFIG_JSON: dict[str, Any] = {
    "model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
    "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 64, "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
}


def only_line(result: Any) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and not result.stdout.strip(), result.output
    return lines[0]


def bounded(args: list[str], *, code: str | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m ckptbench ARGS`` (or ``python -c CODE``) in 2 GiB of address space and 30 s: an unbounded or
    blocked read fails the test instead of taking the machine with it."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 * 2**30, 2 * 2**30))
        for sig in (signal.SIGINT, signal.SIGHUP):  # as a terminal starts it, whatever started the tests
            signal.signal(sig, signal.SIG_DFL)

    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    command = [sys.executable, "-c", code] if code is not None else [sys.executable, "-m", "ckptbench", *args]
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=30, preexec_fn=limit, env=env,
                              check=False)
    except subprocess.TimeoutExpired:
        pytest.fail(f"ckptbench {' '.join(args)} ran past 30 s (an unbounded read or a blocked one)")


def sweep_config(tmp_path: Path, model: dict[str, Any]) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({**MINI, "model": model}))  # 1e308 as YAML reads a float: 1.0e+308
    return path


def every_command(config: Path, tmp_path: Path) -> dict[str, list[str]]:
    """Each command that takes a sweep config, with what it needs to start (its output somewhere new)."""
    return {
        "layouts": ["layouts", str(config)],
        "estimate": ["estimate", str(config)],
        "sweep": ["sweep", str(config), "--out", str(tmp_path / "out-sweep"), "--no-predict"],
        "tune": ["tune", str(config), "--budget", "1", "--out", str(tmp_path / "out-tune")],
        "trace-allocator": ["trace-allocator", str(config), "--out", str(tmp_path / "out-trace")],
    }


# --- a model's config.json is read with bounds -------------------------------------------------------------------


@pytest.mark.parametrize(("command", "kind"), [
    ("layouts", "fifo"), ("layouts", "dev-zero"), ("layouts", "huge"), ("estimate", "fifo"), ("sweep", "dev-zero"),
    ("tune", "fifo"), ("advise", "fifo"), ("advise", "dev-zero"),
])
def test_a_model_config_json_that_is_no_regular_file_or_huge_is_refused_at_once(
    tmp_path: Path, command: str, kind: str
) -> None:
    """`model: {config: /dev/zero}` took 23.7 GB in 22 s (a MemoryError traceback under a limit); a FIFO blocked
    layouts, estimate and sweep forever."""
    where = {"fifo": tmp_path / "fifo.json", "dev-zero": Path("/dev/zero"), "huge": tmp_path / "huge.json"}[kind]
    if kind == "fifo":
        os.mkfifo(where)
    elif kind == "huge":
        with open(where, "wb") as fh:
            fh.truncate(2 * 2**30)  # sparse: no disk used
    config = sweep_config(tmp_path, {"config": str(where)})
    args = (["advise", "--model", str(where), "--gpu", "h100-80gb"] if command == "advise"
            else every_command(config, tmp_path)[command])
    done = bounded(args)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr[-2000:]
    said = {"fifo": "is a FIFO (named pipe), not a config.json; give a regular file",
            "dev-zero": "is a character device, not a config.json; give a regular file",
            "huge": "larger than 4 MiB, too large for a config.json"}[kind]
    lead = f"error: --model: {where}: " if command == "advise" else f"error: {config}: model.config: {where}: "
    assert lines[0] == lead + said
    assert not any(tmp_path.glob("out-*"))


def test_a_folder_whose_config_json_is_a_fifo_is_named_as_such(tmp_path: Path) -> None:
    """It was called 'a folder without a config.json'."""
    os.mkfifo(tmp_path / "config.json")
    done = bounded(["advise", "--model", str(tmp_path), "--gpu", "h100-80gb"])
    assert (done.returncode, done.stderr) == (2, f"error: --model: {tmp_path}/config.json: is a FIFO (named pipe), "
                                                 "not a config.json; give a regular file\n")


# --- model fields transformers rejects: refused by every command, before any work --------------------------------


REJECTED = [
    ("tiny", {"tie_word_embeddings": "yes"}, "tie_word_embeddings: must be true or false"),
    ("tiny", {"tie_word_embeddings": 2}, "tie_word_embeddings: must be true or false"),
    ("tiny", {"tie_word_embeddings": None}, "tie_word_embeddings: must be true or false"),
    ("tiny", {"attention_bias": "x"}, "attention_bias: must be true or false"),
    ("tiny", {"rms_norm_eps": 0}, "rms_norm_eps: must be positive (got 0)"),
    ("tiny-mistral", {"sliding_window": 16.5}, "sliding_window: must be an integer or null"),
    ("tiny", {"rope_parameters": "junk"}, "rope_parameters: must be a mapping or null"),
    ("tiny", {"rope_parameters": {"rope_type": "default", "rope_theta": "x"}},
     "rope_parameters.rope_theta: must be a positive number"),
    ("tiny", {"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": -1.0}},
     "rope_parameters.factor: must be at least 1"),
    ("tiny", {"initializer_range": 1e308}, "initializer_range: must be from 0 to 1 (got 1e+308)"),
    ("tiny-phi3", {"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4, "short_factor": "junk",
                                       "long_factor": [1.0]}}, "rope_parameters.short_factor: must be a list"),
]
REJECTED_IDS = ["tie-yes", "tie-2", "tie-null", "bias", "eps-0", "window", "rope-junk", "theta", "factor", "init",
                "longrope"]


@pytest.mark.parametrize(("preset", "fields", "says"), REJECTED, ids=REJECTED_IDS)
def test_model_fields_transformers_rejects_are_refused_by_every_command(
    tmp_path: Path, preset: str, fields: dict[str, Any], says: str
) -> None:
    """estimate exited 1 with chained tracebacks, layouts accepted them, only sweep refused them in one line."""
    config = sweep_config(tmp_path, {"preset": preset, "overrides": {**MINI["model"]["overrides"], **fields}})
    for command, args in every_command(config, tmp_path).items():
        result = invoke(args)
        assert result.exit_code == 2, (command, result.output)
        assert only_line(result).startswith(f"error: {config}: model.overrides.{says}"), (command, result.output)
    assert not any(tmp_path.glob("out-*"))  # refused before any work


@pytest.mark.parametrize(("fields", "says"), [
    ({"tie_word_embeddings": "yes"}, "tie_word_embeddings: must be true or false"),
    ({"rope_theta": float("nan")}, "rope_theta: must be a finite number (got nan)"),
    ({"rope_theta": float("inf")}, "rope_theta: must be a finite number (got inf)"),
    ({"rope_scaling": {"rope_type": "linear", "factor": -1.0}}, "rope_scaling.factor: must be at least 1"),
], ids=["tie", "nan", "infinity", "factor"])
def test_a_config_json_s_own_fields_are_refused_and_named_as_its_own(
    tmp_path: Path, fields: dict[str, Any], says: str
) -> None:
    """NaN and Infinity were accepted by layouts and estimate, and sweep blamed 'overrides' the user never wrote."""
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({**CONFIG_JSON, **fields}))  # NaN, Infinity as JSON
    config = sweep_config(tmp_path, {"config": "m/config.json"})
    for command, args in every_command(config, tmp_path).items():
        result = invoke(args)
        assert result.exit_code == 2, (command, result.output)
        assert only_line(result).startswith(f"error: {config}: model.config: {says}"), (command, result.output)
    result = invoke(["advise", "--model", str(tmp_path / "m" / "config.json"), "--gpu", "h100-80gb"])
    assert result.exit_code == 2 and only_line(result).startswith(f"error: --model: {tmp_path}/m/config.json: {says}")
    assert not any(tmp_path.glob("out-*"))


def test_a_damaged_run_json_s_model_fields_are_refused_before_the_estimate(tmp_path: Path) -> None:
    import shutil

    run = Path(shutil.copytree(FIXTURES / "runs" / "few", tmp_path / "run"))
    meta = json.loads((run / RUN_FILE).read_text())
    meta["config"]["model"].setdefault("overrides", {})["rms_norm_eps"] = 0
    (run / RUN_FILE).write_text(json.dumps(meta))
    result = invoke(["estimate", str(run)])
    assert result.exit_code == 2
    assert only_line(result) == f"error: {run}/run.json: model.overrides.rms_norm_eps: must be positive (got 0)"


def test_an_integer_of_thousands_of_digits_is_named_without_python_s_hint(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(json.dumps(MINI).replace('"num_hidden_layers": 1', '"num_hidden_layers": ' + "9" * 5000))
    result = invoke(["layouts", str(config)])
    assert result.exit_code == 2
    assert only_line(result) == (f"error: {config}: invalid YAML value: an integer of more than "
                                 f"{sys.get_int_max_str_digits():,} digits; no field takes a number that long")
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(CONFIG_JSON)[:-1] + ', "vocab_size": ' + "9" * 5000 + "}")
    result = invoke(["layouts", str(sweep_config(tmp_path, {"config": "m/config.json"}))])
    assert result.exit_code == 2 and "set_int_max_str_digits" not in result.output
    assert "m/config.json is not a config.json: it holds an integer of more than" in only_line(result)


# --- advise ------------------------------------------------------------------------------------------------------


def test_advise_answers_gemma_2_with_the_attention_its_code_needs() -> None:
    """A listed preset was refused: advise assumed sdpa, which Gemma-2's soft-capping cannot use."""
    from ckptbench.advise.request import AdviseRequest

    request = AdviseRequest(model="gemma-2-9b", gpu="h100-80gb").checked()
    assert request.attention == "eager"
    assert request.config().model.attn_implementation == "eager"
    assert AdviseRequest(model="llama-7b", gpu="h100-80gb").checked().attention == "sdpa"


@pytest.mark.parametrize("layers", [1, 2, 3, 8, 16, 32])
def test_the_measure_to_know_recipe_lists_layouts_a_sweep_of_the_model_accepts(layers: int) -> None:
    """It listed first:16 for every model: refused for 16 layers (the same as all) and beyond 16."""
    from ckptbench.advise.advice import _measure_command
    from ckptbench.advise.request import AdviseRequest
    from ckptbench.config.load import parse_config

    text = _measure_command(AdviseRequest(model="tiny", gpu="h100-80gb"), layers)
    found = re.search(r"layout: \[([^\]]*)\]", text)
    assert found is not None, text
    listed = found.group(1).split(", ")
    assert listed[:3] == ["none", "all", "every:2"][:len(listed[:3])] or layers == 1
    model = {"preset": "tiny", "overrides": {"num_hidden_layers": layers}}
    cfg = parse_config({**MINI, "model": model, "sweep": {**MINI["sweep"], "layout": listed}})  # not refused
    assert len(cfg.sweep.layout) == len(listed)
    assert f"first:{max(layers // 2, 1)}" in listed or layers <= 2


def test_advise_batch_beyond_what_can_be_counted_names_the_flag() -> None:
    """It showed pydantic's 'Value error,' and the sweep config's field names."""
    result = invoke(["advise", "--model", "llama-7b", "--gpu", "h100-80gb", "--batch", "1000000"])
    assert result.exit_code == 2
    line = only_line(result)
    assert line.startswith("error: --batch: at most 64,000 at --seq 2048 on llama-7b (got 1,000,000)"), line
    assert "Value error" not in line and "batch_size" not in line


# --- cpu_threads a host cannot run ----------------------------------------------------------------------------------


def test_cpu_threads_the_host_cannot_run_is_one_line_exit_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """cpu_threads: 1024 under a memory limit: a RuntimeError traceback from sweep/cpu_guard.py host_matmul_rate."""
    import torch

    def no_room(*_: Any, **__: Any) -> Any:
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
                           "memory: you tried to allocate 4194304 bytes. Error code 12 (Cannot allocate memory)")

    config = tmp_path / "c.yaml"
    config.write_text(json.dumps({**MINI, "cpu_threads": 1024}))
    before = torch.get_num_threads()
    monkeypatch.setattr(torch, "mm", no_room)  # what 1024 threads' stacks under `ulimit -v` leave
    result = invoke(["sweep", str(config), "--out", str(tmp_path / "run"), "--no-predict"])
    assert result.exit_code == 1
    assert only_line(result).startswith(
        "error: cpu_threads: 1024: this host cannot run torch with 1024 threads (DefaultCPUAllocator: can't allocate "
        "memory")
    assert "lower cpu_threads (this process may use" in only_line(result)
    assert torch.get_num_threads() == before and not (tmp_path / "run").exists()


def test_a_sweep_out_of_threads_is_one_line_exit_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same with --force: the progress bar's thread could not start (a RuntimeError traceback)."""
    from ckptbench.sweep import sweep

    def out_of_threads(*_: Any, **__: Any) -> Any:
        raise RuntimeError("can't start new thread")

    config = tmp_path / "c.yaml"
    config.write_text(json.dumps({**MINI, "cpu_threads": 1024}))
    monkeypatch.setattr(sweep, "run_sweep", out_of_threads)
    result = invoke(["sweep", str(config), "--out", str(tmp_path / "run"), "--no-predict", "--force"])
    assert result.exit_code == 1
    assert only_line(result) == (f"error: {config}: the sweep stopped: this process could not start one more thread; "
                                 "the points recorded so far stay on disk (fewer cpu_threads, or more memory, lets "
                                 "it run)")


# --- signals ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("sig", "code", "said"), [
    ("SIGINT", 130, "Ctrl-C (SIGINT)"), ("SIGTERM", 143, "SIGTERM"), ("SIGHUP", 143, "SIGHUP"),
])
def test_a_signal_while_the_command_s_modules_are_imported_is_its_one_line(sig: str, code: int, said: str) -> None:
    """A Ctrl-C in the first few tenths of a second printed a KeyboardInterrupt traceback; SIGTERM and SIGHUP ended
    the process silently (143, 129). The signal comes after ckptbench.cli is imported, before the command's
    modules are: as `ckptbench compare ...` started from a shell."""
    code_text = ("import os, signal, sys\nsys.argv = ['ckptbench', 'compare', 'a', 'b']\nimport ckptbench.cli\n"
                 f"os.kill(os.getpid(), signal.{sig})\nfrom ckptbench.cli.main import main\nmain()\n")
    done = bounded([], code=code_text)
    assert (done.returncode, done.stderr) == (
        code, f"interrupted: ckptbench compare stopped by {said}; no file was left half-written\n")


def test_a_process_forked_by_a_command_takes_the_stop_signals_in_the_kernel() -> None:
    """An estimate's worker inherited the command's Python handler, which runs only between bytecodes: a worker in a
    long C call never ran it, and the pool's terminate() waited on it (a SIGTERM that did not stop the estimate)."""
    from ckptbench.cli.common import STOP_SIGNALS, CommandSignals

    with CommandSignals():
        pid = os.fork()
        if pid == 0:  # the child: exit 0 when each stop signal has its default action
            os._exit(0 if all(signal.getsignal(s) == signal.SIG_DFL for s in STOP_SIGNALS) else 1)
        _, status = os.waitpid(pid, 0)
        assert all(signal.getsignal(s) != signal.SIG_DFL for s in STOP_SIGNALS)  # this process: the command's
    assert os.waitstatus_to_exitcode(status) == 0


def test_the_early_hold_gives_its_signals_back_and_is_never_inherited() -> None:
    """A worker the pool forked after the command had ended kept the early hold's handler: it noted SIGTERM and went
    on, and the process's exit waited on it for ever."""
    from ckptbench.cli import HeldSignals
    from ckptbench.cli.common import CommandSignals

    with CommandSignals():
        pass  # the fork hook is registered in this process from now on
    held = HeldSignals()
    held.original[signal.SIGTERM] = signal.signal(signal.SIGTERM, held)
    try:
        pid = os.fork()
        if pid == 0:
            os._exit(0 if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL else 1)
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
        with CommandSignals():
            pass
        assert signal.getsignal(signal.SIGTERM) == held.original[signal.SIGTERM]  # not the hold
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def test_a_program_that_imports_ckptbench_keeps_its_own_handlers() -> None:
    code_text = ("import signal\nbefore = [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)]"
                 "\nimport ckptbench.cli.main\n"
                 "assert [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)] == before\n")
    done = bounded([], code=code_text)
    assert done.returncode == 0, done.stderr


def test_a_signal_ignored_from_the_start_stays_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    """`nohup ckptbench sweep ...`: SIGHUP, ignored by nohup, stopped the command when the terminal closed."""
    from ckptbench.analysis import compare
    from ckptbench.cli.runs import Interrupts
    from ckptbench.errors import ConfigError

    def hung_up(*_: Any, **__: Any) -> None:
        os.kill(os.getpid(), signal.SIGHUP)  # the terminal closes: nothing happens
        raise ConfigError("the command went on")

    monkeypatch.setattr(compare, "compare_refs", hung_up)
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        result = CliRunner().invoke(app, ["compare", "a", "b"])
        assert (result.exit_code, result.stderr) == (2, "error: the command went on\n")
        with Interrupts():  # a sweep's handlers
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)
