"""Plots say what they show: titles, one style per layout, relative speed, labels that do not overlap,
and a memory breakdown that states only what was measured or labels it an estimate."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle
from matplotlib.text import Annotation
from typer.testing import CliRunner

from ckptbench.analysis.recommend import recommend
from ckptbench.cli.main import app
from ckptbench.config.grid import Point
from ckptbench.estimator.record import CATEGORIES, Estimate
from ckptbench.plots import breakdown as breakdown_plot
from ckptbench.plots import peaks_speed as plots
from ckptbench.plots.style import PlotData, describe_run
from ckptbench.plots.tradeoff import tradeoff_figure
from ckptbench.results.store import load_run
from ckptbench.units import GIB, MIB
from tests._known import known

# Estimates of one config are made once per process and shared (tests/_est_shared.py).
pytestmark = pytest.mark.usefixtures("shared_estimates")

FIXTURES = Path(__file__).parent / "fixtures" / "report_runs"
SYNTHETIC = FIXTURES / "synthetic-h200-llama7b"
TINY = FIXTURES / "tiny-capped"
CHECK = Path("results/h200-gpu-check-2/check")
runner = CliRunner()


def test_titles_name_the_run_model_sequence_precision_and_device() -> None:
    assert describe_run(load_run(CHECK)) == "llama-7b, seq 2048, bf16, NVIDIA H200"
    assert describe_run(load_run(TINY)) == "tiny, seq 128, 256, fp32, CPU (live-tensor tracker)"
    fig = tradeoff_figure(load_run(CHECK))
    assert fig.get_suptitle() == ("Memory against throughput (ok points): llama7b-check\n"
                                  "llama-7b, seq 2048, bf16, NVIDIA H200")  # the run's name, not 'check'


def test_every_layout_has_its_own_colour_and_marker() -> None:
    data = PlotData(load_run(CHECK))
    assert len(data.layouts) == 11
    assert len(set(data.layout_color.values())) == 11  # no two layouts share a colour (tab20 paired them)
    assert len({(data.layout_color[x], data.layout_marker[x]) for x in data.layouts}) == 11
    assert data.layout_marker["none"] != data.layout_marker["all"]


def _label_boxes(fig: Figure) -> list[tuple[str, object]]:
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    ax = fig.axes[0]
    return [(t.get_text(), t.get_window_extent(renderer)) for t in ax.texts if isinstance(t, Annotation)]


@pytest.mark.parametrize("run_dir", [CHECK, SYNTHETIC, TINY])
def test_tradeoff_labels_never_overlap(run_dir: Path) -> None:
    run = load_run(run_dir)
    unit = GIB if run_dir != TINY else MIB
    rec = recommend(run, budget_bytes=80 * unit, headroom_bytes=4 * unit)
    fig = tradeoff_figure(run, rec=rec, size=rec.size)
    boxes = _label_boxes(fig)
    assert len(boxes) >= 10  # most points are named
    for (a, box_a), (b, box_b) in itertools.combinations(boxes, 2):
        assert not box_a.overlaps(box_b), (a, b)  # type: ignore[attr-defined]
    if rec.best is not None:
        assert any(text.startswith(rec.best.label.split(" s=")[0]) for text, _ in boxes)  # the winner is named


def test_speed_is_relative_to_none_at_the_same_batch() -> None:
    data = PlotData(load_run(CHECK))
    [(_, rows)] = data.facets()
    refs = plots.speed_references(rows)
    assert refs[2].layout == "none"  # none ran at batch 2
    assert refs[8].layout == "every:4"  # none ran out of memory at batch 8: the fastest point instead
    all2 = next(r for r in rows if r.layout == "all" and r.batch_size == 2)
    rel, (low, high) = plots._relative(all2, refs[2])
    assert rel == pytest.approx(known(all2.tokens_per_s) / known(refs[2].tokens_per_s))
    assert rel == pytest.approx(0.788, abs=1e-3)  # 8,316 / 10,548 tok/s
    assert low <= rel <= high
    # on the tiny CPU run at seq 256 'all' happened to be faster than 'none': the reference is still 'none'
    tiny = PlotData(load_run(TINY))
    rows256 = dict(tiny.facets())["seq 256"]
    assert plots.speed_references(rows256)[1].layout == "none"
    assert max(rows256, key=lambda r: known(r.tokens_per_s)).layout == "all"


def _estimates(run_dir: Path, parts: dict[str, int]) -> list[Estimate]:
    return [Estimate(point=Point.from_key(p.key), target="cuda", method="fast", peak_bytes=sum(parts.values()),
                     breakdown=dict(parts), static={}, peak_at="backward", budget_bytes=None)
            for p in breakdown_plot.breakdown_points(load_run(run_dir))]


def _legend(fig: Figure) -> list[str]:
    legend = known(fig.axes[0].get_legend())
    return [t.get_text() for t in legend.get_texts()]


def _height(patch: Patch) -> float:
    assert isinstance(patch, Rectangle)  # a bar
    return patch.get_height()


def test_breakdown_without_an_estimate_states_only_what_was_measured(tmp_path: Path) -> None:
    run = load_run(CHECK)
    fig = breakdown_plot.breakdown_figure(run)
    labels = _legend(fig)
    assert breakdown_plot.STATIC_LABEL in labels and breakdown_plot.REST_LABEL in labels
    assert not any(word in label for label in labels for word in ("gradients", "activation"))
    none = next(p for p in breakdown_plot.breakdown_points(run) if p.key["layout"] == "none")
    static_gib = (known(none.memory.params_bytes) + known(none.memory.optimizer_state_bytes)) / GIB
    heights = [_height(patch) for patch in fig.axes[0].patches[:2]]  # the 'none' bar comes first
    assert heights == pytest.approx([static_gib, known(none.peak_allocated_bytes) / GIB - static_gib])


def test_breakdown_with_an_estimate_labels_every_part_as_one() -> None:
    parts = dict.fromkeys(CATEGORIES, 0) | {"params": 12 * GIB, "activations": 20 * GIB}
    fig = breakdown_plot.breakdown_figure(load_run(CHECK), estimates=_estimates(CHECK, parts))
    labels = _legend(fig)
    part_labels = [x for x in labels if not x.startswith(("budget", "measured", "reserved"))]
    assert len(part_labels) == len(CATEGORIES) and all(x.endswith("(estimate)") for x in part_labels)
    assert "measured peak allocated" in labels
    assert [_height(p) for p in fig.axes[0].patches[:7]] == pytest.approx([12, 0, 0, 20, 0, 0, 0])
    assert "estimate" in fig.axes[0].get_title()


def test_report_splits_the_breakdown_with_the_estimate_and_can_do_without(tmp_path: Path) -> None:
    result = runner.invoke(app, ["report", str(TINY), "--out", str(tmp_path / "a")])
    assert result.exit_code == 0, result.output
    assert "memory breakdown: no estimate" not in result.stderr
    result = runner.invoke(app, ["report", str(TINY), "--out", str(tmp_path / "b"), "--no-estimate"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "b" / "memory_breakdown.png").stat().st_size > 10_000
