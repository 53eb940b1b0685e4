"""tune's output: tables fitted to the terminal with whole numbers and units; a noisy winner is said to be one.

tests/fixtures/tune/searched is one real `ckptbench tune tests/fixtures/tune/tiny-tune.yaml --budget 36MiB
--headroom 0 --max-points 4` on a busy 2-core host (its three measured points are flagged busy).
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from rich.console import Console

from ckptbench.analysis.recommend import recommend
from ckptbench.analysis.tune_record import TuneRecord
from ckptbench.render.tune import markdown_tune, rich_tune, tune_search
from ckptbench.results.meta import checked_meta
from ckptbench.results.store import Run, load_run
from ckptbench.units import MIB

SEARCHED = Path(__file__).parent / "fixtures" / "tune" / "searched"


def _text(run: Run, width: int) -> str:
    search = tune_search(run)
    assert search is not None
    rec = recommend(run, budget_bytes=36 * MIB, headroom_bytes=0)
    out = io.StringIO()
    console = Console(file=out, width=width, color_system=None, legacy_windows=False)
    console.print(rich_tune(search, rec, run=run))
    return out.getvalue()


def test_tune_tables_fit_80_columns_with_whole_numbers() -> None:
    text = _text(load_run(SEARCHED), 80)
    assert max(len(line) for line in text.splitlines()) <= 80
    step_rows = [line for line in text.splitlines() if re.match(r"│ \d ", line)]
    assert len(step_rows) == 3
    first = [c.strip() for c in step_rows[0].strip("│").split("│")]
    assert first[-3:] == ["1,354", "33.06 MiB", "fits"]  # tokens/s and reserved whole, with the unit
    assert "every figure measured" in text


def test_a_winner_measured_on_a_busy_host_is_said_to_rest_on_noise() -> None:
    run = load_run(SEARCHED)
    caution = ("Caution: the winner's speed rests on noisy measurements (busy: load average 5.1 above the 2 CPUs "
               "available; step times may be inflated)")
    assert caution in " ".join(_text(run, 200).split())
    search = tune_search(run)
    assert search is not None and caution in markdown_tune(search, run=run)
    quiet = Run(path=run.path, meta=run.meta, points=[p.model_copy(update={"warnings": []}) for p in run.points])
    assert "Caution" not in _text(quiet, 200)


def test_a_stored_search_reads_typed_and_writes_back_the_same_json() -> None:
    """run.json's tune entry read as a ``TuneRecord`` gives back exactly the JSON it was read from (what
    `tune --format json` prints), its decisions typed."""
    stored = json.loads((SEARCHED / "run.json").read_text())["searches"][0]
    search = tune_search(load_run(SEARCHED))
    assert search is not None and search.to_json() == stored
    assert [d.action for d in search.decisions].count("measured") == search.counts["measured"] == 3
    assert search.answer is not None and search.answer.label == "all b=8 loss=chunked optimizer_in_backward=True"


def test_a_damaged_tune_search_is_left_out_with_a_warning(tmp_path: Path) -> None:
    run = load_run(SEARCHED)
    stored = TuneRecord.model_validate(run.meta.searches[0].to_json()).to_json()
    damaged = {**stored, "decisions": [{**stored["decisions"][0], "why": None}]}
    meta, _ = checked_meta({**run.meta.to_json(), "searches": [damaged]}, source="run.json")
    with pytest.warns(UserWarning, match=r"ignored the tune search \(decisions\.0\.why: Input should be a valid str"):
        assert tune_search(Run(path=run.path, meta=meta, points=run.points)) is None
