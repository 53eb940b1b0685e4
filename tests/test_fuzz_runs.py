"""Property-based: a run directory damaged at random goes through every reading command (compare,
recommend, report, estimate RUN, sweep --resume) without a traceback, and loses no valid record."""

from __future__ import annotations

import json
import tempfile
import warnings
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from typer.testing import CliRunner

from ckptbench.cli.main import app
from ckptbench.errors import ResultsError
from ckptbench.results.record import PointRecord
from ckptbench.results.store import POINTS_FILE, RUN_FILE, load_run
from tests.conftest import copy_run

RECORD_FIELDS = ["key", "status", "reason", "step_times_s", "losses", "warmup_losses", "peak_allocated_bytes",
                 "peak_reserved_bytes", "memory", "loss_check", "tokens_per_step", "model_flops_per_step",
                 "peak_tflops", "plan", "num_checkpointed", "predicted_peak_allocated_bytes",
                 "context_bytes", "warmup_times_s", "hardware_flops_per_step"]
KEY_FIELDS = ["model", "layout", "batch_size", "seq_len", "precision", "optimizer", "compile", "new_axis",
              "batch_size", "seq_len"]
# The fields every reader leans on come up more often: with a dozen examples each is damaged several times.
META_FIELDS = ["config", "environment", "searches", "status", "resumes"] * 3 + [
    "schema_version", "options", "num_points", "finished_points", "name", "sweep_wall_s", "created_at"]

scalars = (
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | st.floats()
    | st.text(max_size=8) | st.sampled_from(["ok", "oom", "error", "all", "none", "fp32"])
)
values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
# A wrong type is what damage usually leaves; drawn first, they are tried within a dozen examples.
# DEEP stands for a value nested 5,000 deep (json.dumps would recurse: it is put in as text, see _dumps).
DEEP = "<deep>"
wrong = st.sampled_from([None, 5, -1, "x", [1], [], True, 1.5, float("nan"), 10**30, {"a": 1}, {},
                         10**4000, 5e-324, [5e-324], 1e308, [1e308], DEEP, "[/]", "$\\frac{1}$"])
damaged = wrong | values
# One damage: (where, what, position, field, value or text). Positions are fractions of the file/list.
points_damage = st.one_of(
    st.tuples(st.just("cut"), st.floats(0, 1), st.sampled_from(["", "\n", "\n\n", " \n"])),
    st.tuples(st.just("line"), st.floats(0, 1), values.map(lambda v: json.dumps(v))),
    st.tuples(st.just("line"), st.floats(0, 1), st.text(max_size=30)),
    st.tuples(st.just("line"), st.floats(0, 1), st.just("[" * 5000 + "]" * 5000)),
    st.tuples(st.just("field"), st.floats(0, 1), st.sampled_from(RECORD_FIELDS), damaged),
    st.tuples(st.just("key"), st.floats(0, 1), st.sampled_from(KEY_FIELDS), damaged),
    st.tuples(st.just("drop"), st.floats(0, 1), st.sampled_from(RECORD_FIELDS)),
    st.tuples(st.just("bytes"), st.floats(0, 1), st.binary(min_size=1, max_size=6)),
)
meta_damage = st.one_of(
    st.tuples(st.just("meta"), st.sampled_from(META_FIELDS), damaged),
    st.tuples(st.just("meta-drop"), st.sampled_from(META_FIELDS)),
    st.tuples(st.just("meta-cut"), st.floats(0, 1)),
)


def _dumps(value: Any) -> str:
    return json.dumps(value).replace(json.dumps(DEEP), "[" * 5000 + "]" * 5000)


def _at(items: list[Any], where: float) -> int:
    return min(int(where * len(items)), len(items) - 1)


def _damage_points(data: bytes, op: tuple[Any, ...]) -> bytes:
    kind, where = op[0], op[1]
    if kind == "cut":
        return data[: int(where * len(data))] + op[2].encode()
    if kind == "bytes":
        i = int(where * len(data))
        return data[:i] + op[2] + data[i + len(op[2]):]
    lines = data.decode("utf-8", "replace").split("\n")
    i = _at(lines, where)
    if kind == "line":
        lines[i] = op[2]
    else:
        try:
            record = json.loads(lines[i])
        except (ValueError, RecursionError):
            return data
        if not isinstance(record, dict):
            return data
        if kind == "field":
            record[op[2]] = op[3]
        elif kind == "key" and isinstance(record.get("key"), dict):
            record["key"][op[2]] = op[3]
        else:
            record.pop(op[2], None)
        lines[i] = _dumps(record)
    return "\n".join(lines).encode()


def _damage_meta(data: bytes, op: tuple[Any, ...]) -> bytes:
    if op[0] == "meta-cut":
        return data[: int(op[1] * len(data))]
    try:
        meta = json.loads(data)
    except (ValueError, RecursionError):  # already cut (or nested deep) by an earlier damage
        return data
    if not isinstance(meta, dict):
        return data
    if op[0] == "meta":
        meta[op[1]] = op[2]
    else:
        meta.pop(op[1], None)
    return _dumps(meta).encode()


def valid_lines(run: Path) -> list[bytes]:
    """The lines of points.jsonl that are valid records: none of them may ever be lost."""
    found = []
    for line in (run / POINTS_FILE).read_bytes().split(b"\n"):
        try:
            PointRecord.read(json.loads(line))
        except (ValueError, ValidationError, RecursionError):
            continue
        found.append(line)
    return found


def readable(run: Path) -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            load_run(run)
    except ResultsError:
        return False
    return True


@pytest.mark.slow
@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(damages=st.lists(points_damage, min_size=1, max_size=3), meta=st.lists(meta_damage, max_size=2))
def test_fuzz_damaged_runs_through_every_reading_command(
    mini_run: tuple[Path, Path], shared_estimates: None, remembered_host_rate: None,
    damages: list[tuple[Any, ...]], meta: list[tuple[Any, ...]],
) -> None:
    # shared_estimates (tests/_est_shared.py): the trace depends on run.json's config only, never on the damaged
    # records, so `estimate RUN` and report's breakdown stay real in what they read and render, one trace each;
    # remembered_host_rate: the CPU guard before each resumed sweep measures the host once, not 12 times.
    config, pristine = mini_run
    with tempfile.TemporaryDirectory() as tmp:
        run = copy_run(pristine, Path(tmp) / "run")
        data = (run / POINTS_FILE).read_bytes()
        for op in damages:
            data = _damage_points(data, op)
        (run / POINTS_FILE).write_bytes(data)
        for op in meta:
            (run / RUN_FILE).write_bytes(_damage_meta((run / RUN_FILE).read_bytes(), op))
        kept, was_readable = valid_lines(run), readable(run)
        for args in (
            ["compare", str(run), str(pristine)],
            ["recommend", str(run), "--budget", "1"],
            ["report", str(run), "--out", str(Path(tmp) / "report")],
            ["estimate", str(run)],
            ["sweep", str(config), "--resume", str(run), "--no-predict"],
        ):
            result = CliRunner().invoke(app, args)
            crashed = result.exception is not None and not isinstance(result.exception, SystemExit)
            assert not crashed, (args[0], damages, meta, repr(result.exception))
            assert result.exit_code in (0, 2) and "Traceback" not in result.output, (args[0], result.output)
        after = (run / POINTS_FILE).read_bytes().split(b"\n")
        assert all(line in after for line in kept), (damages, meta)  # no valid record lost
        assert readable(run) or not was_readable  # no command made a readable run unreadable


@pytest.mark.slow
def test_a_point_edited_to_a_precision_no_step_has_is_not_estimated(
    mini_run: tuple[Path, Path], shared_estimates: None,
) -> None:
    """What the fuzzing above found once: a record whose key names a precision no step has ('[/]') crashed `report`
    (its breakdown estimated the point: KeyError). The point is left out of what is estimated; the command answers."""
    _, pristine = mini_run
    with tempfile.TemporaryDirectory() as tmp:
        run = copy_run(pristine, Path(tmp) / "run")
        data = (run / POINTS_FILE).read_bytes()
        for op in [("cut", 0.25, ""), ("key", 0.0, "precision", "[/]")]:  # the first quarter, its first point edited
            data = _damage_points(data, op)
        (run / POINTS_FILE).write_bytes(data)
        result = CliRunner().invoke(app, ["report", str(run), "--out", str(Path(tmp) / "report")])
        assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
        assert result.exit_code == 0 and "Traceback" not in result.output


@pytest.mark.slow
def test_a_point_edited_to_a_precision_no_step_has_is_not_timed_per_op(mini_run: tuple[Path, Path]) -> None:
    """The step-time model's op costs of a run (`--times-from`) leave such a point out instead of crashing."""
    from ckptbench.estimator.estimator import run_op_costs
    from ckptbench.results.store import load_run

    _, pristine = mini_run
    with tempfile.TemporaryDirectory() as tmp:
        run = copy_run(pristine, Path(tmp) / "run")
        data = _damage_points((run / POINTS_FILE).read_bytes(), ("key", 0.0, "precision", "[/]"))
        (run / POINTS_FILE).write_bytes(data)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loaded = load_run(run)
        found = run_op_costs([loaded])
        edited = [r.key_id for r in loaded.points if r.key.get("precision") == "[/]"]
        assert edited and not set(edited) & set(found) and found
