"""recommend: Pareto front on hand-built data, the best point under a budget on fixture runs, no-fit, JSON."""

from __future__ import annotations

import importlib.util
import io
import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console
from typer.testing import CliRunner

from ckptbench.analysis.recommend import RecommendCandidate, candidates, pareto_front, recommend
from ckptbench.cli.main import app
from ckptbench.config.grid import KEY_FILLS
from ckptbench.errors import ConfigError
from ckptbench.render.recommend import rich_recommendation
from ckptbench.results.meta import RunMeta
from ckptbench.results.record import PointRecord
from ckptbench.results.store import Run, load_run
from ckptbench.units import GIB, MIB, parse_headroom, parse_size
from tests._known import known

# Estimates of one config are made once per process and shared (tests/_est_shared.py).
pytestmark = pytest.mark.usefixtures("shared_estimates")

FIXTURES = Path(__file__).parent / "fixtures"
SYNTHETIC = FIXTURES / "report_runs" / "synthetic-h200-llama7b"
TINY = FIXTURES / "report_runs" / "tiny-capped"


def point(layout: str, batch: int, mem_mib: float, tps: float, **extra: Any) -> dict[str, Any]:
    """A minimal ok point record: ``mem_mib`` reserved (allocated 1 MiB less), ``tps`` tokens/s."""
    reserved = int(mem_mib * MIB)
    rec = {
        "key": {"layout": layout, "batch_size": batch, "seq_len": 128, "precision": "fp32", "model": "tiny"},
        "status": "ok",
        "step_times_s": [1000 / tps] * 3,
        "tokens_per_step": 1000,
        "peak_allocated_bytes": reserved - MIB,
        "peak_reserved_bytes": reserved,
        "memory": {"params_bytes": 2 * MIB, "grads_bytes": 2 * MIB, "optimizer_state_bytes": 4 * MIB},
        "layers_checkpointed": "-",
    }
    rec.update(extra)
    return rec


def not_ok(layout: str, batch: int, status: str = "oom") -> dict[str, Any]:
    return {"key": {"layout": layout, "batch_size": batch, "seq_len": 128}, "status": status, "reason": "x"}


def run_of(points: list[dict[str, Any]]) -> Run:
    records = [PointRecord.model_validate(p) for p in points]
    return Run(path=Path("hand-built"), meta=RunMeta(schema_version=1), points=records)


def labels(cands: list[RecommendCandidate]) -> list[str]:
    return [c.label for c in cands]


# ------------------------------------------------------------------ Pareto front


def test_pareto_front_exact_on_hand_built_data() -> None:
    run = run_of(
        [
            point("a", 1, 10, 100),
            point("b", 1, 20, 300),
            point("c", 1, 20, 200),  # same memory as b, slower: dominated
            point("d", 1, 15, 90),  # more memory than a, slower: dominated
            point("e", 1, 30, 300),  # as fast as b, more memory: dominated
            point("f", 1, 40, 500),
            point("g", 1, 10, 100),  # exact duplicate of a: neither dominates the other
            not_ok("h", 1),  # did not run: never on the front
            point("i", 1, 5, 50),
        ]
    )
    front = pareto_front(candidates(run))
    assert labels(front) == ["i b=1 s=128", "a b=1 s=128", "g b=1 s=128", "b b=1 s=128", "f b=1 s=128"]


def test_pareto_uses_peak_reserved_not_allocated() -> None:
    low_alloc = point("x", 1, 50, 100, peak_allocated_bytes=1 * MIB)  # reserved 50 MiB
    run = run_of([low_alloc, point("y", 1, 20, 200)])
    assert labels(pareto_front(candidates(run))) == ["y b=1 s=128"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 12), st.integers(1, 12)), min_size=1, max_size=14))
def test_pareto_front_matches_the_definition(pairs: list[tuple[int, int]]) -> None:
    run = run_of([point(f"l{i}", 1, mem, tps) for i, (mem, tps) in enumerate(pairs)])
    cands = candidates(run)
    front = pareto_front(cands)

    def beats(o: RecommendCandidate, c: RecommendCandidate) -> bool:
        better_or_equal = o.memory_bytes <= c.memory_bytes and o.tokens_per_s >= c.tokens_per_s
        return better_or_equal and (o.memory_bytes < c.memory_bytes or o.tokens_per_s > c.tokens_per_s)

    expected = {c.index for c in cands if not any(beats(o, c) for o in cands)}
    assert {c.index for c in front} == expected
    mems = [c.memory_bytes for c in front]
    assert mems == sorted(mems)
    for a, b in itertools.pairwise(front):  # along the front, more memory buys more speed
        same = (b.memory_bytes, b.tokens_per_s) == (a.memory_bytes, a.tokens_per_s)
        assert b.tokens_per_s > a.tokens_per_s or same


# ------------------------------------------------------------------ best under a budget


@pytest.mark.parametrize("fixture", [SYNTHETIC, TINY])
@pytest.mark.parametrize("fraction", [0.3, 0.45, 0.55, 0.7, 0.85, 1.0, 1.2])
def test_best_fits_and_nothing_that_fits_is_faster(fixture: Path, fraction: float) -> None:
    run = load_run(fixture)
    cands = candidates(run)
    budget = int(max(c.memory_bytes for c in cands) * fraction)
    headroom = parse_headroom("5%", budget_bytes=budget)
    rec = recommend(run, budget_bytes=budget, headroom_bytes=headroom)
    fitting = [c for c in cands if c.memory_bytes + headroom <= budget]
    if not fitting:
        assert rec.best is None
        assert rec.smallest is not None and rec.smallest.memory_bytes == min(c.memory_bytes for c in cands)
        return
    assert rec.best is not None
    assert rec.best.memory_bytes + headroom <= budget
    assert all(c.tokens_per_s <= rec.best.tokens_per_s for c in fitting)
    # one runner-up per other layout that has a fitting point, each that layout's fastest fitting point
    other_layouts = {c.layout for c in fitting} - {rec.best.layout}
    assert {c.layout for c in rec.runners_up} == other_layouts
    for r in rec.runners_up:
        assert r.tokens_per_s == max(c.tokens_per_s for c in fitting if c.layout == r.layout)
    speeds = [r.tokens_per_s for r in rec.runners_up]
    assert speeds == sorted(speeds, reverse=True)


def test_synthetic_80_gib_answer_and_why() -> None:
    rec = recommend(load_run(SYNTHETIC), budget_bytes=80 * GIB, headroom_bytes=4 * GIB)
    assert rec.best is not None and rec.best.label == "none b=2 s=2048"
    assert rec.runners_up[0].label == "every:2 b=4 s=2048"
    assert rec.why.startswith("none b=2 s=2048 is the fastest point that fits: 10,666 tokens/s at 72.42 GiB")
    assert "optimizer state dominates with 36%" in rec.why
    assert "leaving 3.58 GiB free under the 76.00 GiB limit (80.00 GiB budget minus 4.00 GiB headroom)" in rec.why
    assert "The fastest point overall, none b=8 s=2048, needs 134.06 GiB." in rec.why
    assert rec.skipped_statuses == {"oom": 7, "skipped": 6}


def test_headroom_boundary_is_inclusive() -> None:
    run = run_of([point("a", 1, 90, 100), point("b", 1, 80, 50)])
    budget = 100 * MIB
    assert known(recommend(run, budget_bytes=budget, headroom_bytes=10 * MIB).best).label == "a b=1 s=128"
    assert known(recommend(run, budget_bytes=budget, headroom_bytes=10 * MIB + 1).best).label == "b b=1 s=128"


def test_ties_go_to_less_memory() -> None:
    run = run_of([point("a", 1, 30, 100), point("b", 1, 20, 100)])
    assert known(recommend(run, budget_bytes=GIB, headroom_bytes=0).best).label == "b b=1 s=128"


def test_no_fit_names_the_smallest_point() -> None:
    rec = recommend(load_run(SYNTHETIC), budget_bytes=40 * GIB, headroom_bytes=2 * GIB)
    assert rec.best is None and rec.runners_up == []
    assert rec.smallest is not None and rec.smallest.label == "all b=1 s=2048"
    assert rec.why == (
        "Nothing fits under 40.00 GiB with 2.00 GiB headroom: the smallest point, all b=1 s=2048, "
        "needs 53.48 GiB peak reserved, 15.48 GiB over the 38.00 GiB limit."
    )
    assert len(rec.no_fit_layouts) == 8  # every layout, each with its smallest point
    assert rec.to_json()["best"] is None and rec.to_json()["fits"] is False


def test_no_ok_point_at_all() -> None:
    rec = recommend(run_of([not_ok("a", 1), not_ok("b", 1, "error")]), budget_bytes=GIB, headroom_bytes=0)
    assert rec.best is None and rec.smallest is None and rec.pareto == []
    assert rec.why == "Nothing fits under 1.00 GiB: no point of the run finished ok (2 points)."


def test_seq_len_filter() -> None:
    run = load_run(SYNTHETIC)
    rec = recommend(run, budget_bytes=80 * GIB, headroom_bytes=4 * GIB, seq_len=4096)
    assert rec.best is not None and rec.best.key["seq_len"] == 4096
    assert all(c.key["seq_len"] == 4096 for c in rec.pareto)
    with pytest.raises(ConfigError, match=r"--seq-len: the run has no point with seq_len 999"):
        recommend(run, budget_bytes=80 * GIB, headroom_bytes=0, seq_len=999)


def test_json_shape() -> None:
    data = recommend(load_run(SYNTHETIC), budget_bytes=80 * GIB, headroom_bytes=4 * GIB).to_json()
    assert data["budget_bytes"] == 80 * GIB and data["headroom_bytes"] == 4 * GIB
    assert data["limit_bytes"] == 76 * GIB and data["memory_metric"] == "needed_bytes"
    best = data["best"]
    assert {"key", "peak_allocated_bytes", "peak_reserved_bytes", "tokens_per_s"} <= set(best)
    assert best["key"] == {  # written with six fields; loading completes the key with the defaults
        **KEY_FILLS, "batch_size": 2, "layout": "none", "model": "llama-7b", "optimizer": "adamw_fused",
        "precision": "bf16", "seq_len": 2048,
    }
    assert best["fits"] is True and best["needed_bytes"] <= data["limit_bytes"]
    assert set(best["memory"]) == {"params_bytes", "grads_bytes", "optimizer_state_bytes", "activation_bytes"}
    assert [p["label"] for p in data["pareto"]][:2] == ["all b=1 s=2048", "all b=2 s=2048"]
    assert all(isinstance(p["tokens_per_s"], float) for p in data["pareto"])


def test_notes_and_within_noise() -> None:
    noisy = point("a", 1, 20, 100, step_times_s=[8.0, 10.0, 12.0])  # median 10 s, IQR 2 s: 20% spread
    close = point("b", 1, 20, 90, loss_check={"match": False})
    rec = recommend(run_of([noisy, close]), budget_bytes=GIB, headroom_bytes=0)
    assert known(rec.best).label == "a b=1 s=128"
    assert labels(rec.within_noise) == ["b b=1 s=128"]
    assert rec.runners_up[0].notes == ("loss differs from its reference (loss_check)",)


def test_rich_rendering_golden() -> None:
    points = [point("none", 1, 30, 200), point("all", 1, 20, 150), point("all", 2, 28, 180)]
    points.append(not_ok("none", 2))
    rec = recommend(run_of(points), budget_bytes=29 * MIB, headroom_bytes=0)
    out = io.StringIO()
    console = Console(file=out, width=126, color_system=None, legacy_windows=False)
    console.print(rich_recommendation(rec))
    text = "\n".join(line.rstrip() for line in out.getvalue().splitlines()) + "\n"
    assert text == (FIXTURES / "report_runs" / "recommend_golden.txt").read_text(encoding="utf-8")


# ------------------------------------------------------------------ sizes


@pytest.mark.parametrize(
    ("text", "expected"),
    [("80", 80 * GIB), ("80GiB", 80 * GIB), ("1.5 GiB", 3 * GIB // 2), ("512MiB", 512 * MIB), ("8b", 8)],
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["abc", "-3", "0", "80GB", "nan", "inf", ""])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ConfigError, match="--budget"):
        parse_size(text)


def test_parse_headroom() -> None:
    assert parse_headroom("5%", budget_bytes=80 * GIB) == 4 * GIB
    assert parse_headroom("2", budget_bytes=80 * GIB) == 2 * GIB
    assert parse_headroom("0", budget_bytes=80 * GIB) == 0
    for bad in ("100%", "x%", "-1%", "80GiB", "abc"):
        with pytest.raises(ConfigError, match="--headroom"):
            parse_headroom(bad, budget_bytes=80 * GIB)


# ------------------------------------------------------------------ the synthetic fixture is reproducible


def test_synthetic_fixture_matches_its_generator(tmp_path: Path) -> None:
    script = FIXTURES / "make_report_fixtures.py"
    spec = importlib.util.spec_from_file_location("make_report_fixtures", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = module.main(tmp_path)
    for name in ("run.json", "points.jsonl"):
        assert (out / name).read_text() == (SYNTHETIC / name).read_text(), name


def test_a_point_fits_a_card_only_with_the_cuda_context_counted() -> None:
    """`none` b=2 on the H200 reserved 63.22 GiB; with the card's measured context (0.74 GiB) it needs 63.96
    GiB, so it does not fit 63.5 GiB: the recommendation moves to the next fastest point."""
    from ckptbench.analysis.recommend import recommend
    from ckptbench.estimator.gpus import gpu_model
    from ckptbench.results.store import load_run

    run_dir = Path(__file__).parents[1] / "results" / "h200-gpu-check-2" / "check"
    if not (run_dir / "points.jsonl").exists():
        pytest.skip("no H200 results in this checkout")
    rec = recommend(load_run(run_dir), budget_bytes=int(63.5 * 2**30), headroom_bytes=0)
    context = gpu_model("h200").context_bytes
    assert rec.best is not None and rec.best.layout != "none"
    none = next(c for c in rec.no_fit_layouts if c.layout == "none")
    assert none.peak_reserved_bytes is not None and none.peak_reserved_bytes < 63.5 * 2**30
    assert none.memory_bytes == none.peak_reserved_bytes + context and none.context_bytes == context
    assert rec.best.label == "last:6 b=2 s=2048"
    assert "at 61.14 GiB peak reserved, 61.88 GiB needed with the 0.74 GiB CUDA context (59.37 GiB allocated" in rec.why


AXES_RUN = Path(__file__).parents[1] / "results" / "h200-gpu-check-1" / "axes"


def test_lora_and_other_optimizers_are_never_recommended_unless_allowed() -> None:
    core_recommend = recommend
    run = load_run(AXES_RUN)
    budget, headroom = int(79.25 * GIB), int(79.25 * GIB * 0.05)
    plain = core_recommend(run, budget_bytes=budget, headroom_bytes=headroom)
    assert plain.best is not None and plain.best.key["lora"] == "none" and plain.best.key["optimizer"] == "adamw_fused"
    every = [c for c in (plain.best, *plain.runners_up, *plain.pareto, plain.fastest, plain.smallest) if c]
    assert all(c.key["lora"] == "none" and c.key["optimizer"] in ("adamw_fused", "adamw_foreach") for c in every)
    assert plain.other_training_allow == ("8bit", "factored", "lora", "optimizer")
    assert len(plain.other_training) == 5
    allowed = core_recommend(run, allow=("lora",), budget_bytes=budget, headroom_bytes=headroom)
    assert allowed.best is not None and allowed.best.key["lora"] == "r16"  # 11,767 tokens/s, the pick
    assert allowed.other_training_allow == ("8bit", "factored", "optimizer")
    result = CliRunner().invoke(app, ["recommend", str(AXES_RUN), "--budget", "79.25", "--format", "json"])
    data = json.loads(result.stdout)
    assert data["best"]["key"]["lora"] == "none"
    assert data["other_training"]["none b=2 s=2048 attn_implementation=sdpa lora=r16 micro_batches=1 offload=none "
                                  "optimizer=adamw_fused"].startswith("lora=r16: LoRA adapters")
    bad = CliRunner().invoke(app, ["recommend", str(AXES_RUN), "--budget", "80", "--allow", "nosuch"])
    assert bad.exit_code == 2
    assert "--allow: 'nosuch' is not one of lora, 8bit, factored, offload_optimizer, optimizer" in bad.stderr


def test_answers_never_pick_a_lora_point_as_the_fastest_that_fits() -> None:
    result = CliRunner().invoke(app, ["answers", str(AXES_RUN)])
    assert result.exit_code == 0, result.output
    card = result.stdout.split("## How many layers should I checkpoint", 1)[1].split("\n## ", 1)[0]
    assert "lora=" not in card and "optimizer=" not in card
