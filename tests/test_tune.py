"""ckptbench tune: the search against an exhaustive measurement of the same space, its prunes and
reasons, the fit judgement, the space, and the command end to end on CPU."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ckptbench.analysis.recommend import recommend
from ckptbench.analysis.tune_planner import DecisionKind, Margin, TuneCandidate, TunePlanner, predicted_fit
from ckptbench.analysis.tune_record import TuneRecord
from ckptbench.analysis.tune_space import layout_family, parse_allow, tune_space
from ckptbench.cli.main import app
from ckptbench.config.grid import Point
from ckptbench.config.load import load_config
from ckptbench.errors import ConfigError
from ckptbench.estimator.record import Estimate, Reserved
from ckptbench.results.record import PointRecord
from ckptbench.results.store import load_run
from ckptbench.search.tune_search import estimate_candidates
from tests.conftest import tiny_config

FIXTURES = Path(__file__).parent / "fixtures" / "tune"
CONFIG = FIXTURES / "tiny-tune.yaml"
# The oracle: every point of the space of tiny-tune.yaml measured by `ckptbench sweep` on this 2-core CPU
# (the tracker enforces the 36 MiB cap: points above it ran out of memory, larger batches were skipped).
ORACLE = FIXTURES / "exhaustive"
LIMIT = 36 * 2**20  # --budget 36MiB --headroom 0: the cap itself


@pytest.fixture(scope="module")
def replayed() -> tuple[TunePlanner, Any]:
    """tune's planner on the real estimates of the space, fed the oracle's measured records."""
    cfg = load_config(CONFIG)
    space = tune_space(cfg, device_type="cpu", seq_len=None, allow=())
    candidates, _ = estimate_candidates(cfg, space, limit_bytes=LIMIT, target="cpu")
    oracle = load_run(ORACLE)
    by_key = {r.key_id: r for r in oracle.points}
    planner = TunePlanner(candidates, limit_bytes=LIMIT)
    while (point := planner.next()) is not None:
        planner.observe(point, by_key[point.key_id])
    return planner, oracle


def test_tune_finds_the_exhaustive_best_with_few_measurements(replayed: tuple[TunePlanner, Any]) -> None:
    planner, oracle = replayed
    exhaustive = recommend(oracle, budget_bytes=LIMIT, headroom_bytes=0)
    assert exhaustive.best is not None and planner.best is not None
    assert planner.best.candidate.point.key == exhaustive.best.key
    space = len(oracle.points)
    assert space == 36 and len(planner.measured) <= space // 4, [m.candidate.label for m in planner.measured]


def test_every_candidate_is_decided_once_with_a_reason(replayed: tuple[TunePlanner, Any]) -> None:
    planner, oracle = replayed
    keys = [d.candidate.point.key_id for d in planner.decided]
    assert len(keys) == len(set(keys)) == len(oracle.points)
    kinds = planner.outcome().counts
    assert kinds["measured"] == len(planner.measured)
    assert kinds.get("predicted not to fit", 0) > 0 and kinds.get("a cheaper setup wins", 0) > 0
    # Measured in the planner's order: most tokens per step first.
    tokens = [m.candidate.point.tokens for m in planner.measured]
    assert tokens == sorted(tokens, reverse=True)


def test_no_point_predicted_not_to_fit_would_have_fit(replayed: tuple[TunePlanner, Any]) -> None:
    """On CPU the estimate is exact, so pruning by prediction drops only what the oracle could not fit."""
    planner, oracle = replayed
    by_key = {r.key_id: r for r in oracle.points}
    dropped = [d for d in planner.decided if d.kind is DecisionKind.PREDICTED_NOT_TO_FIT]
    assert dropped and all(d.reason.why.startswith("predicted not to fit: ") for d in dropped)
    for d in dropped:
        rec = by_key[d.candidate.point.key_id]
        assert not rec.ok or (rec.peak_reserved_bytes or 0) > LIMIT, d.candidate.label


def _estimate(
    point: Point, peak: int | None, reserved: int | None = None, *, context: int = 0, oom: bool = False
) -> Estimate:
    replay = None
    if reserved is not None or oom:  # the allocator replay on a card (a CUDA target): issue "Will it fit?"
        where = {"phase": "warm-up", "segment": "logits@0", "where": "the loss of micro-batch 0"}
        replay = Reserved(None if oom else reserved, None if oom else peak, 0, where if oom else None,
                          "h200", context, True)
    note = None if peak else "not estimated: x"
    return Estimate(point, "cuda", "fast", peak, {}, {}, None, None, note, reserved=replay)


def test_predicted_fit_uses_reserved_else_allocated_times_the_learned_margin() -> None:
    point = Point("bf16", "none", "all", 2048, 2, "llama-7b", "adamw_fused")
    margin = Margin(1.1, "test")
    assert predicted_fit(_estimate(point, 95), limit_bytes=100, margin=margin).fits is False  # 104 > 100
    assert predicted_fit(_estimate(point, 90), limit_bytes=100, margin=margin).fits is True  # 99
    # The replay's reserved, on its upper bound (results/fit.py: +0.93% for a whole-layer layout): 99 -> 100.
    assert predicted_fit(_estimate(point, 95, reserved=99), limit_bytes=100, margin=margin).fits is True
    assert predicted_fit(_estimate(point, 95, reserved=100), limit_bytes=100, margin=margin).fits is False
    unknown = predicted_fit(_estimate(point, None), limit_bytes=100, margin=margin)
    assert unknown.fits is None and unknown.basis.startswith("no prediction")


def test_predicted_fit_counts_the_cards_context_and_a_predicted_out_of_memory() -> None:
    """The replay's peak reserved plus the card's CUDA context is judged, as a measured point is."""
    point = Point("bf16", "none", "all", 2048, 2, "llama-7b", "adamw_fused")
    margin = Margin(1.0, "test")
    with_context = predicted_fit(_estimate(point, 80, reserved=95, context=6), limit_bytes=100, margin=margin)
    assert with_context.fits is False and with_context.judged_bytes == 96 + 6  # the reserved bound + the context
    assert "CUDA context" in with_context.basis and "reserved bound" in with_context.basis
    assert predicted_fit(_estimate(point, 80, reserved=93, context=6), limit_bytes=100, margin=margin).fits is True
    oom = predicted_fit(_estimate(point, 10, oom=True), limit_bytes=100, margin=margin)
    assert oom.fits is False and "run out of memory in warm-up (the loss of micro-batch 0)" in oom.basis


def test_a_measured_point_fits_with_its_context_counted() -> None:
    """Measured: peak reserved plus the memory the process held outside the allocator, as recommend counts."""
    point = Point("bf16", "none", "all", 2048, 2, "llama-7b", "adamw_fused")
    planner = TunePlanner([TuneCandidate(point, 1, _estimate(point, 90))], limit_bytes=100)
    assert planner.next() == point
    fields = {"key": point.key, "status": "ok", "step_times_s": [1.0], "peak_allocated_bytes": 90,
              "peak_reserved_bytes": 96, "context_bytes": 8}
    planner.observe(point, PointRecord.model_validate(fields))
    (decision,) = planner.outcome().decisions
    assert planner.best is None and decision.fits is False
    assert decision.note == "measured 0.00 MiB (peak reserved + 0.00 MiB CUDA context) > the 0.00 MiB limit"


def test_margin_is_the_largest_measured_reserved_over_allocated() -> None:
    def rec(alloc: int, reserved: int) -> PointRecord:
        return PointRecord.model_validate({"key": {"layout": "all"}, "status": "ok", "step_times_s": [1.0],
                                           "peak_allocated_bytes": alloc, "peak_reserved_bytes": reserved})

    assert Margin.learn([]).ratio == 1.0
    assert Margin.learn([rec(100, 105), rec(100, 120), rec(100, 100)]).ratio == pytest.approx(1.2)


def test_techniques_without_an_estimate_are_judged_by_a_labelled_stand_in() -> None:
    sweep = {"layout": ["all"], "batch_size": [2], "seq_len": [32], "precision": ["bf16"],
             "loss": ["chunked", "fused_linear"], "optimizer_in_backward": [False]}
    cfg = tiny_config(device="cuda", sweep=sweep)
    space = tune_space(cfg, device_type="cuda", seq_len=None, allow=("8bit",))
    found = {(c.point.loss, c.point.optimizer, c.point.compile): c.estimate for c in
             estimate_candidates(cfg, space, limit_bytes=LIMIT, target="cuda")[0]}
    plain = found["chunked", "adamw_fused", False]
    assert plain.note is None and plain.peak_bytes is not None
    fused = found["fused_linear", "adamw_8bit_torchao", False]
    assert fused.peak_bytes == plain.peak_bytes and fused.note is not None
    assert fused.note.startswith("stand-in: estimated as loss=chunked") and "optimizer=adamw_fused" in fused.note
    # On a CUDA target the allocator is replayed (on the H200 by default): the stand-in's reserved memory counts.
    assert plain.reserved is not None and fused.reserved == plain.reserved and plain.needed_bytes is not None
    fit = predicted_fit(fused, limit_bytes=plain.needed_bytes, margin=Margin(1.0, "none"))
    assert fit.fits is True and "(stand-in: estimated as loss=chunked" in fit.basis
    assert fit.basis.startswith("reserved bound")


def test_a_point_that_ran_out_of_memory_rules_out_larger_predictions() -> None:
    """The allocator needs more than predicted (fragmentation): what is predicted larger fails too."""
    points = [Point("bf16", "none", layout, 2048, 8, "llama-7b", "adamw_fused") for layout in ("first:8", "first:4")]
    points.append(Point("bf16", "none", "first:16", 2048, 8, "llama-7b", "adamw_fused"))
    peaks = {"first:4": 95, "first:8": 90, "first:16": 80}
    flops = {"first:4": 100, "first:8": 110, "first:16": 120}
    candidates = [TuneCandidate(p, flops[p.layout], _estimate(p, peaks[p.layout])) for p in points]
    planner = TunePlanner(candidates, limit_bytes=100)
    first = planner.next()
    assert first is not None and first.layout == "first:4"
    planner.observe(first, PointRecord.model_validate({"key": first.key, "status": "oom"}))
    second = planner.next()
    assert second is not None and second.layout == "first:8"  # predicted below the failed point: tried
    planner.observe(second, PointRecord.model_validate({"key": second.key, "status": "oom"}))
    third = planner.next()
    assert third is not None and third.layout == "first:16"
    planner.observe(third, PointRecord.model_validate({"key": third.key, "status": "oom"}))
    assert planner.next() is None and planner.best is None


def test_a_failure_drops_candidates_predicted_no_smaller() -> None:
    points = [Point("bf16", "none", layout, 2048, 8, "llama-7b", "adamw_fused") for layout in ("first:4", "first:8")]
    peaks, flops = {"first:4": 90, "first:8": 95}, {"first:4": 100, "first:8": 110}
    planner = TunePlanner([TuneCandidate(p, flops[p.layout], _estimate(p, peaks[p.layout])) for p in points],
                          limit_bytes=100)
    first = planner.next()
    assert first is not None and first.layout == "first:4"
    planner.observe(first, PointRecord.model_validate({"key": first.key, "status": "oom"}))
    assert planner.next() is None
    assert planner.decided[-1].kind is DecisionKind.PREDICTED_NOT_TO_FIT
    why = planner.decided[-1].reason.why
    assert why.startswith("predicted not to fit: predicted peak allocated 0.00 MiB, no less than first:4 b=8's")
    assert why.endswith("which did not fit when measured (out of memory)")


def test_a_technique_that_cannot_run_here_skips_its_class_and_costs_no_point() -> None:
    points = [Point("bf16", "none", layout, 2048, batch, "llama-7b", "adamw_fused", loss=loss)
              for batch in (4, 2) for layout in ("none", "all") for loss in ("fused_linear", "default")]
    # Synthetic FLOPs that put the fused-loss candidate first at each batch size.
    flops = {("none", "fused_linear"): 1000, ("none", "default"): 1001, ("all", "fused_linear"): 1300,
             ("all", "default"): 1301}
    candidates = [TuneCandidate(p, flops[p.layout, p.loss], _estimate(p, None)) for p in points]
    planner = TunePlanner(candidates, limit_bytes=100, max_points=2)
    first = planner.next()
    assert first is not None and first.loss == "fused_linear" and first.batch_size == 4  # eager, fewest FLOPs
    skipped = PointRecord.model_validate({"key": first.key, "status": "skipped", "reason": "liger not installed"})
    planner.observe(first, skipped)
    dropped = [d for d in planner.decided if d.kind is DecisionKind.CANNOT_RUN]
    assert len(dropped) == 3 and all(d.candidate.point.loss == "fused_linear" for d in dropped)
    assert all(d.reason.why == "skipped like none b=4 loss=fused_linear: liger not installed" for d in dropped)
    rest = []
    while (point := planner.next()) is not None:
        rest.append(point)
        planner.observe(point, PointRecord.model_validate({"key": point.key, "status": "oom"}))
    assert [p.loss for p in rest] == ["default", "default"] and planner.spent_points == 2  # the skip was free
    assert planner.outcome().counts == {"measured": 3, "cannot run here": 3, "not reached": 2}


def test_each_decision_kind_is_set_by_the_rule_that_decides_it() -> None:
    """One candidate per kind of decision; the kind comes from the rule, and run.json counts and keeps each one."""
    def point(layout: str, batch: int, loss: str = "default") -> Point:
        return Point("bf16", "none", layout, 2048, batch, "llama-7b", "adamw_fused", loss=loss)

    # (point, hardware FLOPs, predicted peak allocated) in the planner's order: most tokens per step first.
    space = {
        "D": (point("none", 8), 2000, 200),  # predicted at 200 > the 100 limit
        "E": (point("none", 4, "fused_linear"), 900, None),  # measured: skipped here
        "A": (point("none", 4), 1000, 50),  # measured: fits, 8,192 tokens/s at 1,000 FLOP/s
        "B": (point("all", 4), 1300, 40),  # A has its tokens, fewer FLOPs and no more savers
        "G": (point("none", 2, "fused_linear"), 450, None),  # E's speed class
        "C": (point("none", 2), 600, 30),  # 4096 tokens x 1000 FLOP/s x 1.1 / 600 FLOPs = 7,509 <= 8,192 tokens/s
        "F": (point("none", 1), 100, 20),  # could reach 22,528 tokens/s: measured (out of memory)
        "H": (point("all", 1), 130, 15),  # --max-points 2 reached first
    }
    planner = TunePlanner([TuneCandidate(p, flops, _estimate(p, peak)) for p, flops, peak in space.values()],
                          limit_bytes=100, max_points=2)
    records: dict[str, dict[str, Any]] = {  # record fields by candidate
        "E": {"status": "skipped", "reason": "liger not installed"},
        "A": {"status": "ok", "step_times_s": [1.0], "tokens_per_step": 8192, "peak_allocated_bytes": 50,
              "peak_reserved_bytes": 60},
        "F": {"status": "oom"},
    }
    names = {p.key_id: name for name, (p, _, _) in space.items()}
    while (chosen := planner.next()) is not None:
        planner.observe(chosen, PointRecord.model_validate({"key": chosen.key, **records[names[chosen.key_id]]}))
    kind = DecisionKind
    assert [(names[d.candidate.point.key_id], d.kind) for d in planner.decided] == [
        ("D", kind.PREDICTED_NOT_TO_FIT), ("E", kind.MEASURED), ("G", kind.CANNOT_RUN), ("A", kind.MEASURED),
        ("B", kind.CHEAPER_WINS), ("C", kind.CANNOT_BEAT), ("F", kind.MEASURED), ("H", kind.NOT_REACHED),
    ]
    outcome = planner.outcome()
    assert outcome.counts == {"predicted not to fit": 1, "measured": 3, "cannot run here": 1,
                              "a cheaper setup wins": 1, "cannot beat the best": 1, "not reached": 1}
    # The decisions as run.json holds them: a field is left out, or null, exactly as it always was.
    stored = {names[Point.from_key(d["key"]).key_id]: {k: v for k, v in d.items() if k != "key"}
              for d in outcome.to_json()["decisions"]}
    # The margin is learned from A on (reserved 60 / allocated 50): later predictions are judged at x1.2.
    fits = "predicted peak allocated 0.00 MiB x margin {} fits the 0.00 MiB limit"
    assert stored == {
        "D": {"action": "dropped", "label": "none b=8", "judged_peak_bytes": 200, "why": "predicted not to fit: "
              "predicted peak allocated 0.00 MiB x margin 1.0000 does not fit the 0.00 MiB limit"},
        "E": {"action": "measured", "label": "none b=4 loss=fused_linear", "status": "skipped", "fits": False,
              "note": "liger not installed", "why": "most tokens per step left; no prediction (not estimated: x)"},
        "G": {"action": "dropped", "label": "none b=2 loss=fused_linear",
              "why": "skipped like none b=4 loss=fused_linear: liger not installed"},
        "A": {"action": "measured", "label": "none b=4", "judged_peak_bytes": 50, "status": "ok", "fits": True,
              "tokens_per_s": 8192.0, "peak_reserved_bytes": 60,
              "why": "most tokens per step left; " + fits.format("1.0000")},
        "B": {"action": "dropped", "label": "all b=4", "judged_peak_bytes": 48,
              "why": "a cheaper setup already fits at the same tokens per step: none b=4 (8,192 tokens/s) with no "
                     "more recomputation or memory savers"},
        "C": {"action": "dropped", "label": "none b=2", "judged_peak_bytes": 36,
              "why": "cannot beat none b=4 (8,192 tokens/s): at most 7,509 tokens/s even at 1.1x the best FLOP rate "
                     "measured in its class"},
        "F": {"action": "measured", "label": "none b=1", "judged_peak_bytes": 24, "status": "oom", "fits": False,
              "note": None, "why": "most tokens per step left; " + fits.format("1.2000")},
        "H": {"action": "dropped", "label": "all b=1", "why": "not reached: --max-points 2 reached"},
    }


def test_layout_families() -> None:
    assert [layout_family(x) for x in ("none", "all", "first:12", "first:3@mlp", "all@selective")] == [
        "none", "all", "first:k", "first:k@mlp", "all@selective",
    ]


def test_training_semantics_change_only_when_allowed() -> None:
    cfg = tiny_config(sweep={"layout": ["none", "all"], "batch_size": [2], "seq_len": [32], "precision": ["fp32"],
                             "optimizer": ["adamw_fused", "adafactor"], "lora": ["none", "r4"]})
    plain = tune_space(cfg, device_type="cpu", seq_len=None, allow=())
    assert plain.techniques["optimizer"] == ("adamw_fused",) and plain.techniques["lora"] == ("none",)
    assert plain.techniques["loss"] == ("default", "chunked") and plain.techniques["compile"] == (False,)
    opened = tune_space(cfg, device_type="cuda", seq_len=None, allow=parse_allow("lora,factored,8bit"))
    assert opened.techniques["optimizer"] == ("adamw_fused", "adamw_8bit_torchao", "adamw_8bit", "adafactor")
    assert opened.techniques["lora"] == ("none", "r4")
    assert opened.techniques["loss"] == ("default", "chunked", "fused_linear")
    with pytest.raises(ConfigError, match="--allow: 'fp8' is not one of"):
        parse_allow("lora,fp8")
    two = tiny_config(sweep={"seq_len": [32, 64]})
    with pytest.raises(ConfigError, match="--seq-len: the config lists several"):
        tune_space(two, device_type="cpu", seq_len=None, allow=())
    assert tune_space(two, device_type="cpu", seq_len=64, allow=()).seq_len == 64
    with pytest.raises(ConfigError, match=r"--seq-len: 4096 is not between 1 and .* \(1024\)"):
        tune_space(two, device_type="cpu", seq_len=4096, allow=())


def test_default_space_takes_every_first_k() -> None:
    space = tune_space(tiny_config(sweep={"seq_len": [128]}), device_type="cpu", seq_len=None, allow=())
    assert space.layouts == ("none", *(f"first:{k}" for k in range(1, 8)), "all", "all@selective")
    assert space.batch_sizes == (1, 2, 4, 8, 16, 32, 64)


# -- end to end on CPU ----------------------------------------------------------------------------

runner = CliRunner()


def _small_config(tmp_path: Path) -> Path:
    data = load_config(CONFIG).model_dump(mode="json")
    data["sweep"].update(layout=["none", "all"], batch_size=[2, 4], seq_len=[32], loss=["default"])
    data["measured_steps"] = 1
    path = tmp_path / "small.yaml"
    path.write_text(json.dumps(data))
    return path


def test_cli_tune_measures_records_resumes_and_reports(tmp_path: Path) -> None:
    config, run_dir = _small_config(tmp_path), tmp_path / "run"
    args = ["tune", str(config), "--budget", "36MiB", "--headroom", "0", "--out", str(run_dir), "--max-points", "1"]
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    run = load_run(run_dir)
    assert len(run.points) == 1 and run.points[0].search and run.points[0].ok
    search = run.meta.searches[0].to_json()
    assert search["kind"] == "tune" and search["stopped_by"] == "--max-points 1 reached"
    assert "tune: all b=4" in first.stdout or "tune: none b=4" in first.stdout
    assert "Best measured point of each layout family" in first.stdout

    more = ["tune", str(config), "--budget", "36MiB", "--headroom", "0", "--resume", str(run_dir), "--format", "json"]
    second = runner.invoke(app, more)
    assert second.exit_code == 0, second.output
    answer = json.loads(second.stdout)
    run = load_run(run_dir)
    assert answer["measured_points"] == len(run.points) >= 2  # the first point was reused, not measured again
    assert len({r.key_id for r in run.points}) == len(run.points)
    best = max((r for r in run.points if r.ok and (r.peak_reserved_bytes or 0) <= LIMIT),
               key=lambda r: r.tokens_per_s or 0)
    assert answer["answer"]["key"] == best.key and answer["semantic_changes"] == []

    report = runner.invoke(app, ["report", str(run_dir)])
    assert report.exit_code == 0, report.output
    text = (run_dir / "report" / "report.md").read_text()
    assert "## Tune: the fastest setup under the budget" in text and "### The search, in order" in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--budget", "36MiB", "--allow", "fp8"], "--allow: 'fp8' is not one of"),
        ([], "--budget is required"),
        (["--budget", "36MiB", "--max-points", "0"], "--max-points must be at least 1"),
    ],
)
def test_cli_bad_input_is_exit_2(args: list[str], message: str) -> None:
    result = runner.invoke(app, ["tune", str(CONFIG), *args])
    assert result.exit_code == 2 and message in result.stderr


def test_outcome_is_json(replayed: tuple[TunePlanner, Any]) -> None:
    planner, _ = replayed
    outcome = planner.outcome()
    text = json.dumps(outcome.to_json(), sort_keys=True)
    again = json.loads(text)
    assert again["answer"]["key"] == planner.best.candidate.point.key  # type: ignore[union-attr]
    assert dataclasses.asdict(planner.margin) == {"ratio": 1.0, "source": again["margin"]["source"]}
    # Read back, it is the same record, and writes the same JSON.
    assert TuneRecord.model_validate(again) == outcome and TuneRecord.model_validate(again).to_json() == again
    assert again["counts"] == {k.value: sum(d.kind is k for d in planner.decided) for k in DecisionKind
                               if any(d.kind is k for d in planner.decided)}
