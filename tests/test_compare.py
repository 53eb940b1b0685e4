"""ckptbench compare: matching, marks, environment, gates and output formats on committed fixture runs.

The fixtures (tests/fixtures/runs/) are one real tiny sweep (``base``) and variants derived from it
by tests/fixtures/make_fixtures.py, each with one known change.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ckptbench.analysis.compare import Gates, compare_refs, compare_runs, point_labels
from ckptbench.analysis.marks import Thresholds, compare_point, memory_mark
from ckptbench.analysis.verdict import NOISE
from ckptbench.cli.main import app
from ckptbench.results.meta import RunEnvironment, RunMeta
from ckptbench.results.record import PointRecord, Scalar
from ckptbench.results.store import Run

RUNS = Path(__file__).parent / "fixtures" / "runs"
GOLDEN = Path(__file__).parent / "fixtures" / "golden"
NONE_B2 = "none b=2 s=64 fp32"
NONE_B1 = "none b=1 s=64 fp32"


def cli(*args: str) -> Any:
    return CliRunner().invoke(app, ["compare", *args])


def comp(new: str, base: str = "base", **kwargs: Any) -> Any:
    return compare_refs(RUNS / base, RUNS / new, **kwargs)


def point(comparison: Any, label: str) -> Any:
    return next(p for p in comparison.points if p.label == label)


def metric(comparison: Any, label: str, name: str) -> Any:
    return next(m for m in point(comparison, label).metrics if m.metric == name)


def test_identical_runs_show_no_change_and_exit_0() -> None:
    c = comp("base")
    assert [p.mark for p in c.points] == ["unchanged"] * 4
    assert {m.mark for p in c.points for m in p.metrics} == {"unchanged", "within noise"}
    assert c.summary["time_ratio_geomean"] == 1.0
    assert c.environment_differences == [] and c.notes == [] and c.gate_failures == []
    result = cli(str(RUNS / "base"), str(RUNS / "base"), "--fail-memory", "0", "--fail-time", "0")
    assert result.exit_code == 0, result.output
    assert "4 matched points: 0 worse, 0 better, 4 unchanged" in result.stdout


def test_ten_percent_memory_increase_is_worse_and_gated() -> None:
    c = comp("mem10")
    assert [(p.label, p.mark) for p in c.points if p.mark != "unchanged"] == [(NONE_B2, "worse")]
    peak = metric(c, NONE_B2, "peak_allocated_bytes")
    assert peak.ratio == pytest.approx(1.10, abs=1e-6) and peak.mark == "worse"
    assert peak.delta == peak.new - peak.base > 0
    assert metric(c, NONE_B2, "activation_bytes").mark == "worse"
    assert metric(c, NONE_B2, "median_step_time_s").mark == NOISE
    result = cli(str(RUNS / "base"), str(RUNS / "mem10"), "--fail-memory", "2")
    assert result.exit_code == 3
    assert "gate failed: none b=2 s=64 fp32: peak allocated +10.00% > 2%" in result.stderr
    assert cli(str(RUNS / "base"), str(RUNS / "mem10"), "--fail-memory", "10.5").exit_code == 0


def test_rich_table_rows() -> None:
    lines = cli(str(RUNS / "base"), str(RUNS / "mem10"), "--only-changed").stdout.splitlines()
    assert lines[0] == "ckptbench compare: base -> mem10"
    assert lines[4:7] == [
        "│ none b=2 s=64 fp32 │ peak allocated │ 30.39 MiB │ 33.43 MiB │ +3.04 MiB │ 1.100 │ - │ worse │",
        "│ none b=2 s=64 fp32 │ peak reserved  │ 30.39 MiB │ 33.43 MiB │ +3.04 MiB │ 1.100 │ - │ worse │",
        "│ none b=2 s=64 fp32 │ activation     │  4.86 MiB │  7.90 MiB │ +3.04 MiB │ 1.625 │ - │ worse │",
    ]
    assert lines[8] == "base and new: measured by each run"
    assert lines[9].startswith("4 matched points: 1 worse, 0 better, 3 unchanged, 0 newly oom")


def test_memory_tolerance_is_configurable() -> None:
    c = comp("mem10", thresholds=Thresholds(memory_rtol=0.2))
    assert metric(c, NONE_B2, "peak_allocated_bytes").mark == "unchanged"
    assert metric(c, NONE_B2, "activation_bytes").mark == "worse"  # +62.5% of a small part
    assert memory_mark(1000.0, 1001.0, rtol=0.001) == "unchanged"
    assert memory_mark(1000.0, 1002.0, rtol=0.001) == "worse"
    assert memory_mark(1000.0, 900.0, rtol=0.001) == "better"


def test_time_change_inside_noise_is_not_flagged() -> None:
    c = comp("noise")
    for p in c.points:
        step = next(m for m in p.metrics if m.metric == "median_step_time_s")
        # 3% slower: beyond the 2% noise band, but not significant against the step-to-step spread.
        assert step.ratio == pytest.approx(1.03, abs=1e-9)
        assert step.p_value is not None and step.p_value >= 0.05
        assert step.mark == NOISE and p.mark == "unchanged"
    result = cli(str(RUNS / "base"), str(RUNS / "noise"), "--fail-time", "2")
    assert result.exit_code == 0, result.stderr


def gpu_copy(tmp_path: Path, name: str) -> Path:
    """A fixture run as if measured on a GPU (clean step-time evidence: no CPU, no busy/spread flag)."""
    src, dst = RUNS / name, tmp_path / name
    dst.mkdir()
    meta = json.loads((src / "run.json").read_text())
    meta["environment"] = {**meta["environment"], "device_type": "cuda", "gpu_name": "NVIDIA H200"}
    (dst / "run.json").write_text(json.dumps(meta))
    (dst / "points.jsonl").write_text((src / "points.jsonl").read_text())
    return dst


def test_large_significant_time_regression_is_flagged_and_gated(tmp_path: Path) -> None:
    base, slow = gpu_copy(tmp_path, "base"), gpu_copy(tmp_path, "slow")
    c = compare_refs(base, slow)
    step = metric(c, NONE_B1, "median_step_time_s")
    assert step.ratio == pytest.approx(2.0) and step.p_value < 0.01 and step.mark == "worse"
    # Significant over all four points (Benjamini-Hochberg), not just on its own.
    assert step.evidence.endswith("; Benjamini-Hochberg p=0.0088 over 4 points")
    tokens = metric(c, NONE_B1, "tokens_per_s")
    assert tokens.ratio == pytest.approx(0.5) and tokens.mark == "worse"
    assert [(p.label, p.mark) for p in c.points if p.mark != "unchanged"] == [(NONE_B1, "worse")]
    assert c.summary["time_ratio_max"] == pytest.approx(2.0)
    assert c.summary["time_ratio_geomean"] == pytest.approx(2.0 ** (1 / 4))
    result = cli(str(base), str(slow), "--fail-time", "5")
    assert result.exit_code == 3
    assert "gate failed: none b=1 s=64 fp32: median step time +100.00% > 5% (p=" in result.stderr
    assert cli(str(base), str(slow), "--fail-time", "101").exit_code == 0
    # Faster is better, never a gate failure.
    back = cli(str(slow), str(base), "--fail-time", "5", "--format", "json")
    assert back.exit_code == 0
    assert json.loads(back.stdout)["summary"]["better"] == 1


def test_the_same_slowdown_on_a_cpu_is_not_declared_on_p_values() -> None:
    # The CPU runs' ranges overlap: a p-value over steps a busy host slows together is no evidence.
    c = comp("slow")
    step = metric(c, NONE_B1, "median_step_time_s")
    assert step.p_value < 0.01 and step.mark == NOISE and point(c, NONE_B1).mark == "unchanged"
    assert step.evidence.endswith("; not declared: ranges overlap, at least 150% needed on a CPU")
    assert cli(str(RUNS / "base"), str(RUNS / "slow"), "--fail-time", "5").exit_code == 0


def test_new_oom_is_flagged_and_gated() -> None:
    c = comp("oom")
    p = point(c, NONE_B2)
    assert (p.base_status, p.new_status, p.mark) == ("ok", "oom", "newly oom")
    assert p.note.startswith("new: CPU tracker: tried to allocate")
    assert c.summary["newly_oom"] == 1 and c.summary["unchanged"] == 3
    base, oom = str(RUNS / "base"), str(RUNS / "oom")
    plain = cli(base, oom)
    assert plain.exit_code == 0  # no gate asked for: a report only
    assert "none b=2 s=64 fp32: new: CPU tracker: tried to allocate 2.00 MiB" in plain.stdout
    for gate in (["--fail-oom"], ["--fail-memory", "50"], ["--fail-time", "50"]):
        result = cli(base, oom, *gate)
        assert result.exit_code == 3, gate
        assert "gate failed: none b=2 s=64 fp32: newly out of memory" in result.stderr
    back = compare_refs(RUNS / "oom", RUNS / "base", gates=Gates(new_oom=True, memory_pct=2))
    assert point(back, NONE_B2).mark == "no longer oom" and back.gate_failures == []


def test_added_and_removed_points_are_listed() -> None:
    c = comp("grid")
    assert [a["label"] for a in c.added] == ["every:2 b=1 s=64 fp32"]
    assert [r["label"] for r in c.removed] == ["all b=2 s=64 fp32"]
    assert (c.summary["matched"], c.summary["added"], c.summary["removed"]) == (3, 1, 1)
    result = cli(str(RUNS / "base"), str(RUNS / "grid"))
    assert result.exit_code == 0
    assert "added (only in grid): every:2 b=1 s=64 fp32 [ok]" in result.stdout
    assert "removed (only in base): all b=2 s=64 fp32 [ok]" in result.stdout


def test_mismatched_environments_are_reported() -> None:
    c = comp("env")
    assert c.environment_differences == [
        "torch: 2.13.0+cpu -> 2.14.0+cpu",
        "transformers: 5.24.0 -> 5.25.0",
        "ckptbench_version: 0.1.0 -> 0.2.0",
        "config.model: {attn_implementation: sdpa, overrides: {}, preset: tiny} -> "
        "{attn_implementation: eager, overrides: {}, preset: tiny}",
    ]
    assert c.summary["matched"] == 4  # still compared
    result = cli(str(RUNS / "base"), str(RUNS / "env"))
    assert "warning: environment differs: torch: 2.13.0+cpu -> 2.14.0+cpu" in result.stderr
    assert "environment differs" not in result.stdout
    md = cli(str(RUNS / "base"), str(RUNS / "env"), "--format", "markdown").stdout
    assert "> environment differs: transformers: 5.24.0 -> 5.25.0  \n" in md
    assert md.index("environment differs") < md.index("| point |")


def test_interrupted_run_compares_on_what_it_holds() -> None:
    c = comp("interrupted")
    assert [p.label for p in c.points] == ["none b=1 s=64 fp32", NONE_B2]
    assert len(c.removed) == 2
    assert any("ignored a truncated last line" in n for n in c.notes)
    assert any("new run interrupted is interrupted (2 of 4 points)" in n for n in c.notes)
    assert cli(str(RUNS / "base"), str(RUNS / "interrupted"), "--fail-memory", "2").exit_code == 0


def test_json_output_parses_and_has_the_documented_fields() -> None:
    result = cli(str(RUNS / "base"), str(RUNS / "oom"), "--format", "json")
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert set(data) == {
        "schema",
        "base",
        "new",
        "thresholds",
        "environment_differences",
        "notes",
        "points",
        "added",
        "removed",
        "summary",
        "gate_failures",
        "gate_errors",
    }
    assert data["schema"] == "ckptbench.compare/1"
    assert data["base"]["name"] == "base" and data["new"]["points"] == 4
    p = next(p for p in data["points"] if p["label"] == "none b=1 s=64 fp32")
    assert set(p) == {"key", "key_id", "label", "base_status", "new_status", "mark", "metrics", "note"}
    assert p["key"]["layout"] == "none"
    assert p["key_id"].startswith(
        "allocator=default|architecture=llama|attn_implementation=sdpa|batch_size=1|compile=False|layout=none|"
    )
    assert [m["metric"] for m in p["metrics"]] == [
        "peak_allocated_bytes",
        "peak_reserved_bytes",
        "activation_bytes",
        "median_step_time_s",
        "tokens_per_s",
    ]  # MFU is absent: no peak FLOP/s on CPU
    fields = {"metric", "unit", "base", "new", "delta", "ratio", "mark", "p_value", "rule", "evidence"}
    assert set(p["metrics"][0]) == fields | {"n_base", "n_new"}
    step = next(m for m in p["metrics"] if m["metric"] == "median_step_time_s")
    assert (step["rule"], step["n_base"], step["n_new"]) == (None, 10, 10)
    assert step["evidence"].startswith("ranges overlap and p=")
    assert set(data["summary"]) >= {"worse", "better", "unchanged", "newly_oom", "time_ratio_geomean"}
    changed = json.loads(
        cli(str(RUNS / "base"), str(RUNS / "oom"), "--format", "json", "--only-changed").stdout
    )
    assert [p["mark"] for p in changed["points"]] == ["newly oom"]


def test_csv_output_has_raw_numbers() -> None:
    result = cli(str(RUNS / "base"), str(RUNS / "mem10"), "--format", "csv", "--only-changed")
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert [r["metric"] for r in rows] == ["peak_allocated_bytes", "peak_reserved_bytes", "activation_bytes"]
    assert {r["layout"] for r in rows} == {"none"} and {r["batch_size"] for r in rows} == {"2"}
    assert float(rows[0]["ratio"]) == pytest.approx(1.10, abs=1e-6)
    assert int(rows[0]["new"]) - int(rows[0]["base"]) == int(rows[0]["delta"])


def test_markdown_golden() -> None:
    result = cli(str(RUNS / "base"), str(RUNS / "mem10"), "--format", "markdown", "--fail-memory", "2")
    assert result.exit_code == 3
    assert result.stdout == (GOLDEN / "compare-base-mem10.md").read_text(encoding="utf-8")


def test_only_changed_hides_quiet_rows(tmp_path: Path) -> None:
    base, slow = gpu_copy(tmp_path, "base"), gpu_copy(tmp_path, "slow")
    md = cli(str(base), str(slow), "--format", "markdown", "--only-changed").stdout
    rows = [line for line in md.splitlines() if line.startswith(f"| {NONE_B1} |")]
    assert [r.split(" | ")[1] for r in rows] == ["step time (median)", "tokens/s"]
    assert sum(line.startswith("| ") for line in md.splitlines()) == 4  # header, rule, two rows
    table = cli(str(RUNS / "base"), str(RUNS / "base"), "--only-changed").stdout
    assert "ckptbench compare: base -> base: no changed rows" in table


def test_run_names_are_looked_up_under_results() -> None:
    result = cli("base", "mem10", "--results", str(RUNS), "--format", "json")
    assert result.exit_code == 0
    assert json.loads(result.stdout)["new"]["name"] == "mem10"


def test_missing_run_exits_2_with_one_line(tmp_path: Path) -> None:
    result = cli(str(RUNS / "base"), str(tmp_path / "nope"))
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and "no such run directory" in result.stderr
    assert "Traceback" not in result.stderr
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "run.json").write_text("{not json")
    bad = cli(str(tmp_path / "bad"), str(RUNS / "base"))
    assert bad.exit_code == 2 and bad.stderr.startswith("error:") and "unreadable" in bad.stderr


def _run(points: list[dict[str, Any]], name: str, steps: int = 10) -> Run:
    meta = {"status": "complete", "environment": {}, "config": {}}
    recs = [
        {
            "key": k,
            "status": "ok",
            "step_times_s": [0.1] * steps,
            "tokens_per_step": 8,
            "peak_allocated_bytes": 1,
        }
        for k in points
    ]
    return Run(path=Path(name), meta=RunMeta.model_validate({"schema_version": 1, **meta}),
               points=[PointRecord.model_validate(r) for r in recs])


def test_keys_with_an_extra_axis_are_matched_as_whole_dicts() -> None:
    plain = {"layout": "all", "batch_size": 1, "seq_len": 8, "precision": "bf16"}
    with_axis = {**plain, "attn": "eager"}
    c = compare_runs(_run([plain, with_axis], "a"), _run([with_axis], "b"))
    assert [p.label for p in c.points] == ["all b=1 s=8 bf16 attn=eager"]
    assert [r["label"] for r in c.removed] == ["all b=1 s=8 bf16"]
    labels = point_labels([plain, {**plain, "model": "x"}, {**plain, "model": "y"}])
    assert sorted(labels.values()) == [
        "all b=1 s=8 bf16",
        "all b=1 s=8 bf16 model=x",
        "all b=1 s=8 bf16 model=y",
    ]


def test_few_steps_are_noted_with_what_the_verdict_can_still_do() -> None:
    key = {"layout": "all", "batch_size": 1, "seq_len": 8, "precision": "bf16"}
    c = compare_runs(_run([key], "a", steps=3), _run([key], "b", steps=3))
    # The note names the rule that decides (analysis/verdict.py family_verdicts), not the per-point one.
    assert c.notes == [
        "with 3 and 3 measured steps the Mann-Whitney test cannot reach p < 0.05, so Benjamini-Hochberg over "
        "the points cannot either: a step-time change is declared only when the two runs' step times lie at "
        "least 2% apart; points flagged busy or spread are never judged; measure 10 or more steps for CI"
    ]
    cpu_a, cpu_b = _run([key], "a", steps=3), _run([key], "b", steps=3)
    for r in (cpu_a, cpu_b):
        r.meta = r.meta.model_copy(update={"environment": RunEnvironment(device_type="cpu")})
    assert compare_runs(cpu_a, cpu_b).notes == [
        "with 3 and 3 measured steps on a CPU p-values do not count (a busy host slows steps together): a "
        "step-time change is declared only when the two runs' step times lie at least 150% apart; points "
        "flagged busy or spread are never judged"
    ]
    one = compare_runs(_run([key], "a", steps=1), _run([key], "b", steps=1))
    assert one.notes == [
        "with 1 and 1 measured steps no step-time verdict is possible (at least 3 and 3 are needed): those "
        "rows say 'too few samples'; measure more steps (10 or more for CI)"
    ]
    assert compare_runs(_run([key], "a", steps=5), _run([key], "b", steps=5)).notes == []


def test_status_changes_decide_the_point_mark() -> None:
    key: dict[str, Scalar] = {"layout": "all", "batch_size": 2, "seq_len": 8, "precision": "bf16"}
    ok = _run([key], "a").points[0]
    oom = PointRecord(key=key, status="oom", reason="CUDA out of memory")
    skipped = PointRecord(key=key, status="skipped", reason="batch 1 already ran out of memory")
    t = Thresholds()
    assert compare_point(oom, oom, thresholds=t).mark == "unchanged"
    assert compare_point(oom, oom, thresholds=t).metrics == []
    assert compare_point(ok, oom, thresholds=t).mark == "newly oom"
    assert compare_point(oom, ok, thresholds=t).mark == "no longer oom"
    change = compare_point(ok, skipped, thresholds=t)
    assert (change.mark, change.note) == ("not comparable", "new: batch 1 already ran out of memory")
    # The base values are kept (what the fake record has), without ratios.
    assert [(m.metric, m.mark) for m in change.metrics] == [
        ("peak_allocated_bytes", "not comparable"),
        ("median_step_time_s", "not comparable"),
        ("tokens_per_s", "not comparable"),
    ]
    assert all(m.ratio is None and m.new is None for m in change.metrics)


# ---------------------------------------------------------------- refusals: a gate must not pass on nothing

H200 = Path(__file__).parents[1] / "results" / "h200-gpu-check-2" / "check"


def test_runs_of_different_models_are_refused_with_one_line() -> None:
    result = cli(str(H200), str(RUNS / "base"), "--fail-memory", "1", "--fail-time", "5")
    assert result.exit_code == 2
    assert result.stderr == (
        "error: compare refused: the models differ (llama-7b vs tiny) (--allow-different compares them anyway)\n"
    )
    assert result.stdout == ""


def test_runs_on_different_devices_or_gpus_are_refused(tmp_path: Path) -> None:
    gpu = gpu_copy(tmp_path, "base")
    result = cli(str(RUNS / "base"), str(gpu), "--fail-time", "5")
    assert result.exit_code == 2
    assert "compare refused: the devices differ (cpu vs cuda)" in result.stderr
    other = tmp_path / "a100"
    other.mkdir()
    meta = json.loads((gpu / "run.json").read_text())
    meta["environment"]["gpu_name"] = "NVIDIA A100-SXM4-80GB"
    (other / "run.json").write_text(json.dumps(meta))
    (other / "points.jsonl").write_text((gpu / "points.jsonl").read_text())
    result = cli(str(gpu), str(other))
    assert result.exit_code == 2
    assert "compare refused: the GPUs differ (NVIDIA H200 vs NVIDIA A100-SXM4-80GB)" in result.stderr


def test_no_matching_point_is_refused_and_allow_different_still_gates_nothing(tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "run.json").write_text((RUNS / "base" / "run.json").read_text())
    lines = [json.loads(line) for line in (RUNS / "base" / "points.jsonl").read_text().splitlines()]
    for rec in lines:
        rec["key"]["seq_len"] = 128
    (other / "points.jsonl").write_text("\n".join(json.dumps(r) for r in lines) + "\n")
    result = cli(str(RUNS / "base"), str(other), "--fail-memory", "1")
    assert result.exit_code == 2
    assert "compare refused: no point matches (4 in base, 4 in other, none with the same key)" in result.stderr
    # Allowed: the comparison is printed, but a gate with nothing to judge is not a pass.
    allowed = cli(str(RUNS / "base"), str(other), "--fail-memory", "1", "--allow-different")
    assert allowed.exit_code == 2
    assert "0 matched points" in allowed.stdout and "4 added, 4 removed" in allowed.stdout
    assert "error: no point matched: the gates have nothing to judge" in allowed.stderr
    assert "compared although no point matches" in allowed.stderr
    assert cli(str(RUNS / "base"), str(other), "--allow-different").exit_code == 0


def test_an_oom_message_is_printed_once_and_short() -> None:
    result = cli(str(H200), str(H200))
    lines = [line for line in result.stdout.splitlines() if "out of memory" in line]
    assert lines == ["none b=8 s=2048 bf16: base and new: CUDA out of memory. Tried to allocate 1.95 GiB."]


def test_base_and_new_stay_visible_at_80_columns() -> None:
    result = CliRunner(env={"COLUMNS": "80"}).invoke(app, ["compare", str(H200), str(H200)])
    header = next(line for line in result.stdout.splitlines() if line.startswith("┃ point"))
    assert [c.strip() for c in header.strip("┃").split("┃")] == ["point", "metric", "base", "new", "mark"]
    assert max(map(len, result.stdout.splitlines()[:-2])) <= 80


# --- issue 35: a gate with nothing it could judge never passes --------------------------------------------------


def _rewritten(tmp_path: Path, name: str, change: Any) -> Path:
    """A copy of the base fixture run with each record replaced by ``change(record)``."""
    run = tmp_path / name
    run.mkdir()
    (run / "run.json").write_text((RUNS / "base" / "run.json").read_text())
    records = [json.loads(line) for line in (RUNS / "base" / "points.jsonl").read_text().splitlines()]
    (run / "points.jsonl").write_text("".join(json.dumps(change(r)) + "\n" for r in records))
    return run


@pytest.mark.parametrize("status", ["error", "skipped"])
@pytest.mark.parametrize("gates", [["--fail-memory", "1", "--fail-time", "5"], ["--fail-oom"]], ids=["mem-time", "oom"])
def test_a_gate_is_not_passed_when_every_new_point_failed(tmp_path: Path, status: str, gates: list[str]) -> None:
    crashed = _rewritten(tmp_path, "new", lambda r: {"key": r["key"], "status": status})
    result = cli(str(RUNS / "base"), str(crashed), *gates)
    assert result.exit_code == 2, result.output
    assert "4 matched points" in result.stdout and "4 not comparable" in result.stdout
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: the gates judged nothing: none of the 4 matched point(s) could be compared (4 ok in the base, "
        f"{status} in the new run); a gate with nothing to judge does not pass")
    assert cli(str(RUNS / "base"), str(crashed)).exit_code == 0  # no gate asked: a comparison, not a verdict


def test_a_gate_names_the_points_that_ran_in_the_base_but_failed_in_the_new_run(tmp_path: Path) -> None:
    def crash_b2(rec: dict[str, Any]) -> dict[str, Any]:
        return {"key": rec["key"], "status": "error"} if rec["key"]["batch_size"] == 2 else rec

    half = _rewritten(tmp_path, "new", crash_b2)
    result = cli(str(RUNS / "base"), str(half), "--fail-memory", "1")
    assert result.exit_code == 2
    assert "error: the gates cannot judge 2 point(s) that ran in the base run but not in the new one (2 ok in the " \
        "base, error in the new run): none b=2 s=64 fp32, all b=2 s=64 fp32" in result.stderr


def test_a_gate_over_runs_that_mix_gpu_models_judges_nothing_and_fails(tmp_path: Path) -> None:
    """Peaks tripled in a new run whose points ran on two GPU models: every point is not comparable, so the
    memory gate cannot see the growth; it must not pass."""
    base = gpu_copy(tmp_path, "base")

    def tripled_on_two_cards(rec: dict[str, Any]) -> dict[str, Any]:
        gpu = "NVIDIA H200" if rec["key"]["layout"] == "none" else "NVIDIA H100 80GB HBM3"
        return {**rec, "peak_allocated_bytes": rec["peak_allocated_bytes"] * 3, "gpu_name": gpu}

    new = _rewritten(tmp_path, "new", tripled_on_two_cards)
    (new / "run.json").write_text((base / "run.json").read_text())
    result = cli(str(base), str(new), "--fail-memory", "1")
    assert result.exit_code == 2, result.output
    assert "none of the 4 matched point(s) could be compared (new run new ran on different GPU models " \
        "(--allow-mixed-gpus compares them anyway))" in result.stderr
    assert cli(str(base), str(new), "--fail-memory", "1", "--allow-mixed-gpus").exit_code == 3  # judged: +200%
