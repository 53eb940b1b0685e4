"""The plots of a 1,000-point report in seconds (issue 24): artists per layout or batch size, not per point,
showing every point; label placement that skips hopeless labels places exactly the labels it placed before.

No timings here (scripts/bench_tool.py measures them): the tests bound what is drawn and pin equalities.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from matplotlib.collections import PathCollection
from matplotlib.container import ErrorbarContainer
from matplotlib.figure import Figure
from matplotlib.text import Annotation

from ckptbench.analysis.recommend import candidates, recommend
from ckptbench.plots import labels as plot_labels
from ckptbench.plots import peaks_speed
from ckptbench.plots.style import LEGEND_BATCHES, PlotData, legend_batches
from ckptbench.plots.tradeoff import tradeoff_figure
from ckptbench.results.store import Run, load_run
from ckptbench.units import GIB
from tests._synthetic_runs import synthetic_run

CHECK = Path(__file__).resolve().parents[1] / "results" / "h200-gpu-check-2" / "check"


@pytest.fixture(scope="module")
def crowded(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """300 points: 11 layouts at batch sizes 1 to 28, most of them crowded together."""
    return load_run(synthetic_run(tmp_path_factory.mktemp("crowded") / "run", 300))


@pytest.mark.filterwarnings("ignore:constrained_layout not applied")
def test_the_tradeoff_scatter_is_one_collection_per_layout_holding_every_point(crowded: Run) -> None:
    fig = tradeoff_figure(crowded)
    cands = candidates(crowded)
    data = PlotData(crowded)
    scatters = [c for c in fig.axes[0].collections if isinstance(c, PathCollection)]
    layouts = {c.layout for c in cands}
    assert len(scatters) == len(layouts) == 11  # not 300
    drawn = Counter((round(float(x), 9), round(float(y), 9)) for s in scatters for x, y in np.asarray(s.get_offsets()))
    plotted = Counter((round(data.size.value(c.memory_bytes), 9), round(c.tokens_per_s, 9)) for c in cands)
    assert drawn == plotted
    # each layout keeps its colour, and each marker its batch's size
    sizes = sorted({float(v) for s in scatters for v in s.get_sizes()})
    assert len(sizes) == len({c.key.get("batch_size") for c in cands})


def test_the_speed_dots_are_one_errorbar_per_batch_holding_every_ok_point(crowded: Run) -> None:
    data = PlotData(crowded)
    [(_, rows)] = data.facets()
    ax = Figure().subplots()
    peaks_speed._relative_dots(ax, data, rows, peaks_speed.speed_references(rows))
    bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert len(bars) == len(data.batches) == 28
    points = sum(len(np.asarray(b.lines[0].get_xdata())) for b in bars)
    assert points == sum(1 for r in rows if r.status == "ok") == 300


def test_the_peak_bars_are_drawn_per_batch_with_every_bar(crowded: Run) -> None:
    data = PlotData(crowded)
    [(_, rows)] = data.facets()
    ax = Figure().subplots()
    peaks_speed._grouped_bars(ax, data, rows, lambda r: r.peak_reserved_bytes / data.scale)
    assert len(ax.containers) == 28 and len(ax.patches) == 300


def _placed(fig: Figure) -> list[tuple[str, Any, Any, str, str]]:
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    return [(t.get_text(), tuple(round(v, 6) for v in t.get_window_extent(renderer).extents), t.xyann,
             t.get_horizontalalignment(), t.get_verticalalignment())
            for t in fig.axes[0].texts if isinstance(t, Annotation)]


@pytest.mark.filterwarnings("ignore:constrained_layout not applied")  # the 28-batch legend is tall
@pytest.mark.parametrize("which", ["crowded", "check"])
def test_hopeless_labels_are_skipped_and_the_same_labels_placed(
    which: str, crowded: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = crowded if which == "crowded" else load_run(CHECK)
    rec = recommend(run, budget_bytes=80 * GIB, headroom_bytes=4 * GIB)
    skipped: list[bool] = []
    real = plot_labels._hopeless

    def counting(*args: Any, **kwargs: Any) -> bool:
        skipped.append(real(*args, **kwargs))
        return skipped[-1]

    monkeypatch.setattr(plot_labels, "_hopeless", counting)
    quick = _placed(tradeoff_figure(run, rec=rec, size=rec.size))
    monkeypatch.setattr(plot_labels, "_hopeless", lambda *a, **k: False)  # every label measured, as before
    plain = _placed(tradeoff_figure(run, rec=rec, size=rec.size))
    assert quick == plain
    assert len(quick) >= 5
    if which == "crowded":
        assert sum(skipped) > len(skipped) // 2  # most labels of a crowded plot are never measured


def _legend_texts(ax: Any) -> tuple[list[str], str]:
    legend = ax.get_legend()
    return [t.get_text() for t in legend.get_texts()], legend.get_title().get_text()


def test_a_few_batch_sizes_are_all_named_and_many_are_an_even_spread() -> None:
    assert legend_batches([1, 2, 4, 8]) == [1, 2, 4, 8]
    many = list(range(1, 92))
    spread = legend_batches(many)
    assert len(spread) == LEGEND_BATCHES and spread[0] == 1 and spread[-1] == 91 and spread == sorted(spread)


def test_the_legends_of_a_run_with_many_batch_sizes_say_how_many_they_name(crowded: Run) -> None:
    data = PlotData(crowded)
    [(_, rows)] = data.facets()
    ax = Figure().subplots()
    peaks_speed._batch_legend(ax, data, rows)
    texts, title = _legend_texts(ax)
    assert texts == [f"batch {b}" for b in legend_batches(data.batches)] and texts[-1] == "batch 28"
    assert title == f"{LEGEND_BATCHES} of 28 batch sizes named (evenly spread)"
    refs = peaks_speed.speed_references(rows)
    refs[5] = next(r for r in rows if r.batch_size == 5 and r.layout == "all")  # 'none' did not run at 5
    _, labels, ref_title = peaks_speed._reference_legend(data, rows, refs)
    assert "batch 5: vs all (none did not run)" in labels  # never hidden by the spread
    assert len(labels) == 1 + LEGEND_BATCHES + (5 not in legend_batches(data.batches))
    assert ref_title == f"{len(labels) - 1} of 28 batch sizes named (evenly spread)"
    fig = tradeoff_figure(crowded)
    texts, _ = _legend_texts(fig.axes[0])
    assert f"batch size (marker size; {LEGEND_BATCHES} of 28 named)" in texts
    assert sum(t.startswith("batch ") and t[6:].isdigit() for t in texts) == LEGEND_BATCHES


def test_the_legends_of_a_run_with_few_batch_sizes_name_every_one() -> None:
    run = load_run(CHECK)
    data = PlotData(run)
    [(_, rows)] = data.facets()
    ax = Figure().subplots()
    peaks_speed._batch_legend(ax, data, rows)
    assert _legend_texts(ax) == (["batch 2", "batch 8"], "")
    texts, _ = _legend_texts(tradeoff_figure(run).axes[0])
    assert texts[-3:] == ["batch size (marker size)", "batch 2", "batch 8"]


@pytest.mark.filterwarnings("ignore:constrained_layout not applied")
def test_the_tradeoff_plot_is_at_most_linear_in_the_points(tmp_path: Path) -> None:
    """Four times the points, at most four times the calls (drawing and placing labels)."""
    work = {}
    for n in (110, 440):
        run = load_run(synthetic_run(tmp_path / f"run-{n}", n))
        calls = 0

        def count(frame: Any, event: str, arg: Any) -> None:
            nonlocal calls
            if event in ("call", "c_call"):
                calls += 1

        sys.setprofile(count)
        try:
            tradeoff_figure(run)
        finally:
            sys.setprofile(None)
        work[n] = calls
    assert work[440] < 4 * work[110], work
