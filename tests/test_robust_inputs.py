"""issue 22, robustness: what a user types, a damaged file or a full disk gives one clear line and a non-zero
exit, loses nothing and never runs unbounded."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ckptbench.cli.main import app
from ckptbench.results.store import POINTS_FILE, RUN_FILE

FIXTURES = Path(__file__).parent / "fixtures"


def invoke(args: list[str]) -> Any:
    """The command through typer's runner; a traceback is a failure of the test, not a result."""
    result = CliRunner().invoke(app, args)
    crashed = result.exception is not None and not isinstance(result.exception, SystemExit)
    assert not crashed, (args, repr(result.exception))
    assert "Traceback" not in result.output, result.output
    return result


def bounded_cli(args: list[str], *, timeout_s: float = 60, columns: str = "200") -> subprocess.CompletedProcess[str]:
    """``python -m ckptbench ARGS`` in a process of at most 2 GiB of address space and ``timeout_s``: an
    unbounded read fails the test (MemoryError or the timeout) instead of taking the machine with it."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 * 2**30, 2 * 2**30))

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1]), "COLUMNS": columns}
    try:
        return subprocess.run([sys.executable, "-m", "ckptbench", *args], capture_output=True, text=True,
                              timeout=timeout_s, preexec_fn=limit, env=env, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail(f"ckptbench {' '.join(args)} ran past {timeout_s:g} s (an unbounded read or a blocked one)")


def last_error(result: Any) -> str:
    """The one error line of a command that printed progress first: the last line, and the only error."""
    lines = result.output.strip().splitlines()
    assert [line for line in lines if line.startswith("error: ")] == lines[-1:], result.output
    return lines[-1]


def error_line(result: Any) -> str:
    """The one line a refused command prints."""
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


@pytest.fixture
def few_run(tmp_path: Path) -> Path:
    """A copy of a small committed run (two layouts, a few points) to write around."""
    return Path(shutil.copytree(FIXTURES / "runs" / "few", tmp_path / "run"))


# --- 1. no command writes over a run's own files -------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["answers", "{run}", "--out", "{run}/run.json"],
        ["answers", "{run}", "--out", "{run}/points.jsonl"],
        ["answers", "{run}", "--out", "{link}"],  # a link to points.jsonl
        ["answers", "{run}", "--readme", "{run}/run.json"],
        ["report", "{run}", "--out", "{run}/summary.md", "--no-estimate"],  # a folder would be made there
    ],
    ids=["answers-run.json", "answers-points", "answers-link", "answers-readme", "report-summary"],
)
def test_no_command_writes_over_a_run_s_own_files(few_run: Path, tmp_path: Path, args: list[str]) -> None:
    (tmp_path / "link.md").symlink_to(few_run / POINTS_FILE)
    before = {name: (few_run / name).read_bytes() for name in (RUN_FILE, POINTS_FILE)}
    result = invoke([a.format(run=few_run, link=tmp_path / "link.md") for a in args])
    assert result.exit_code == 2
    assert "never writes over a run's own files" in error_line(result)
    assert {name: (few_run / name).read_bytes() for name in before} == before
    assert sorted(p.name for p in few_run.iterdir()) == sorted(before)


# --- 2. bounded reads: never a FIFO, a device or a huge file ------------------------------------------------


@pytest.fixture
def odd_files(tmp_path: Path) -> dict[str, Path]:
    """A FIFO, a link to /dev/zero and a sparse file of 2 GiB (no disk used)."""
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    zero = tmp_path / "zero.yaml"
    zero.symlink_to("/dev/zero")
    huge = tmp_path / "huge.yaml"
    with open(huge, "wb") as fh:
        fh.truncate(2 * 2**30)
    return {"fifo": fifo, "zero": zero, "huge": huge, "dev-zero": Path("/dev/zero")}


# Each case is a process of its own (a failure must not take the machine with it): a few, not every pair.
@pytest.mark.parametrize(
    ("command", "kind"),
    [("sweep", "fifo"), ("sweep", "zero"), ("sweep", "huge"), ("sweep", "dev-zero"), ("layouts", "fifo"),
     ("layouts", "zero"), ("answers-readme", "fifo"), ("answers-readme", "dev-zero")],
)
def test_a_config_or_readme_that_is_no_regular_file_or_huge_is_refused_at_once(
    few_run: Path, odd_files: dict[str, Path], command: str, kind: str
) -> None:
    path = str(odd_files[kind])
    args = ["answers", str(few_run), "--readme", path] if command == "answers-readme" else [command, path]
    result = bounded_cli(args, timeout_s=30)
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}: "), result.stderr[-2000:]
    why = "larger than 16 MiB" if kind == "huge" else ("a FIFO" if kind == "fifo" else "a character device")
    assert why in lines[0]


@pytest.mark.parametrize(
    ("command", "kind"), [("compare", "fifo"), ("recommend", "zero"), ("report", "huge")]
)
def test_points_jsonl_that_is_no_regular_file_or_huge_is_refused_at_once(
    few_run: Path, odd_files: dict[str, Path], tmp_path: Path, command: str, kind: str
) -> None:
    points = few_run / POINTS_FILE
    points.unlink()
    if kind == "fifo":
        os.mkfifo(points)
    elif kind == "zero":
        points.symlink_to("/dev/zero")
    else:
        with open(points, "wb") as fh:
            fh.truncate(2 * 2**30 + 1)
    args = {
        "compare": ["compare", str(few_run), str(few_run)],
        "recommend": ["recommend", str(few_run), "--budget", "80"],
        "report": ["report", str(few_run), "--out", str(tmp_path / "report"), "--no-estimate"],
    }[command]
    result = bounded_cli(args, timeout_s=30)
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {points}: "), result.stderr[-2000:]


# --- 3. damaged values that reach a formatter anyway --------------------------------------------------------


def test_sizes_beyond_a_float_are_formatted_not_raised() -> None:
    from ckptbench.units import GIB_UNIT, MIB_UNIT, fmt_bytes

    assert (fmt_bytes(10**4000), GIB_UNIT(10**4000), MIB_UNIT(-(10**4000), signed=True)) == (
        "inf GiB", "inf GiB", "-inf MiB")
    assert GIB_UNIT.value(10**4000) == float("inf")


def test_json_nested_thousands_deep_costs_only_its_field() -> None:
    from ckptbench.results.json_text import TooDeep, loads_bounded, loads_object_fields

    deep = "[" * 5000 + "]" * 5000
    text = '{"a": 1, "deep": ' + deep + ', "s": "}],\\"", "n": null, "o": {"x": [1, {"y": 2}]}}'
    assert loads_object_fields(text) == ({"a": 1, "s": '}],"', "n": None, "o": {"x": [1, {"y": 2}]}}, ["deep"])
    assert loads_object_fields('{"a": ' + "[" * 70 + "]" * 70 + "}") == ({}, ["a"])  # deep, not recursing
    with pytest.raises(TooDeep):
        loads_bounded(deep)


# --- 4. a full disk ------------------------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs (root only: skipped elsewhere), unmounted afterwards."""
    where = tmp_path / "disk"
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)],
                             capture_output=True, check=False)
    if mounted.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(disk: Path, *, leave_bytes: int = 0) -> None:
    """Fill ``disk`` until ``leave_bytes`` (rounded to pages) are free."""
    with open(disk / "filler", "wb", buffering=0) as fh:
        try:
            while True:
                fh.write(bytes(4096))
        except OSError:
            pass
    if leave_bytes:
        with open(disk / "filler", "r+b") as fh:
            fh.truncate(max(0, (disk / "filler").stat().st_size - leave_bytes))


@pytest.fixture(scope="module")
def mini_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.conftest import MINI

    path = tmp_path_factory.mktemp("cfg") / "mini.yaml"
    path.write_text(json.dumps(MINI))
    return path


def test_a_full_disk_at_sweep_start_is_one_line_and_leaves_no_directory(small_disk: Path, mini_config: Path) -> None:
    fill(small_disk)
    result = invoke(["sweep", str(mini_config), "--out", str(small_disk / "run"), "--no-predict"])
    assert result.exit_code == 1
    assert "cannot start the run (No space left on device); nothing was run" in error_line(result)
    assert not (small_disk / "run").exists()


@pytest.mark.parametrize("free_kib", [4, 32, 60])
def test_a_disk_with_room_for_run_json_but_not_the_reserve_leaves_no_run(
    small_disk: Path, mini_config: Path, free_kib: int
) -> None:
    """issue 35: run.json fitted, the reserve did not; the run.json left behind said 'running' and a retry with the
    same --out was refused."""
    fill(small_disk, leave_bytes=free_kib * 1024)
    result = invoke(["sweep", str(mini_config), "--out", str(small_disk / "run"), "--no-predict"])
    assert result.exit_code == 1
    assert "cannot start the run (No space left on device); nothing was run" in error_line(result)
    assert not (small_disk / "run").exists()


def test_a_start_that_fails_after_run_json_takes_it_back(
    mini_config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same, simulated where no tmpfs can be mounted: the reserve cannot be written."""
    import errno

    from ckptbench.results import store

    def full(self: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store.RunWriter, "hold_reserve", full)
    out = tmp_path / "run"
    result = invoke(["sweep", str(mini_config), "--out", str(out), "--no-predict"])
    assert result.exit_code == 1
    assert error_line(result) == f"error: {out}: cannot start the run (No space left on device); nothing was run"
    assert not out.exists()  # a retry with the same --out is not refused as 'already holds a run'
    out.mkdir()
    (out / "mine.txt").write_text("kept")  # a folder that held something before: only the run's files go
    assert invoke(["sweep", str(mini_config), "--out", str(out), "--no-predict"]).exit_code == 1
    assert sorted(p.name for p in out.iterdir()) == ["mine.txt"]


def test_a_full_disk_on_resume_is_one_line_and_changes_nothing(
    mini_run: tuple[Path, Path], small_disk: Path
) -> None:
    config, pristine = mini_run
    run = Path(shutil.copytree(pristine, small_disk / "run"))
    lines = (run / POINTS_FILE).read_text().splitlines(keepends=True)
    (run / POINTS_FILE).write_text("".join(lines[:2]))  # two points left to run
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    fill(small_disk)
    result = invoke(["sweep", str(config), "--resume", str(run), "--no-predict"])
    assert result.exit_code == 1
    assert "cannot resume the run (No space left on device); nothing was run" in error_line(result)
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before


def test_a_disk_that_fills_during_the_sweep_ends_with_run_json_saying_failed(
    small_disk: Path, mini_config: Path
) -> None:
    fill(small_disk, leave_bytes=18 * 4096)  # run.json, the status reserve (16 pages) and a record or two
    result = invoke(["sweep", str(mini_config), "--out", str(small_disk / "run"), "--no-predict"])
    assert result.exit_code == 1
    assert "cannot write a point record (No space left on device)" in last_error(result)
    meta = json.loads((small_disk / "run" / RUN_FILE).read_text())
    assert meta["status"] == "failed"  # never left 'running'
    points = small_disk / "run" / POINTS_FILE
    assert len(points.read_text().splitlines() if points.exists() else []) < 4


@pytest.mark.parametrize("free_kib", [0, 40])
def test_a_report_on_a_full_disk_is_exit_1_and_leaves_only_whole_files(
    few_run: Path, small_disk: Path, free_kib: int
) -> None:
    """issue 35: a 0-byte or cut PNG, and exit 2 (bad input) for a full disk."""
    out = small_disk / "report"
    out.mkdir()
    fill(small_disk, leave_bytes=free_kib * 1024)
    result = invoke(["report", str(few_run), "--out", str(out), "--no-estimate"])
    assert result.exit_code == 1
    assert "cannot write the report (No space left on device); the files written are whole" in error_line(result)
    for path in out.iterdir():  # what is there is whole; no temporary file is left
        assert path.suffix == ".png" and not path.name.startswith("."), path.name
        data = path.read_bytes()
        assert data.startswith(b"\x89PNG") and data.endswith(b"IEND\xaeB`\x82"), path.name


def test_final_status_written_from_the_reserve_or_one_line(
    mini_config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Simulated (monkeypatched): the disk is full exactly when the final status is written."""
    import errno

    from ckptbench.results import store

    real = store.write_json_atomic

    def full_after_start(path: Path, data: Any) -> None:
        if data.get("status") != "running" and (path.parent / store.RESERVE_FILE).exists():
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, data)

    monkeypatch.setattr(store, "write_json_atomic", full_after_start)
    result = invoke(["sweep", str(mini_config), "--out", str(tmp_path / "run"), "--no-predict"])
    assert result.exit_code == 0, result.output  # the space held in reserve was enough
    assert json.loads((tmp_path / "run" / RUN_FILE).read_text())["status"] == "complete"
    assert not (tmp_path / "run" / store.RESERVE_FILE).exists()

    def always_full(path: Path, data: Any) -> None:
        if data.get("status") != "running":
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, data)

    monkeypatch.setattr(store, "write_json_atomic", always_full)
    result = invoke(["sweep", str(mini_config), "--out", str(tmp_path / "run2"), "--no-predict"])
    assert result.exit_code == 1
    line = last_error(result)
    assert "cannot write the run's final status" in line and "its 4 records are on disk" in line
    assert len((tmp_path / "run2" / POINTS_FILE).read_text().splitlines()) == 4


def test_a_summary_that_cannot_be_written_after_a_complete_run_is_exit_1(
    mini_config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    from ckptbench.render import summary

    def full(*_: Any, **__: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(summary, "write_summaries", full)
    result = invoke(["sweep", str(mini_config), "--out", str(tmp_path / "run"), "--no-predict"])
    assert result.exit_code == 1
    assert "cannot write the summary (No space left on device)" in last_error(result)
    assert json.loads((tmp_path / "run" / RUN_FILE).read_text())["status"] == "complete"


# --- 5. model overrides and sizes refused before anything runs ----------------------------------------------


def mini_with(tmp_path: Path, **changes: Any) -> Path:
    """MINI with top-level fields replaced; ``overrides`` (a dict) is merged into model.overrides."""
    from tests.conftest import MINI

    data = json.loads(json.dumps(MINI))
    data["model"]["overrides"].update(changes.pop("overrides", {}))
    data.update(changes)
    path = tmp_path / "cfg.yaml"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        ({"hidden_act": "nosuch"}, "model.overrides.hidden_act: not an activation transformers knows"),
        ({"hidden_act": "gelu_neww"}, "did you mean 'gelu_new'?"),
        ({"attention_dropout": 2.0}, "model.overrides.attention_dropout: must be from 0 to 1 (got 2.0)"),
        ({"pad_token_id": 1000}, "model.overrides.pad_token_id: pad_token_id (1000) must be a token of the vocab"),
        ({"pad_token_id": -1}, "model.overrides.pad_token_id: Input should be greater than or equal to 0"),
        ({"return_dict": False}, "model.overrides.return_dict: must be true"),
        ({"rope_parameters": {"rope_type": "nosuch", "rope_theta": 1e4}},
         "model.overrides.rope_parameters.rope_type: must be one of"),
    ],
    ids=["hidden-act", "hidden-act-hint", "dropout", "pad-beyond-vocab", "pad-negative", "return-dict", "rope"],
)
def test_model_overrides_transformers_rejects_are_refused_before_the_sweep(
    tmp_path: Path, overrides: dict[str, Any], says: str
) -> None:
    config = mini_with(tmp_path, overrides=overrides)
    result = invoke(["sweep", str(config), "--out", str(tmp_path / "run"), "--no-predict"])
    assert result.exit_code == 2
    assert says in error_line(result)
    assert not (tmp_path / "run").exists()


def test_the_activations_named_are_transformers_own() -> None:
    from transformers.activations import ACT2FN

    from ckptbench.config.model_fields import ACTIVATIONS

    assert set(ACTIVATIONS) <= set(ACT2FN)


@pytest.mark.parametrize("command", ["estimate", "sweep", "layouts"])
def test_sizes_whose_products_overflow_int64_are_refused(tmp_path: Path, command: str) -> None:
    config = mini_with(
        tmp_path, overrides={"vocab_size": 2**24, "max_position_embeddings": 2**24},
        sweep={"layout": ["none"], "batch_size": [2**20], "seq_len": [2**24], "precision": ["fp32"]},
    )
    out = ["--out", str(tmp_path / "run"), "--no-predict"] if command == "sweep" else []
    result = invoke([command, str(config), *out])
    assert result.exit_code == 2
    assert "sweep: a step of batch 1048576 x seq_len 16777216 x micro_batches 1" in error_line(result)
    assert "FLOPs overflow an int64" in error_line(result)


def test_the_largest_real_steps_are_not_refused(tmp_path: Path) -> None:
    """LLaMA-7B at batch 64 x 8192 x 16 micro-batches (8.4M tokens): well within the bound."""
    from ckptbench.config.load import parse_config

    cfg = parse_config({"name": "x", "model": {"preset": "llama-7b", "overrides": {"max_position_embeddings": 8192}},
                        "sweep": {"layout": ["all"], "batch_size": [64], "seq_len": [8192], "precision": ["bf16"],
                                  "micro_batches": [16]}})
    assert cfg.points_list()[0].tokens == 64 * 8192 * 16


def test_micro_batches_in_the_thousands_are_refused(tmp_path: Path) -> None:
    config = mini_with(tmp_path, sweep={"layout": ["none"], "batch_size": [1], "seq_len": [8],
                                        "precision": ["fp32"], "micro_batches": [5000]})
    result = invoke(["estimate", str(config)])
    assert result.exit_code == 2
    assert "sweep.micro_batches.0: Input should be less than or equal to 1024" in error_line(result)


# --- 6. unbounded work from allowed values -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lora", "targets", "says"),
    [
        (["r999999"], None, "sweep.lora: r999999: a LoRA rank above the width of q_proj (32)"),
        (["r16"], ["nosuch"], "lora.target_modules.0: 'nosuch' names no module of the model that LoRA can adapt"),
        (["r16"], ["q_projj"], "did you mean 'q_proj'?"),
        (["r16"], ["layers.1.mlp.up_proj"], "lora.target_modules.0: 'layers.1.mlp.up_proj' names no module"),
    ],
    ids=["rank-beyond-width", "no-such-module", "hint", "layer-beyond-model"],
)
def test_lora_ranks_and_targets_are_checked_against_the_model(
    tmp_path: Path, lora: list[str], targets: list[str] | None, says: str
) -> None:
    changes: dict[str, Any] = {"sweep": {"layout": ["none"], "batch_size": [1], "seq_len": [8], "precision": ["fp32"],
                                         "lora": lora}}
    if targets is not None:
        changes["lora"] = {"target_modules": targets}
    result = invoke(["sweep", str(mini_with(tmp_path, **changes)), "--out", str(tmp_path / "run")])
    assert result.exit_code == 2
    assert says in error_line(result)


@pytest.mark.parametrize("targets", [["q_proj", "v_proj"], ["self_attn.o_proj", "model.layers.0.mlp.down_proj"],
                                     ["lm_head"], ["layers.0.self_attn.k_proj"]])
def test_lora_targets_that_name_modules_of_the_model_are_accepted(targets: list[str]) -> None:
    from ckptbench.config.model import check_lora

    check_lora({"hidden_size": 32, "intermediate_size": 64, "vocab_size": 64, "num_hidden_layers": 1,
                "num_attention_heads": 2}, targets, [16, 32])


def test_batch_max_on_a_cpu_without_a_memory_cap_is_refused(tmp_path: Path) -> None:
    sweep = {"layout": ["none"], "batch_size": "max", "seq_len": [8], "precision": ["fp32"]}
    result = invoke(["sweep", str(mini_with(tmp_path, sweep=sweep)), "--out", str(tmp_path / "run")])
    assert result.exit_code == 2
    assert "sweep.batch_size: max on a CPU needs memory_cap_gib" in error_line(result)
    assert not (tmp_path / "run").exists()
    capped = mini_with(tmp_path, sweep=sweep, memory_cap_gib=0.01)
    assert invoke(["layouts", str(capped)]).exit_code == 0  # with a cap the search is bounded: accepted


def test_a_large_config_says_it_is_being_read_before_the_estimate_starts(tmp_path: Path) -> None:
    config = mini_with(tmp_path)
    config.write_text(config.read_text() + "\n" + ("# padding\n" * 120_000))  # 1.2 MB: as 20,000 points would be
    result = invoke(["estimate", str(config)])
    assert result.exit_code == 0, result.output
    first = result.stderr.splitlines()[0]
    assert first.startswith(f"reading the config {config} (1.1 MiB) and expanding its points"), result.stderr


# --- 7. names rendered as markup -----------------------------------------------------------------------------

MARKUP_NAMES = ["a[/]b", "[bold]x", "$\\frac{1}$"]


def named_run(tmp_path: Path, name: str, *, folder: str = "run") -> Path:
    """The few fixture run, named ``name`` in run.json and with it as model.overrides.architectures."""
    run = Path(shutil.copytree(FIXTURES / "runs" / "few", tmp_path / folder))
    meta = json.loads((run / RUN_FILE).read_text())
    meta["name"] = name
    meta["config"]["model"]["overrides"] = {"architectures": [name]}
    (run / RUN_FILE).write_text(json.dumps(meta))
    records = [json.loads(line) for line in (run / POINTS_FILE).read_text().splitlines()]
    for r in records:
        r["key"]["model"] = f"tiny+architectures=['{name}']"
    (run / POINTS_FILE).write_text("".join(json.dumps(r) + "\n" for r in records))
    return run


@pytest.mark.parametrize("name", MARKUP_NAMES, ids=["close-tag", "bold", "mathtext"])
def test_names_that_look_like_markup_are_shown_as_given(tmp_path: Path, name: str) -> None:
    run = named_run(tmp_path, name)
    result = invoke(["recommend", str(run), "--budget", "1"])
    assert result.exit_code == 0 and f"{name}: Under 1.00 GiB" in result.stdout  # neither a crash nor vanished
    result = invoke(["report", str(run), "--out", str(tmp_path / "report"), "--no-estimate"])
    assert result.exit_code == 0, result.output
    assert {p.name for p in (tmp_path / "report").iterdir()} >= {"report.md", "peak_memory.png", "tradeoff.png"}
    assert f"# ckptbench report: {name}" in (tmp_path / "report" / "report.md").read_text()
    # the model names differ: compare refuses without --allow-different (issue 22's gate)
    result = invoke(["compare", str(FIXTURES / "runs" / "few"), str(run), "--allow-different"])
    assert result.exit_code == 0 and f"added (only in run): none b=1 s=64 fp32 model=tiny+architectures=['{name}']" \
        in result.output


@pytest.mark.parametrize("name", MARKUP_NAMES, ids=["close-tag", "bold", "mathtext"])
def test_a_config_whose_overrides_look_like_markup_is_shown_as_given(tmp_path: Path, name: str) -> None:
    result = invoke(["layouts", str(mini_with(tmp_path, overrides={"architectures": [name]}))])
    assert result.exit_code == 0
    assert f"tiny+architectures={[name]}" in result.stdout.replace("\n", "")  # the list as Python writes it


def test_a_run_directory_whose_name_is_not_utf8_is_reported_whole(tmp_path: Path) -> None:
    folder = os.fsdecode(b"run-\xff")
    run = Path(shutil.copytree(FIXTURES / "runs" / "few", tmp_path / folder))
    meta = json.loads((run / RUN_FILE).read_text())
    del meta["name"]  # the title is the folder's name
    (run / RUN_FILE).write_text(json.dumps(meta))
    result = invoke(["report", str(run), "--out", str(tmp_path / "report"), "--no-estimate"])
    assert result.exit_code == 0, result.output
    assert "# ckptbench report: run-\ufffd" in (tmp_path / "report" / "report.md").read_text()
    assert invoke(["compare", str(run), str(run)]).exit_code == 0


def test_an_unknown_field_whose_name_holds_a_bracket_is_named(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text('name: x\nmodel: {preset: tiny}\n"lay[out]": [none]\n')
    assert error_line(invoke(["layouts", str(config)])) == f"error: {config}: unknown field 'lay[out]'"
    config.write_text('name: x\nmodel: {preset: tiny}\nsweep: {"seq[len": [8]}\n')
    assert error_line(invoke(["layouts", str(config)])) == (
        f"error: {config}: unknown field 'sweep.seq[len'; did you mean 'seq_len'?")


# --- 8. tune and sweep runs are not mixed --------------------------------------------------------------------


def test_an_interrupted_tune_names_tune_to_finish_it(
    mini_config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ckptbench.sweep import tune_run as tuning
    from ckptbench.sweep.sweep import SweepInterrupted

    run = Path(shutil.copytree(FIXTURES / "runs" / "few", tmp_path / "run"))

    def stopped(*_: Any, **__: Any) -> None:
        raise SweepInterrupted(run, finished=3, total=0)  # tune's search has no total known in advance

    monkeypatch.setattr(tuning, "run_tune", stopped)
    result = invoke(["tune", str(mini_config), "--budget", "1", "--allow", "lora"])
    assert result.exit_code == 130
    assert result.stderr.strip().splitlines()[-1] == (
        f"interrupted: 3 points are on disk in {run}; finish with: ckptbench tune {mini_config} --budget 1 "
        f"--headroom 5% --allow lora --resume {run}")


def test_each_run_records_the_command_that_wrote_it(mini_run: tuple[Path, Path]) -> None:
    from tests.conftest import quiet_load

    _, run = mini_run
    assert json.loads((run / RUN_FILE).read_text())["command"] == "sweep"
    assert quiet_load(run).command == "sweep"


@pytest.mark.parametrize(
    ("meta", "command"),
    [({}, "sweep"), ({"tune": {"budget_bytes": 1}}, "tune"), ({"command": "tune"}, "tune"),
     ({"command": "sweep"}, "sweep"), ({"command": 5}, "sweep")],
    ids=["old-sweep", "old-tune", "tune", "sweep", "damaged"],
)
def test_runs_without_the_field_infer_their_command(tmp_path: Path, meta: dict[str, Any], command: str) -> None:
    from ckptbench.results.meta import checked_meta
    from ckptbench.results.store import Run

    typed, _ = checked_meta({"schema_version": 1, **meta}, source="run.json")  # a damaged field is dropped
    assert Run(path=tmp_path, meta=typed, points=[]).command == command


def test_resume_refuses_a_run_of_the_other_command(mini_run: tuple[Path, Path], tmp_path: Path) -> None:
    config, pristine = mini_run
    sweep_run = Path(shutil.copytree(pristine, tmp_path / "sweep-run"))
    before = (sweep_run / POINTS_FILE).read_bytes()
    result = invoke(["tune", str(config), "--budget", "1", "--resume", str(sweep_run)])
    assert result.exit_code == 2
    assert error_line(result) == (
        f"error: --resume {sweep_run}: written by ckptbench sweep, not tune; continue it with ckptbench sweep "
        f"CONFIG --resume {sweep_run}, or start a new run")
    tune_run = Path(shutil.copytree(pristine, tmp_path / "tune-run"))
    meta = json.loads((tune_run / RUN_FILE).read_text())
    (tune_run / RUN_FILE).write_text(json.dumps({**meta, "command": "tune"}))
    result = invoke(["sweep", str(config), "--resume", str(tune_run), "--no-predict"])
    assert result.exit_code == 2
    assert "written by ckptbench tune, not sweep; continue it with ckptbench tune CONFIG" in error_line(result)
    assert (sweep_run / POINTS_FILE).read_bytes() == before == (tune_run / POINTS_FILE).read_bytes()


# --- 9. Ctrl-C, COLUMNS=0, a killed --isolate sweep, tune's paths ----------------------------------------------


# Ctrl-C to a local-executor sweep (one line, no traceback, its jobs end with it): one interrupted
# fanned-out sweep serves this and --resume, in tests/test_cluster.py::test_ctrl_c_cancels_the_jobs_and_resume_...


def _points(run: Path) -> list[str]:
    return (run / POINTS_FILE).read_text().splitlines() if (run / POINTS_FILE).exists() else []


@pytest.mark.parametrize("columns", ["0", "-1", "abc"])
def test_a_columns_that_is_no_positive_width_does_not_silence_errors(tmp_path: Path, columns: str) -> None:
    """A process of its own: the consoles read COLUMNS when they are made, at import."""
    result = bounded_cli(["sweep", str(tmp_path / "missing.yaml")], columns=columns)
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: {tmp_path / 'missing.yaml'}: no such config file"
    result = bounded_cli(["layouts", str(mini_with(tmp_path))], columns=columns)
    assert result.returncode == 0 and "decoder layers" in result.stdout


@pytest.mark.slow
def test_the_folders_of_a_killed_isolate_sweep_are_removed_at_once_or_by_the_next(
    mini_config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:

    from ckptbench.config.load import load_config
    from ckptbench.sweep.sweep import run_sweep

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1]), "TMPDIR": str(tmp), "OMP_NUM_THREADS": "1",
           # the first point hangs: its folder stays while it runs (no point before it need start a process)
           "CKPTBENCH_TEST_HANG": "layout=none;batch_size=1", "CKPTBENCH_ENABLE_TEST_HOOKS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "ckptbench", "sweep", str(mini_config), "--out",
                             str(tmp_path / "killed"), "--no-predict", "--isolate"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    # The point's folder is made before its process starts, the fork server's (which forks that process) right
    # after: killed between the two, the sweep would leave only the first. Both are there while the point hangs.
    while time.monotonic() < deadline and not (list(tmp.glob("ckptbench-point-*"))
                                               and list(tmp.glob("ckptbench-forkserver-*"))):
        time.sleep(0.1)
    alive = tmp / f"ckptbench-point-{os.getpid()}-mine"  # a live process's folder is never touched
    alive.mkdir()
    left = [*tmp.glob(f"ckptbench-point-{proc.pid}-*"), *tmp.glob(f"ckptbench-forkserver-{proc.pid}-*")]
    assert len(left) == 2, left
    proc.kill()  # SIGKILL runs no cleanup in the sweep
    proc.wait()
    # issue 35: the fork server and the point's process notice that the sweep is gone and take its folders with
    # them, without waiting for the next sweep (they stayed until then)
    deadline = time.monotonic() + 30
    while any(p.exists() for p in left) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(p.exists() for p in left) and alive.exists()
    # what a process killed with it could not remove, the next sweep does
    stale = tmp / f"ckptbench-point-{proc.pid}-stale"
    stale.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    run_sweep(load_config(mini_config), out=tmp_path / "next", predict=False)
    assert not stale.exists() and alive.exists()


def test_tune_refuses_an_unwritable_out_before_estimating(mini_config: Path, tmp_path: Path) -> None:
    # A short folder: the message shortens a path over 80 characters (pytest-xdist's tmp_path can be longer).
    short = Path(tempfile.mkdtemp(prefix="ckpt-"))
    blocker = short / "file"
    blocker.write_text("")
    start = time.monotonic()
    result = invoke(["tune", str(mini_config), "--budget", "1", "--out", str(blocker / "run")])
    assert result.exit_code == 2
    assert error_line(result) == f"error: --out {blocker / 'run'}: {blocker} exists and is not a directory"
    assert "estimate" not in result.output and time.monotonic() - start < 10
    shutil.rmtree(short)


# --- 10. a terminal that is not UTF-8 (issue 35) -------------------------------------------------------------------


def _ascii_cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    inherited = {k: v for k, v in os.environ.items() if k not in ("PYTHONUTF8", "PYTHONIOENCODING", "LANG", "LC_ALL")}
    full = {**inherited, "PYTHONPATH": str(Path(__file__).parents[1]), "COLUMNS": "100", **env}
    return subprocess.run([sys.executable, "-m", "ckptbench", *args], capture_output=True, timeout=300, env=full,
                          check=False)


def test_a_sweep_on_an_ascii_terminal_completes_without_a_traceback(mini_config: Path, tmp_path: Path) -> None:
    """It exited 1 with a UnicodeEncodeError traceback after its run had completed ('±' in the summary)."""
    done = _ascii_cli(["sweep", str(mini_config), "--out", str(tmp_path / "run"), "--no-predict"],
                      {"PYTHONIOENCODING": "ascii"})
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    out = done.stdout.decode("ascii")  # every byte is ASCII
    assert "+/- ms" in out or "+/- ms" in done.stderr.decode("ascii")  # said in ASCII, not dropped
    assert b"Traceback" not in done.stderr
    assert json.loads((tmp_path / "run" / RUN_FILE).read_text())["status"] == "complete"


def test_compare_and_an_undecodable_name_on_a_c_locale_terminal(tmp_path: Path) -> None:
    run = Path(shutil.copytree(FIXTURES / "runs" / "few", tmp_path / os.fsdecode(b"run-\xff")))
    done = _ascii_cli(["compare", str(run), str(run), "--fail-memory", "1"],
                      {"LANG": "C", "LC_ALL": "C", "PYTHONUTF8": "0"})
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
    assert b"Traceback" not in done.stderr
    assert b"ckptbench compare: run-? -> run-?" in done.stdout  # U+FFFD (results/store.py shown_name), in ASCII
