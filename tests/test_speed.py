"""The fast paths of issue 24 give exactly what the slow ones gave, and the quick commands import no torch.

No timings are asserted here (scripts/bench_tool.py measures them): each test pins an equality between a
fast path and the straightforward rule it replaces, on many random inputs. (The allocator's fast path, the C
``serve`` against the general rules, is tests/test_allocator_serve.py.)
"""

from __future__ import annotations

import functools
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ckptbench.analysis.compare import point_labels
from ckptbench.config.grid import key_id

ROOT = Path(__file__).resolve().parent.parent


# -- compare's labels ------------------------------------------------------------------------------------
def _labels_quadratic(keys: list[dict[str, Any]]) -> dict[str, str]:
    """point_labels as it was before issue 24 (a set over every key, for every key): the reference."""
    prefix = {"layout": "", "batch_size": "b=", "seq_len": "s=", "precision": ""}
    names: list[str] = list(prefix)
    for key in keys:
        names += [k for k in key if k not in names and len({str(other.get(k)) for other in keys}) > 1]
    return {key_id(key): " ".join(f"{prefix.get(n, n + '=')}{key[n]}" for n in names if n in key) for key in keys}


@pytest.mark.parametrize("seed", range(20))
def test_point_labels_match_the_quadratic_rule(seed: int) -> None:
    rng = random.Random(seed)
    fields = ["layout", "batch_size", "seq_len", "precision", "optimizer", "lora", "micro_batches", "extra"]
    keys = []
    for _ in range(rng.randint(1, 40)):
        key: dict[str, Any] = {}
        for f in rng.sample(fields, rng.randint(1, len(fields))):  # fields missing and in varying orders
            key[f] = rng.choice([None, "none", 1, 2, "all", True])
        keys.append(key)
    assert point_labels(keys) == _labels_quadratic(keys)


# -- plot labels: the spatial grid answers as the pairwise checks did -------------------------------------
def test_label_grid_finds_exactly_the_overlapping_boxes() -> None:
    from matplotlib.transforms import Bbox

    from ckptbench.plots.labels import _Grid, _overlaps

    rng = random.Random(3)
    grid = _Grid()
    boxes = []
    for _ in range(400):
        x, y = rng.uniform(-50, 900), rng.uniform(-50, 700)
        box = (x, y, x + rng.choice([0.0, 2.0, 31.9, 32.0, 64.0, 700.0, 5e5]), y + rng.choice([0.0, 3.0, 32.0, 90.0]))
        grid.add(box)
        boxes.append(box)
    grid.add((float("nan"), 0.0, 1.0, 1.0))  # never overlaps anything, as with Bbox.overlaps
    for _ in range(400):
        x, y = rng.uniform(-100, 950), rng.uniform(-100, 750)
        query = (x, y, x + rng.uniform(0, 80), y + rng.uniform(0, 40))
        expected = any(Bbox.from_extents(*query).overlaps(Bbox.from_extents(*b)) for b in boxes)
        assert grid.overlaps(query) == expected
        assert _overlaps(query, boxes[0]) == Bbox.from_extents(*query).overlaps(Bbox.from_extents(*boxes[0]))


def test_label_nearest_point_check_sees_every_point_that_could_be_nearer() -> None:
    from ckptbench.plots.labels import _distance, _Grid, _nearest

    rng = random.Random(5)
    marks = [(rng.uniform(0, 800), rng.uniform(0, 600)) for _ in range(300)]
    centres = _Grid()
    for px, py in marks:
        centres.add((px, py, px, py))
    for _ in range(500):
        own = marks[rng.randrange(len(marks))]
        x, y = own[0] + rng.uniform(-40, 20), own[1] + rng.uniform(-20, 20)
        box = (x, y, x + rng.uniform(5, 60), y + rng.uniform(5, 15))
        mine = _distance(box, *own)
        expected = all(_distance(box, px, py) >= mine for px, py in marks if (px, py) != own)
        assert _nearest(box, own, centres) == expected


# -- start-up: the quick commands import neither torch nor transformers ----------------------------------
_PROBE = """
import sys
import time
from ckptbench.cli.main import app
try:
    app(sys.argv[1:], standalone_mode=False)
except SystemExit:
    pass
heavy = sorted(m for m in ("torch", "transformers", "scipy", "matplotlib", "pandas") if m in sys.modules)
print("HEAVY:" + ",".join(heavy))
"""
_RUN2 = "results/h200-gpu-check-2/check"
_RUN1 = "results/h200-gpu-check-1/axes"


@pytest.mark.parametrize(("args", "allowed"), [
    (["--help"], ""),
    (["compare", "--help"], ""),
    # compare computes Mann-Whitney p-values (scipy) of the points' step times: nothing heavier
    (["compare", _RUN2, _RUN2, "--format", "json"], "scipy"),
    (["recommend", _RUN2, "--budget", "80"], ""),
    # answers predicts the points no run measured with the estimator (torch): --measured-only reads runs alone
    (["answers", _RUN2, _RUN1, "--measured-only"], ""),
], ids=["help", "compare-help", "compare", "recommend", "answers"])
def test_quick_commands_import_nothing_heavy(args: list[str], allowed: str) -> None:
    """What reads committed runs starts without torch, transformers, matplotlib or pandas (estimate, advise and
    answers' predictions import the first two when they predict, report and answers --out the third when they
    plot), and without scipy unless it computes a statistic."""
    done = subprocess.run([sys.executable, "-c", _PROBE, *args], cwd=ROOT, capture_output=True, text=True,
                          check=False, env={"PYTHONPATH": str(ROOT), "COLUMNS": "120", "PATH": ""})
    last = done.stdout.strip().splitlines()[-1]
    assert last == f"HEAVY:{allowed}", (last, done.stderr[-2000:])


def test_the_cli_and_compare_modules_import_nothing_heavy() -> None:
    """Importing the CLI, the compare command and what it calls defers scipy to the first p-value."""
    code = ("import sys, ckptbench.cli.main, ckptbench.cli.compare, ckptbench.analysis.compare, "
            "ckptbench.analysis.mann_whitney, ckptbench.render.compare, ckptbench.render.json_dump; "
            "print(sorted({'torch', 'transformers', 'scipy', 'matplotlib', 'pandas', 'numpy'} "
            "& {m.split('.')[0] for m in sys.modules}))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False,
                          env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert done.stdout.strip() == "[]", done.stderr[-2000:]


# -- compare: many points at once, exactly as one point at a time ---------------------------------------
def _samples(rng: random.Random, n: int, kind: int) -> list[Any]:
    if kind == 0:  # ties
        return [rng.choice([1.0, 1.5, 2.0]) for _ in range(n)]
    if kind == 1:  # all equal
        return [0.25] * n
    if kind == 2:  # ints (a hand-edited record), ties too
        return [rng.choice([1, 2, 3]) for _ in range(n)]
    if kind == 3:  # zeros of both signs and subnormals: equal floats that print differently
        return [rng.choice([0.0, -0.0, 5e-324, 1e-300]) for _ in range(n)]
    return [rng.lognormvariate(0, 0.1) for _ in range(n)]


@pytest.mark.parametrize("seed", range(3))
def test_mann_whitney_of_many_points_is_bitwise_the_one_point_p_value(seed: int) -> None:
    """Grouped 2-D scipy calls give each point's p-value bit for bit, across the exact and asymptotic methods
    ('auto' picks by size and ties), empty sides, and samples that are not plain floats."""
    from ckptbench.analysis.mann_whitney import mann_whitney_ps
    from ckptbench.analysis.verdict import mann_whitney_p

    rng = random.Random(seed)
    pairs: list[tuple[list[Any], list[Any]]] = []
    for _ in range(400):
        kind = rng.randrange(6)
        sizes = [0, 1, 2, 3, 3, 3, 4, 7, 8, 9, 10, 25]
        pairs.append((_samples(rng, rng.choice(sizes), kind), _samples(rng, rng.choice(sizes), kind)))
    pairs.append(([1.0, 2.0, True], [1.0, 2.0, 3.0]))  # a bool: the one-point call decides
    fast = mann_whitney_ps(pairs)
    assert [repr(p) for p in fast] == [repr(mann_whitney_p(b, n)) for b, n in pairs]


def _nested(rng: random.Random, depth: int = 0) -> Any:
    r = rng.random()
    if depth < 4 and r < 0.2:
        names = ["a", "b", "é", "\n", '"q"', "z" * 3]
        return {rng.choice(names): _nested(rng, depth + 1) for _ in range(rng.randint(0, 4))}
    if depth < 4 and r < 0.4:
        return [_nested(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    if depth < 4 and r < 0.45:
        return tuple(_nested(rng, depth + 1) for _ in range(rng.randint(0, 3)))
    if depth < 4 and r < 0.5:  # keys that are not strings, written as JSON writes them
        keys = [1, 2.5, True, None, False, 1e300]
        return {rng.choice(keys): _nested(rng, depth + 1) for _ in range(rng.randint(0, 2))}
    return rng.choice([None, True, False, 0, -1, 2**70, 1.5, -0.0, float("nan"), float("inf"), -float("inf"),
                       1e16, 1e-7, 0.1, "x", "\u00fc\u2028", "", "a\\b"])


def test_json_dump_writes_what_json_dumps_writes() -> None:
    import json

    from ckptbench.render.json_dump import dumps_indented

    def outcome(dump: Any, value: Any) -> str:
        try:
            return str(dump(value))
        except TypeError as exc:  # keys that do not sort (None and True): refused alike
            return f"TypeError {exc}"

    rng = random.Random(7)
    for _ in range(2000):
        value = _nested(rng)
        assert outcome(dumps_indented, value) == outcome(lambda v: json.dumps(v, indent=2, sort_keys=True), value)
    with pytest.raises(TypeError):
        dumps_indented({"a": [object()]})


def test_comparison_dict_is_asdict() -> None:
    import dataclasses

    from ckptbench.analysis.compare import compare_refs

    comp = compare_refs(ROOT / _RUN2, ROOT / "results/h200-gpu-check-1/check", allow_different=True)
    expected = {"schema": "ckptbench.compare/1", **dataclasses.asdict(comp)}
    assert repr(comp.to_dict()) == repr(expected)


# -- report: a label's box guessed at another place lies inside the measured one ---------------------------
def test_label_guess_lies_inside_the_measured_box() -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from ckptbench.plots.labels import _GAP, _extents, _FirstPlace, _places

    fig = Figure(figsize=(6, 4), dpi=100)
    ax = fig.subplots()
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 10)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    pixels = fig.dpi / 72
    rng = random.Random(2)
    for text in ["none b=1", "every:2 b=16 s=4096 bf16", "x", "first:16\nsecond line"]:
        x, y, radius = rng.uniform(1, 9), rng.uniform(1, 9), rng.uniform(3, 12)
        own = tuple(float(v) for v in ax.transData.transform((x, y)))
        first = None
        for dx, dy, ha, va, dist in _places(radius):
            note = ax.annotate(text, (x, y), xytext=(dx * dist, dy * dist), textcoords="offset points", ha=ha,
                               va=va, fontsize=7.5)
            box = _extents(note.get_window_extent(renderer).padded(_GAP * pixels))
            note.remove()
            if first is None:
                first = _FirstPlace.of(box, own, (dx * dist * pixels, dy * dist * pixels), ha, va, pad=_GAP * pixels)
                assert first is not None
                continue
            guess = first.box_at(dx * dist * pixels, dy * dist * pixels, ha, va)
            assert box[0] < guess[0] and box[1] < guess[1] and guess[2] < box[2] and guess[3] < box[3]
            assert max(abs(g - b) for g, b in zip(guess, box, strict=True)) == pytest.approx(1.0, abs=1e-6)


# -- the estimate's workers ------------------------------------------------------------------------------
def _square_or_fail(i: int) -> int:
    if i == 3:
        raise KeyError(f"piece {i}")
    return i * i


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_pieces_give_every_result_once_whatever_the_workers(workers: int) -> None:
    from ckptbench.estimator.workers import map_pieces

    got = list(map_pieces(lambda i: i * i, 7, workers=workers))
    assert sorted(got) == [(i, i * i) for i in range(7)]
    if workers == 1:
        assert got == sorted(got)  # here, in order


def test_a_piece_failing_in_a_worker_raises_its_own_error_here() -> None:
    from ckptbench.estimator.workers import map_pieces

    with pytest.raises(KeyError, match="piece 3"):
        dict(map_pieces(_square_or_fail, 6, workers=2))


def _pid_and_warning() -> int:
    import warnings

    warnings.warn("from the task", UserWarning, stacklevel=1)
    return os.getpid()


def _failing() -> int:
    raise KeyError("the task's own error")


def test_a_background_task_runs_in_another_process_and_its_warnings_come_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from ckptbench.estimator.workers import WORKERS_ENV, Background

    monkeypatch.setenv(WORKERS_ENV, "2")
    with Background(_pid_and_warning) as task, pytest.warns(UserWarning, match="from the task"):
        pid = task.result()
    assert pid != os.getpid()


def test_a_background_task_runs_here_with_one_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    from ckptbench.estimator.workers import WORKERS_ENV, Background

    monkeypatch.setenv(WORKERS_ENV, "1")
    with Background(_pid_and_warning) as task, pytest.warns(UserWarning, match="from the task"):
        assert task.result() == os.getpid()


def test_a_background_task_failing_there_raises_its_own_error_here(monkeypatch: pytest.MonkeyPatch) -> None:
    from ckptbench.estimator.workers import WORKERS_ENV, Background

    monkeypatch.setenv(WORKERS_ENV, "2")
    with Background(_failing) as task, pytest.raises(KeyError, match="the task's own error"):
        task.result()


def test_leaving_a_background_task_unasked_stops_its_process(monkeypatch: pytest.MonkeyPatch) -> None:
    from ckptbench.estimator.workers import WORKERS_ENV, Background

    monkeypatch.setenv(WORKERS_ENV, "2")
    with Background(functools.partial(time.sleep, 30)) as task:
        process = task._process
        assert process is not None and process.is_alive()
    assert not process.is_alive()


_FREEZE_SPY = """
import gc, os, sys
frozen = []
gc.freeze = lambda: frozen.append(True)
from ckptbench.cli.main import main
sys.argv = ["ckptbench", *sys.argv[1:]]
try:
    main()
finally:
    os.write(2, f"frozen={len(frozen)}".encode())
"""


@pytest.mark.parametrize("args, code", [(["gpus", "--format", "json"], 0), (["advise", "--gpu", "nope"], 2)])
def test_the_command_line_freezes_its_objects_before_the_teardown(args: list[str], code: int) -> None:
    # The interpreter's teardown would collect every object (torch's, transformers', the traces): 0.9 s of a cold
    # advise on one core after the answer. The entry point freezes them, whatever the exit code. (In a process of its
    # own: the entry point sets what the command line's signals do until the process ends.)
    done = subprocess.run([sys.executable, "-c", _FREEZE_SPY, *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == code and done.stderr.endswith("frozen=1"), done.stderr[-300:]


def test_worker_count_is_bounded_by_the_pieces_and_refuses_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    from ckptbench.estimator.workers import WORKERS_ENV, available_cores, worker_count

    monkeypatch.delenv(WORKERS_ENV, raising=False)
    assert worker_count(None, 1000) == available_cores()
    monkeypatch.setenv(WORKERS_ENV, "3")
    assert worker_count(None, 1000) == 3 and worker_count(None, 2) == 2
    monkeypatch.setenv(WORKERS_ENV, "zero")  # not a positive number: the cores
    assert worker_count(None, 1000) == available_cores()
    assert worker_count(8, 3) == 3 and worker_count(8, 0) == 1
    with pytest.raises(ValueError):
        worker_count(0, 5)


def test_a_shapes_short_models_of_every_precision_are_traced_together() -> None:
    """The trace groups a worker takes whole: one per shape with its precisions in the grid's order (the autocast ones
    after the plain ones whose fake-tensor cache entries they use), each optimizer trace alone; ``jobs`` is them in
    order, the first short model first."""
    from ckptbench.estimator.estimator import Estimator
    from tests.conftest import tiny_config

    cfg = tiny_config(device="cuda", sweep={"layout": ["none", "all"], "batch_size": [1, 2], "seq_len": [32, 64],
                                            "precision": ["bf16", "fp32", "amp_bf16"]})
    est = Estimator(cfg)
    groups = [[label for label, _ in group] for group in est._job_groups(cfg.points_list())]
    assert [label for label, _ in est.jobs(cfg.points_list())] == [label for group in groups for label in group]
    optimizer = [g for g in groups if "optimizer step" in g[0]]
    assert [len(g) for g in optimizer] == [1, 1] and groups[1:3] == optimizer
    short = [g for g in groups if g not in optimizer]
    assert len(short) == 4 and groups[0] == short[0]
    for group in short:
        shapes = {label.split(":")[0].split(" ", 1)[1] for label in group}
        assert len(shapes) == 1 and [label.split(" ")[0] for label in group] == ["bf16", "fp32", "amp_bf16"]


def test_the_last_groups_of_a_grid_are_handed_out_a_trace_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers take a shape's traces (its precisions) as one piece while there are enough groups to keep them busy,
    and the last group of each worker's share a trace at a time: they end within a trace of each other, not a
    group (the 704-point grid's end had one core idle for half a second)."""
    from ckptbench.estimator import estimator as est_module
    from ckptbench.estimator.estimator import Estimator
    from tests.conftest import tiny_config

    cfg = tiny_config(device="cuda", sweep={"layout": ["none"], "batch_size": [1, 2, 3, 4, 5], "seq_len": [32, 64],
                                            "precision": ["bf16", "fp32"]})
    est = Estimator(cfg, cache=None)
    pieces: list[list[int]] = []

    def noted(groups: Any) -> dict[str, dict[Any, Any]]:  # the pieces handed out, not traced (nothing new to take)
        pieces.append([len(g) for g in groups])
        return {}

    def here(task: Any, sizes: Any, *, here: Any, there: Any, first: Any = None, workers: Any = None) -> Any:
        first()
        return (((q, i), task(q, i)) for q in here for i in range(sizes[q]))  # this process's order, here

    monkeypatch.setattr(est_module, "share_pieces", here)
    monkeypatch.setattr(est, "_run_groups", noted)
    assert est.run_traces(cfg.points_list(), workers=2) == 10 * 2 + 2
    # The first trace ran here (not a piece): the step traces as pieces, whole shapes (a bf16 and an fp32 trace) but
    # for the last two, a trace at a time; then the two optimizer traces, each alone.
    assert pieces[-2:] == [[1]] * 2 and pieces[-6:-2] == [[1]] * 4 and pieces[-7] == [2]
    assert sum(n for (n,) in pieces) == 10 * 2 + 2 - 1


def test_estimates_and_progress_do_not_depend_on_the_workers() -> None:
    """The traces and the points spread over forked workers give the estimates one process gives, in order."""
    from ckptbench.estimator.estimator import estimate_points
    from tests.conftest import tiny_config

    cfg = tiny_config(device="cuda", sweep={"layout": ["none", "all", "every:2"], "batch_size": [1, 2, 3],
                                            "seq_len": [32, 64], "precision": ["bf16", "fp32"]})
    points = cfg.points_list()
    heard: dict[int | None, list[Any]] = {}
    out = {w: estimate_points(cfg, points, workers=w, on_progress=heard.setdefault(w, []).append) for w in (1, 2)}
    assert out[1] == out[2] and [e.point for e in out[2]] == points
    assert all(e.reserved is not None and e.peak_bytes for e in out[1])
    serial = heard[1]
    assert [p.done for p in serial] == list(range(len(serial))) and serial[-1].label == "done"
    assert [p.done for p in heard[2]] == [p.done for p in serial] and heard[2][-1].label == "done"


def test_the_optimizer_trace_runs_beside_the_first_trace_and_comes_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With two workers a forked process starts beside the first short model's trace, which runs here (estimator.py
    ``run_traces``), and takes the whole model's optimizer trace: the same traces, and the same estimates, as one
    process makes; with one worker both run here."""
    from ckptbench.estimator import estimator as est_module
    from ckptbench.estimator.estimator import Estimator
    from tests.conftest import tiny_config

    cfg = tiny_config(device="cuda", sweep={"layout": ["none", "all"], "batch_size": [1], "seq_len": [32]})
    points = cfg.points_list()
    where = tmp_path / "where"
    for name in ("_trace_optim", "_trace_short"):
        traced = getattr(Estimator, name)

        def noted(self: Estimator, point: Any, traced: Any = traced, name: str = name) -> None:
            if name == "_trace_short":
                time.sleep(0.5)  # the forked process has started: it takes the optimizer trace
            with where.open("a") as f:
                f.write(f"{name} {os.getpid()}\n")
            traced(self, point)

        monkeypatch.setattr(Estimator, name, noted)
    made: dict[int, list[Any]] = {}
    for workers in (1, 2):
        where.write_text("")
        est = est_module.Estimator(cfg, cache=None)
        assert est.run_traces(points, workers=workers) == 2
        ran = dict(line.split() for line in where.read_text().splitlines())
        assert ran["_trace_short"] == str(os.getpid())
        assert (ran["_trace_optim"] == str(os.getpid())) == (workers == 1), (workers, ran)
        assert len(est._optim) == 1 and len(est._costs) == 1
        made[workers] = [est.predict(p) for p in points]
    assert made[1] == made[2] and all(e.peak_bytes for e in made[1])


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_shared_pieces_run_once_each_in_each_process_s_order(workers: int) -> None:
    """``share_pieces``: every piece once, whatever the processes; this process runs ``first``, then takes from its
    queues in its order; the forked ones start at once and take from theirs in theirs (the slow first piece here
    leaves them queue 0 and the start of queue 1); a piece failing in a forked process runs again here; with one
    worker, everything here in this process's order."""
    from ckptbench.estimator.workers import share_pieces

    here = os.getpid()

    def task(q: int, i: int) -> tuple[int, int, bool]:
        if os.getpid() != here and (q, i) == (1, 0):
            raise KeyError("fails there")
        time.sleep(0.02)
        return q, i, os.getpid() == here

    def first() -> None:
        time.sleep(0.5)

    got = list(share_pieces(task, [3, 4], here=(1, 0), there=(0, 1), first=first, workers=workers))
    assert sorted(piece for piece, _ in got) == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2), (1, 3)]
    assert all(piece == result[:2] for piece, result in got)
    by = {piece: result[2] for piece, result in got}
    if workers == 1:
        assert [piece for piece, _ in got] == [(1, 0), (1, 1), (1, 2), (1, 3), (0, 0), (0, 1), (0, 2)]
        assert all(by.values())
    else:
        assert not by[(0, 0)] and not by[(0, 1)] and not by[(0, 2)]  # taken there while ``first`` ran here
        assert by[(1, 0)]  # failed there (whoever took it), run here


@pytest.mark.parametrize("workers", [1, 2])
def test_traces_run_beside_come_back_as_traced_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    workers: int) -> None:
    """``Estimator.traced_beside``, once a short model was traced (and prepared) here: with two workers the traces run
    in forked processes while this one goes on and ``take`` brings them here (nothing is traced here, then nothing is
    left to trace); with one they run at ``take``, here. Either way the traces and the estimates are those
    ``run_traces`` makes, and each trace is heard of once. Left without ``take``, nothing comes back (and the traces
    run again when asked for). An Estimator that traced nothing yet (its earlier traces all on disk) runs them at
    ``take`` as ``run_traces`` does: forked, each process imported torch and paid a first trace's costs again (0.2 s
    more for the thread question asked again with --precision amp_bf16; 2 s before torch was imported first)."""
    from ckptbench.estimator.estimator import Estimator
    from tests.conftest import tiny_config

    cfg = tiny_config(device="cuda", sweep={"layout": ["none", "all"], "batch_size": [1, 2, 3], "seq_len": [32]})
    points = cfg.points_list()
    first = [p for p in points if p.batch_size == 1]  # batch 1's two layouts, then batches 2 and 3
    rest = [p for p in points if p.batch_size > 1]
    where = tmp_path / "where"
    traced = Estimator._trace_short

    def noted(self: Estimator, point: Any) -> None:
        with where.open("a") as f:
            f.write(f"{os.getpid()}\n")
        traced(self, point)

    monkeypatch.setattr(Estimator, "_trace_short", noted)
    reference = Estimator(cfg, cache=None)
    reference.run_traces(points, workers=1)
    est = Estimator(cfg, cache=None)
    est.run_traces(first, workers=1)
    assert est._prepared
    where.write_text("")
    heard: list[Any] = []
    with est.traced_beside(rest, on_progress=heard.append, workers=workers) as take:
        assert len(est._costs) == 1  # not traced here (yet)
        take()
        take()  # once is enough
    ran = where.read_text().split()
    assert len(ran) == 2 and (set(ran) == {str(os.getpid())}) == (workers == 1), ran
    assert not est.jobs(points) and est._costs.keys() == reference._costs.keys()
    assert [e.done for e in heard] == [1, 2] and heard[-1].total == 2  # batch 2's and batch 3's short models
    assert [est.predict(p) for p in points] == [reference.predict(p) for p in points]
    untaken = Estimator(cfg, cache=None)
    untaken.run_traces(first, workers=1)
    with untaken.traced_beside(rest, workers=workers):
        pass
    assert len(untaken._costs) == 1 and len(untaken.jobs(points)) == 2
    where.write_text("")
    fresh = Estimator(cfg, cache=None)
    with fresh.traced_beside(points, workers=workers) as take:
        assert not fresh._costs and not where.read_text()  # nothing forked, nothing traced yet
        take()
        assert len(fresh._costs) == 3 and not fresh.jobs(points)
        take()  # once is enough
    assert where.read_text().split()[0] == str(os.getpid())  # run_traces: the first trace here, before any fork
    assert [fresh.predict(p) for p in points] == [reference.predict(p) for p in points]


@pytest.mark.parametrize(("frozen", "torch_first"), [(False, False), (True, False), (True, True)])
def test_tracing_is_imported_with_the_collector_paused_and_frozen_only_where_asked(frozen: bool,
                                                                                  torch_first: bool) -> None:
    """estimator/collector.py: torch and transformers imported for tracing with no collection during the import (they
    made the collector walk the heap again and again: 0.5 s); frozen after where the command line asks for it and
    this import brought torch in (where torch came first, a model built with it may be alive: nothing is frozen); a
    caller's process (the Python API's) keeps its collector as it was. estimator/optional_imports.py: in the command
    line's process transformers is imported without scipy (its object-detection losses' import of scipy.optimize,
    0.2-0.3 s of a cold command), its switch told the truth again after, the causal LM loss there as always, and its
    models folder scanned once (0.23 s), transformers.models holding what a scan of its own finds; a caller's process
    imports transformers as it is."""
    script = (
        "import gc, sys\n"
        + ("import torch\n" if torch_first else "")
        + "from ckptbench.estimator import collector\n"
        "runs = []  # for each collection: whether the import had finished\n"
        "done = lambda: hasattr(sys.modules.get('ckptbench.estimator.trace'), 'trace_optimizer')  # (its body ran)\n"
        "gc.callbacks.append(lambda phase, info: runs.append(done()) if phase == 'start' else None)\n"
        + ("collector.freeze_imports()\n" if frozen else "")
        + "collector.import_for_tracing()\n"
        "assert 'torch' in sys.modules and 'transformers' in sys.modules\n"
        "during, after = runs.count(False), runs.count(True)\n"
        "print(during, after if gc.get_freeze_count() else 0, gc.isenabled(), gc.get_freeze_count() > 0)\n"
        "import transformers.utils as utils, transformers.utils.import_utils as found\n"
        "from transformers.loss.loss_utils import LOSS_MAPPING\n"
        "assert utils.is_scipy_available is found.is_scipy_available and utils.is_scipy_available()\n"
        "assert 'ForCausalLM' in LOSS_MAPPING\n"
        "print('scipy' in sys.modules)\n"
        # transformers' scan of its models folder: made once where the command line asked (the second import took the
        # cached one), and what transformers.models holds is a scan of its own, made afresh
        "print(found.create_import_structure_from_path.cache_info().hits)\n"
        "assert found.define_import_structure.__qualname__ == 'define_import_structure'  # (put back)\n"
        + _MODELS_DIGEST
    )
    found = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, check=True)
    # no collection during the import; frozen, none after it in the import either (it would walk what was imported);
    # scipy left out where the command line asked; the models folder scanned once there, transformers.models holding
    # what a plain import of it holds
    assert found.stdout.split() == ["0", "0", "True", str(frozen and not torch_first), str(not frozen),
                                    "1" if frozen else "0", _plain_models_digest()]


# What transformers.models holds (each module's names, in order: the lists follow set order, which varies by process).
_MODELS_DIGEST = (
    "import hashlib\n"
    "held = sys.modules['transformers.models']._import_structure\n"
    "print(hashlib.sha256(repr(sorted((k, sorted(v)) for k, v in held.items())).encode()).hexdigest())\n"
)


@functools.cache
def _plain_models_digest() -> str:
    """``_MODELS_DIGEST`` of a process that imports transformers.models and nothing of ckptbench."""
    script = "import sys, transformers.models\n" + _MODELS_DIGEST
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.strip()


def test_traces_and_replays_collect_the_young_generation_less_often_and_restore_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """estimator/collector.py ``relaxed``: while the estimator traces (here, one process) the youngest generation is
    collected every 20,000 net allocations; its replays (``estimate_each``'s parts) run with the collector paused;
    the thresholds and the collector are as they were after (a measured step never runs under either); a higher
    threshold is kept."""
    import gc

    from ckptbench.estimator import collector
    from ckptbench.estimator.estimator import Estimator
    from tests.conftest import tiny_config

    seen: dict[str, list[tuple[int, bool]]] = {}
    for name in ("_trace_short", "_estimate"):
        original = getattr(Estimator, name)

        def noted(self: Estimator, *args: Any, original: Any = original, name: str = name, **kwargs: Any) -> Any:
            seen.setdefault(name, []).append((gc.get_threshold()[0], gc.isenabled()))
            return original(self, *args, **kwargs)

        monkeypatch.setattr(Estimator, name, noted)
    before = gc.get_threshold()
    assert gc.isenabled()
    cfg = tiny_config(device="cuda", sweep={"layout": ["none", "all"], "batch_size": [1], "seq_len": [32]})
    Estimator(cfg, cache=None).predict_many(cfg.points_list(), workers=1)
    assert seen["_trace_short"] == [(collector.RELAXED_THRESHOLD, True)]
    assert seen["_estimate"] == [(collector.RELAXED_THRESHOLD, False)] * 2
    assert gc.get_threshold() == before and gc.isenabled()
    gc.set_threshold(50_000, *before[1:])
    try:
        with collector.relaxed():
            assert gc.get_threshold()[0] == 50_000
    finally:
        gc.set_threshold(*before)
