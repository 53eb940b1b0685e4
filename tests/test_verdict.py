"""The step-time verdict with few samples: which rule decides, how sure it says it is, and gates that fire.

The few* fixture runs (tests/fixtures/runs/) are a real tiny sweep with 3 measured steps and variants
derived from it by tests/fixtures/make_fixtures.py --few (3x and 91x slower on one point; 1 step).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ckptbench.analysis.verdict import (
    MANN_WHITNEY,
    RANGES_DISJOINT,
    can_decide,
    least_decidable,
    mann_whitney_can_fire,
    time_verdict,
)
from ckptbench.cli.main import app

RUNS = Path(__file__).parent / "fixtures" / "runs"
NONE_B1 = "none b=1 s=64 fp32"
BASE3 = [0.2110, 0.1938, 0.2153]  # the few run's none b=1 steps (seconds)


def verdict(base: list[float], new: list[float], *, noise: float = 0.02) -> Any:
    return time_verdict(base, new, time_rtol=noise, alpha=0.05)


def cli(*args: str) -> Any:
    return CliRunner().invoke(app, ["compare", "--results", str(RUNS), *args])


def test_three_steps_each_with_disjoint_ranges_are_a_change() -> None:
    slow = verdict(BASE3, [3 * t for t in BASE3])
    assert (slow.mark, slow.rule, slow.n_base, slow.n_new) == ("worse", RANGES_DISJOINT, 3, 3)
    assert slow.p_value == pytest.approx(0.1)  # what the test alone says: never below 0.05 with 3 and 3
    assert slow.evidence == "ranges disjoint, n=3/3: 1 in 20 by chance with no change"
    fast = verdict(BASE3, [t / 3 for t in BASE3])
    assert (fast.mark, fast.rule) == ("better", RANGES_DISJOINT)


def test_overlapping_or_small_changes_are_noise() -> None:
    overlap = verdict(BASE3, [0.2000, 0.2200, 0.2300])  # slower median, but the ranges overlap
    assert (overlap.mark, overlap.rule) == ("within noise", None)
    assert overlap.evidence.startswith("ranges overlap and p=")
    small = verdict([1.000, 1.001, 1.002], [1.010, 1.011, 1.012])  # disjoint, but only 1% slower
    assert (small.mark, small.rule) == ("within noise", RANGES_DISJOINT)
    assert small.evidence.endswith("the median moved 1.0%, inside the 2% noise band")
    same = verdict(BASE3, list(BASE3))
    assert (same.mark, same.p_value) == ("within noise", 1.0)


def test_many_steps_are_judged_by_the_mann_whitney_test() -> None:
    base = [1.0 + 0.01 * i for i in range(10)]
    new = [t + 0.05 for t in base]  # overlapping ranges, yet clearly shifted
    v = verdict(base, new)
    assert (v.mark, v.rule) == ("worse", MANN_WHITNEY)
    assert v.p_value is not None and v.p_value < 0.05
    assert v.evidence.startswith("p=") and v.evidence.endswith(", Mann-Whitney, n=10/10")


@pytest.mark.parametrize(
    ("n", "m", "decidable", "test_fires"),
    [(1, 1, False, False), (2, 2, False, False), (2, 4, False, False), (2, 5, True, False),
     (3, 3, True, False), (3, 4, True, False), (4, 4, True, True), (1, 19, True, False), (10, 10, True, True)],
)
def test_which_sample_sizes_can_give_a_verdict(n: int, m: int, decidable: bool, test_fires: bool) -> None:
    assert can_decide(n, m, alpha=0.05) is decidable
    assert mann_whitney_can_fire(n, m, alpha=0.05) is test_fires
    v = verdict([1.0] * n, [3.0] * m)
    assert v.mark == ("worse" if decidable else "too few samples")


def test_too_few_samples_say_so() -> None:
    v = verdict([0.2], [6.0])  # 30x slower, but one step each proves nothing
    assert (v.mark, v.rule) == ("too few samples", None)
    assert v.evidence == "too few measured steps for a time verdict (n=1/1; at least 3 and 3 needed)"
    assert least_decidable(0.05) == 3 and least_decidable(0.01) == 5  # 1/C(10, 5) = 1/252


# ---------------------------------------------------------------- gates on the few-steps runs


def test_a_3x_slowdown_on_a_busy_host_is_not_judged_and_the_gate_exits_2() -> None:
    # Every point of the few-steps fixtures was measured while the host was busy: a 3x slowdown there is
    # what a busy host also produces (tests/test_false_alarms.py), so the gate neither passes nor fails.
    result = cli("few", "few-slow3x", "--fail-time", "5")
    assert result.exit_code == 2, result.output
    assert (
        "error: --fail-time cannot judge 1 point(s) slower by more than 5% but measured on a busy host or with "
        "unsteady steps (rerun them on a quiet host): none b=1 s=64 fp32"
    ) in result.stderr
    assert (
        f"{NONE_B1}: step time not judged (noisy steps): ranges disjoint, n=3/3: 1 in 20 by chance with no change; "
        "not declared: measured while busy (base and new) (ranges 170% apart); rerun on a quiet host"
    ) in result.stdout
    assert "1 noisy steps" in result.stdout


def test_identical_runs_with_3_steps_exit_0() -> None:
    result = cli("few", "few", "--fail-time", "5", "--fail-memory", "0")
    assert result.exit_code == 0, result.output
    assert "4 matched points: 0 worse, 0 better, 4 unchanged" in result.stdout


def test_the_91x_case_is_flagged_and_shown_by_only_changed() -> None:
    result = cli("few", "few-slow91x", "--only-changed", "--format", "markdown")
    assert result.exit_code == 0  # no gate asked for: a report
    rows = [line for line in result.stdout.splitlines() if line.startswith("| none b=1")]
    assert [r.split(" | ")[1:] for r in rows] == [
        ["step time (median)", "211.0 ms", "19205.1 ms", "+18994.1 ms", "91.000", "disjoint", "noisy steps |"],
        ["tokens/s", "303", "3", "-300", "0.011", "disjoint", "noisy steps |"],
    ]
    data = json.loads(cli("few", "few-slow91x", "--format", "json").stdout)
    step = next(m for p in data["points"] if p["label"] == NONE_B1 for m in p["metrics"]
                if m["metric"] == "median_step_time_s")
    assert (step["mark"], step["rule"], step["n_base"], step["n_new"]) == ("noisy steps", "ranges disjoint", 3, 3)
    assert cli("few", "few-slow91x", "--fail-time", "5").exit_code == 2


def test_one_step_each_fails_the_time_gate_loudly() -> None:
    plain = cli("few-one", "few-one")
    assert plain.exit_code == 0  # no gate: the rows say why nothing is claimed
    assert plain.stdout.count("│ too few samples") == 8  # step time and tokens/s of 4 points
    assert "4 too few samples" in plain.stdout
    gated = cli("few-one", "few-one", "--fail-time", "5")
    assert gated.exit_code == 2
    assert (
        "error: --fail-time cannot judge 4 point(s): too few measured steps for a time verdict (n=1/1; "
        "at least 3 and 3 needed): none b=1 s=64 fp32, none b=2 s=64 fp32, all b=1 s=64 fp32 and 1 more"
    ) in gated.stderr
    assert "too few samples" in gated.stdout  # the comparison is still printed
    data = json.loads(cli("few-one", "few-one", "--fail-time", "5", "--format", "json").stdout)
    assert data["summary"]["too_few_samples"] == 4 and data["gate_failures"] == []
    assert data["gate_errors"][0].startswith("--fail-time cannot judge 4 point(s)")
    # Memory gates alone still judge one-step runs.
    assert cli("few-one", "few-one", "--fail-memory", "1").exit_code == 0
