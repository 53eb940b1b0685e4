"""compare's time gate over many points: no false alarm between ten back-to-back CPU sweeps, a 3x slowdown caught.

tests/fixtures/ten_cpu/r0 .. r9 are ten runs of configs/tiny.yaml (12 points, 3 measured steps each)
recorded back to back on a shared 2-core host while other work ran: the noise a CI machine sees. Their
step times differ by chance up to 4x for one point (busy) and 98% between the ranges of an unflagged
one (analysis/verdict.py's rules are sized on them).
"""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ckptbench.analysis.compare import Gates, compare_runs
from ckptbench.analysis.marks import Thresholds
from ckptbench.cli.main import app
from ckptbench.results.store import Run, load_run

TEN = Path(__file__).parent / "fixtures" / "ten_cpu"
GATES = Gates(time_pct=5.0, new_oom=True)


@pytest.fixture(scope="module")
def runs() -> list[Run]:
    return [load_run(TEN / f"r{i}") for i in range(10)]


def test_ten_back_to_back_cpu_sweeps_raise_no_false_alarm(runs: list[Run]) -> None:
    failures, unjudged = [], 0
    for base, new in itertools.permutations(runs, 2):  # 90 ordered pairs, 12 points each
        comp = compare_runs(base, new, gates=GATES, thresholds=Thresholds())
        assert comp.summary["matched"] == 12
        failures += comp.gate_failures
        unjudged += bool(comp.gate_errors)
    assert failures == []
    # Pairs where a busy host slowed a point beyond 5% are said to be unjudgeable (exit 2), not passed.
    assert unjudged == 76
    result = CliRunner().invoke(app, ["compare", str(TEN / "r0"), str(TEN / "r6"), "--fail-time", "5"])
    assert result.exit_code == 2, result.output  # r6's first points ran 4x slower on a busy host
    assert "cannot judge 4 point(s) slower by more than 5% but measured on a busy host" in result.stderr


def _slowed(src: Path, dst: Path, *, layout: str, batch_size: int, factor: float) -> Path:
    shutil.copytree(src, dst)
    lines = []
    for line in (src / "points.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if (rec["key"]["layout"], rec["key"]["batch_size"]) == (layout, batch_size):
            rec["step_times_s"] = [t * factor for t in rec["step_times_s"]]
        lines.append(json.dumps(rec, sort_keys=True))
    (dst / "points.jsonl").write_text("\n".join(lines) + "\n")
    return dst


def test_a_3x_slowdown_of_one_point_exits_3(tmp_path: Path) -> None:
    slow = _slowed(TEN / "r1", tmp_path / "r1-slow", layout="every:2", batch_size=2, factor=3.0)
    result = CliRunner().invoke(app, ["compare", str(TEN / "r0"), str(slow), "--fail-time", "5"])
    assert result.exit_code == 3, result.output
    failed = [line for line in result.stderr.splitlines() if line.startswith("gate failed")]
    assert failed == [
        "gate failed: every:2 b=2 s=128 fp32: median step time +231.44% > 5% (ranges disjoint, n=3/3: 1 in 20 by "
        "chance with no change; ranges 218% apart (at least 150% needed on a CPU))"
    ]


def test_a_3x_slowdown_is_caught_in_most_unflagged_pairs(runs: list[Run]) -> None:
    """Every unflagged point of every pair slowed 3x in turn: how often the CPU rule sees it."""
    caught = total = 0
    for base, new in itertools.permutations(runs, 2):
        base_pts = {r.key_id: r for r in base.points}
        for rec in new.points:
            old = base_pts[rec.key_id]
            if {"busy", "spread"} & {*rec.warning_kinds, *old.warning_kinds}:
                continue
            slowed = rec.model_copy(update={"step_times_s": [t * 3 for t in rec.step_times_s]})
            one = Run(path=Path("x"), meta=new.meta, points=[slowed])
            comp = compare_runs(Run(path=Path("b"), meta=base.meta, points=[old]), one, gates=GATES)
            caught += bool(comp.gate_failures)
            total += 1
    assert (caught, total) == (90, 98)
