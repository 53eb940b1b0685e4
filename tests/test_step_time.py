"""The step-time model (analysis/step_time.py) on the committed H200 runs: leave-one-out errors pinned per
point, the issue's two checks, what it refuses to predict, and the labelled transfer to another card."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import pytest

from ckptbench.analysis.step_time import TERMS, CellFit, StepTimeModel, features
from ckptbench.estimator.gpus import gpu_model
from ckptbench.results.store import Run, load_run

# Estimates of one config are made once per process and shared (tests/_est_shared.py).
pytestmark = pytest.mark.usefixtures("shared_estimates")

ROOT = Path(__file__).resolve().parent.parent / "results"
H200_RUNS = ("h200-gpu-check-1/check", "h200-gpu-check-1/axes", "h200-gpu-check-2/check")

# Leave-one-out relative error of every ok point of the plain bf16 s=2048 adamw_fused cell (20 points of the
# three runs; a point measured twice: the mean of its medians). None: no other point exercises a term it
# needs (the only gradient-accumulation point). Whole-layer and granularity points must stay within 3%.
LOO = {
    ("none", 2, 1): 0.0388,
    ("all", 2, 1): 0.0100,
    ("all", 8, 1): -0.0057,
    ("every:2", 2, 1): 0.0009,
    ("every:4", 2, 1): 0.0031,
    ("every:4", 8, 1): 0.0002,
    ("first:16", 2, 1): 0.0005,
    ("first:16", 8, 1): -0.0035,
    ("last:16", 2, 1): -0.0015,
    ("last:16", 8, 1): -0.0018,
    ("range:8-19", 2, 1): 0.0006,
    ("last:6", 2, 1): -0.0069,
    ("all@attn", 2, 1): -0.0127,
    ("all@mlp", 2, 1): -0.0127,
    ("all@attn+mlp", 2, 1): 0.0145,
    ("all@attn+mlp", 8, 1): -0.0088,
    ("all@selective", 2, 1): -0.0269,
    ("all@selective", 8, 1): 0.0189,
    ("every:2@selective", 8, 1): 0.0028,
    ("all", 2, 4): None,
}


def _runs(*names: str) -> list[Run]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the runs' known notes (a leak flag) are not this test's subject
        return [load_run(ROOT / n) for n in names]


@pytest.fixture(scope="module")
def model() -> StepTimeModel:
    return StepTimeModel.from_runs(_runs(*H200_RUNS))


@pytest.fixture(scope="module")
def plain(model: StepTimeModel) -> CellFit:
    return max(model.cells, key=lambda c: len(c.observations))


def _by_point(cell: CellFit) -> dict[tuple[str, int, int], object]:
    return {(o.point.layout, o.point.batch_size, o.point.micro_batches): o for o in cell.observations}


def test_plain_cell_holds_the_twenty_points_of_three_runs(plain: CellFit) -> None:
    assert dict(plain.cell)["optimizer"] == "adamw_fused" and dict(plain.cell)["seq_len"] == 2048
    assert len(plain.observations) == 20 and plain.gpu_name == "NVIDIA H200"
    assert len(plain.runs) == 3


@pytest.mark.parametrize(("layout", "batch", "micro"), list(LOO))
def test_leave_one_out_error_per_point(plain: CellFit, layout: str, batch: int, micro: int) -> None:
    found = {(e.point.layout, e.point.batch_size, e.point.micro_batches): e.error for e in plain.loo}
    expected = LOO[(layout, batch, micro)]
    got = found[(layout, batch, micro)]
    if expected is None:
        assert got is None
        return
    assert got == pytest.approx(expected, abs=5e-5)
    if layout != "none" and "selective" not in layout:  # whole-layer and granularity points: the bar
        assert abs(got) <= 0.03


def test_error_bound_and_source_name_the_worst_point_and_the_runs(plain: CellFit) -> None:
    assert plain.error_bound == pytest.approx(0.0388, abs=5e-5)
    assert plain.source().startswith("fitted to 20 points of ")
    assert plain.source().endswith("(NVIDIA H200), leave-one-out error <= 3.9%")


def test_three_layouts_predict_the_others_within_half_a_percent() -> None:
    """The issue's check on results/h200-gpu-check-2: fitted on none, every:4 and all at batch 2."""
    (cell,) = [c for c in StepTimeModel.from_runs(_runs("h200-gpu-check-2/check"), loo=False).cells]
    obs = _by_point(cell)
    fit = CellFit.fit([obs[(x, 2, 1)] for x in ("none", "every:4", "all")], shape=cell.shape,  # type: ignore[misc]
                      gpu_name=cell.gpu_name, loo=False)
    for layout in ("every:2", "first:16", "range:8-19", "last:6"):
        o = obs[(layout, 2, 1)]
        predicted = fit.predict_s(o.point)  # type: ignore[attr-defined]
        assert predicted is not None
        assert abs(predicted / o.step_time_s - 1) < 0.005, layout  # type: ignore[attr-defined]
    # attention or MLP alone recompute what no whole layer separates: not determined, so not predicted
    assert fit.predict_s(obs[("all@attn+mlp", 2, 1)].point) is None  # type: ignore[attr-defined]


def test_batch_eight_from_batch_two_within_about_two_percent() -> None:
    """Fitted on every batch-2 layout and one batch-8 point (the line's slope), it predicts batch 8."""
    (cell,) = StepTimeModel.from_runs(_runs("h200-gpu-check-2/check"), loo=False).cells
    obs = _by_point(cell)
    fitted = [o for k, o in obs.items() if k[1] == 2] + [obs[("all", 8, 1)]]
    fit = CellFit.fit(fitted, shape=cell.shape, gpu_name=cell.gpu_name, loo=False)  # type: ignore[arg-type]
    errors = {k[0]: fit.predict_s(o.point) / o.step_time_s - 1  # type: ignore[attr-defined, operator]
              for k, o in obs.items() if k[1] == 8 and k[0] != "all"}
    assert set(errors) == {"every:4", "first:16", "last:16", "all@attn+mlp"}
    assert max(abs(e) for e in errors.values()) < 0.025
    assert errors["every:4"] == pytest.approx(0.0223, abs=5e-4)


def test_prediction_is_fitted_with_the_cells_bound(model: StepTimeModel, plain: CellFit) -> None:
    point = dataclasses.replace(plain.observations[0].point, layout="every:3", batch_size=4)
    got = model.predict(point, gpu=gpu_model("h200"))
    assert got is not None and got.label == "fitted"
    assert got.error_bound == plain.error_bound
    assert got.tokens_per_s == pytest.approx(4 * 2048 / got.step_time_s)
    # between the batch-2 and batch-8 times of neighbouring layouts
    assert 0.8 < got.step_time_s < 0.85
    assert set(got.to_json()) == {"predicted_step_time_s", "predicted_tokens_per_s", "step_time_source",
                                  "step_time_error_bound"}


def test_what_no_point_determines_is_not_predicted(model: StepTimeModel, plain: CellFit) -> None:
    base = plain.observations[0].point
    other_seq = dataclasses.replace(base, seq_len=4096)
    assert model.predict(other_seq) is None
    assert model.why_not(other_seq) == "no measured point of this setup"
    # one adamw_8bit point: only that very point is determined, not another batch size
    (eight_bit,) = [c for c in model.cells if dict(c.cell)["optimizer"] == "adamw_8bit"]
    point = eight_bit.observations[0].point
    assert model.predict(point) is not None
    assert model.predict(dataclasses.replace(point, batch_size=4)) is None
    assert "do not determine it" in model.why_not(dataclasses.replace(point, batch_size=4))
    assert eight_bit.error_bound is None and "no leave-one-out check" in eight_bit.source()


def test_transfer_is_labelled_unvalidated_and_scales_by_the_cards_figures(model: StepTimeModel,
                                                                           plain: CellFit) -> None:
    point = plain.observations[0].point
    h200, a100 = model.predict(point, gpu=gpu_model("h200")), model.predict(point, gpu=gpu_model("a100-80gb"))
    assert h200 is not None and a100 is not None
    assert a100.label == "transferred" and a100.error_bound is None
    assert a100.source.startswith("transferred from H200 to A100-80GB (bf16 peak 989/312 TFLOP/s, memory "
                                  "bandwidth 4.8/2.039 TB/s), unvalidated; fitted to 20 points")
    # every term is slower by the peak's ratio (3.17) or the bandwidth's (2.35): the time lies between
    assert 4.8 / 2.039 * h200.step_time_s < a100.step_time_s < 989 / 312 * h200.step_time_s
    terms = plain.term_seconds(point)
    assert terms is not None and sum(terms) == pytest.approx(h200.step_time_s)


def test_features_count_the_recomputed_parts() -> None:
    from ckptbench.config.grid import Point
    from ckptbench.config.presets import PRESETS
    from ckptbench.train.flops import ModelShape

    shape = ModelShape.of_fields(PRESETS["llama-7b"])
    point = Point(precision="bf16", lora="none", layout="first:4@attn+mlp", seq_len=2048, batch_size=2,
                  model="llama-7b", optimizer="adamw_fused", micro_batches=3)
    x = dict(zip((t.name for t in TERMS), features(point, shape), strict=True))
    assert x["per_sample"] == 6 and x["per_pass"] == 3 and x["ckpt_enabled"] == 3
    assert x["block_extra"] == 0 and x["selective"] == 0
    tokens = 6 * 2048
    assert x["attn_recompute_pflop"] == pytest.approx(4 * tokens * (2 * 4 * 4096**2 + 4 * 4096 * 2048) / 1e15)
    assert x["mlp_recompute_pflop"] == pytest.approx(4 * tokens * 2 * 3 * 4096 * 11008 / 1e15)


# -- estimate --times-from ------------------------------------------------------------------------

_SEVEN_B = """\
name: times
model: {preset: llama-7b}
device: cuda
measured_steps: 3
sweep: {layout: [none, every:3], batch_size: [2], seq_len: [2048], precision: [bf16]}
points: [{layout: none, batch_size: 2, seq_len: 1024}]
"""


@pytest.fixture(scope="module")
def seven_b(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("cfg") / "times.yaml"
    path.write_text(_SEVEN_B)
    return str(path)


def _estimate(*args: str) -> str:
    from typer.testing import CliRunner

    from ckptbench.cli.main import app

    runs = [a for r in H200_RUNS for a in ("--times-from", str(ROOT / r))]
    result = CliRunner().invoke(app, ["estimate", *args, *runs], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result.stdout


def test_estimate_times_from_adds_the_four_fields(seven_b: str) -> None:
    import json

    records = {(r["key"]["layout"], r["key"]["seq_len"]): r for r in json.loads(_estimate(seven_b, "--format", "json"))}
    every3 = records[("every:3", 2048)]
    assert 0.43 < every3["predicted_step_time_s"] < 0.44  # between every:4 (0.426 s) and every:2 (0.451 s)
    assert every3["predicted_tokens_per_s"] == pytest.approx(4096 / every3["predicted_step_time_s"])
    assert every3["step_time_source"].startswith("fitted to 20 points of ")
    assert every3["step_time_error_bound"] == pytest.approx(0.0388, abs=5e-5)
    # no point of sequence length 1024 was measured: the fields are there, empty
    short = records[("none", 1024)]
    assert {k: short[k] for k in ("predicted_step_time_s", "step_time_source")} == {
        "predicted_step_time_s": None, "step_time_source": None}


def test_estimate_times_from_table_and_csv_label_the_time_fitted(seven_b: str) -> None:
    from ckptbench.config.load import load_config
    from ckptbench.estimator.estimator import estimate_config
    from ckptbench.render.estimate import estimate_csv, estimate_markdown

    cfg = load_config(seven_b)
    estimates = estimate_config(cfg)
    model = StepTimeModel.from_runs(_runs(*H200_RUNS))
    times = {e.point.key_id: model.predict(e.point, gpu=gpu_model("h200")) for e in estimates}
    table = estimate_markdown(estimates, name="times", times=times)
    assert "step (fitted)" in table and "step-time model, not a measurement: fitted to 20 points" in table
    row = next(line for line in table.splitlines() if "every:3" in line)
    assert "ms ±3.9%" in row
    header = estimate_csv(estimates, times=times).splitlines()[0].split(",")
    assert {"predicted_step_time_s", "predicted_tokens_per_s", "step_time_source", "step_time_error_bound"} <= set(
        header)
    assert "step (fitted)" not in estimate_markdown(estimates, name="times")  # without --times-from: as before


def test_the_shipped_calibration_is_what_the_committed_runs_give_and_predicts_alike(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ckptbench/data/step_time_calibration.json (a plain install's step times) is scripts/make_calibration.py's
    output on the committed runs, and the model made from it predicts every point as the runs' model does, with the
    same sources and error bounds."""
    import json
    import sys

    from ckptbench.analysis.step_time import CALIBRATION, StepTimeModel, calibration_of, shipped_calibration

    monkeypatch.chdir(ROOT.parent)  # the runs are named relative to the repository root in the sources
    runs = _runs(*H200_RUNS)
    for run, name in zip(runs, H200_RUNS, strict=True):
        run.path = Path("results") / name
    shipped = json.loads((ROOT.parent / "ckptbench" / "data" / CALIBRATION).read_text())
    assert shipped == json.loads(json.dumps(calibration_of(runs)))
    sys.path.insert(0, str(ROOT.parent / "scripts"))
    try:
        from make_calibration import main
    finally:
        sys.path.pop(0)
    assert main(["--check"]) == 0
    from_runs, from_file = StepTimeModel.from_runs(runs), shipped_calibration()
    a100 = gpu_model("a100-80gb")
    for cell in from_runs.cells:
        for o in cell.observations:
            for gpu in (None, a100):
                assert from_file.predict(o.point, gpu=gpu) == from_runs.predict(o.point, gpu=gpu)
