"""Saving and cost per checkpointed layer, the ordering effect, where the memory goes: analysis and report section."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from ckptbench.analysis.layer_series import family_of, layer_series, slope
from ckptbench.analysis.memory_split import memory_splits
from ckptbench.render.layer_report import layer_section
from tests.handbuilt import GIB, base_points, pt, run_of


def test_families_and_slope() -> None:
    assert [family_of(x) for x in ("first:16", "every:4+3", "all@attn", "range:8-19", "none")] == [
        "first", "every", "all", "range", "none"]
    assert slope([0, 16, 32], [10.0, 6.0, 2.0]) == pytest.approx(-0.25)
    assert slope([0, 32], [10.0, 2.0]) is None  # two points: differences, not a fit


def test_intervals_per_family_and_the_none_to_all_average() -> None:
    run = run_of([*base_points(), pt("last:6", 2, 61.0, 420), pt("all@attn", 2, 59.0)])
    (cell,) = layer_series(run)
    assert cell.label == "b=2 s=2048 bf16" and [s.family for s in cell.series] == ["first", "last", "every"]
    first = cell.family("first")
    assert first is not None and [p.layout for p in first.points] == ["none", "first:16", "all"]
    a, b = first.intervals
    assert a.saved_reserved_per_layer == pytest.approx((63.0 - 52.6) * GIB / 16, rel=1e-9)
    assert b.saved_reserved_per_layer == pytest.approx((52.6 - 52.5) * GIB / 16, abs=1)  # bytes are whole
    assert a.time_per_layer_s == pytest.approx((0.450 - 0.390) / 16)
    last = cell.family("last")
    assert last is not None and [i.layers for i in last.intervals] == [6, 10, 16]
    assert cell.overall is not None and cell.overall.saved_reserved_per_layer == pytest.approx(10.5 * GIB / 32)
    # all@attn is not a whole-layer layout: it is in no series.
    assert all(p.layout != "all@attn" for s in cell.series for p in s.points)


def test_ordering_at_equal_k() -> None:
    (cell,) = layer_series(run_of(base_points()))
    (row,) = cell.ordering
    assert row.k == 16 and [p.layout for p in row.points] == ["first:16", "every:2", "last:16"]
    assert row.spread_allocated_bytes == pytest.approx((57.7 - 51.6) * GIB, rel=1e-6)


def test_memory_split_static_activation_cache() -> None:
    run = run_of([*base_points(), pt("none", 8, status="oom"), pt("first:16", 8, 96.0, alloc=91.0),
                  pt("all", 8, 55.0, alloc=53.5)])
    rows = memory_splits(run)
    assert [(r.batch_size, r.layout) for r in rows] == [(2, "none"), (2, "all"), (8, "first:16"), (8, "all")]
    r = rows[2]  # none ran out of memory at batch 8: the least checkpointed layout that ran stands in
    assert r.static_bytes == int(12.5 * GIB) * 4
    assert r.activation_bytes == int(91.0 * GIB) - r.static_bytes
    assert r.cache_bytes == int(96.0 * GIB) - int(91.0 * GIB)


def test_report_has_the_per_layer_section(synthetic_report_made: tuple[Path, Any]) -> None:
    """`ckptbench report SYNTHETIC --out OUT --budget 80`, run once per process (tests/_est_shared.py)."""
    tmp_path, result = synthetic_report_made
    assert result.exit_code == 0, result.output
    text = (tmp_path / "report.md").read_text(encoding="utf-8")
    section = text[text.index("## Checkpointing per layer"):]
    assert "### Saving and cost per checkpointed layer" in section and "### Where the memory goes" in section
    assert re.search(r"^\| b=8 s=2048 bf16 \| first \| none \| first:16 \| 16 \|", section, re.M)
    assert section.rstrip().endswith("![Memory and step time against checkpointed layers](layers.png)")
    assert (tmp_path / "layers.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_run_without_series_says_so(tmp_path: Path) -> None:
    run = run_of([pt("none", 2, 63.0), pt("all@attn", 2, 59.0)])
    text, plot = layer_section(run, tmp_path)
    assert plot is None
    assert "No cell has a measured series" in text
    assert "No two whole-layer layouts with the same number of checkpointed layers" in text
