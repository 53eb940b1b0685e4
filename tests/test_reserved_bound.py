"""The reserved prediction's upper bound: from the measured errors of its kind, and what 'fits' is judged on.

tests/fixtures/reserved_predictions.json holds, for the 30 ok points of the committed H200 runs, the peak
reserved that `ckptbench estimate RUN --format json` predicts and the one each point measured.
"""

from __future__ import annotations

import json
from pathlib import Path

from ckptbench.config.grid import Point
from ckptbench.estimator.record import CATEGORIES, Estimate, Reserved
from ckptbench.results import fit
from ckptbench.results.fit import reserved_bound_fraction, reserved_upper_bound
from ckptbench.units import GIB

EVIDENCE = json.loads((Path(__file__).parent / "fixtures" / "reserved_predictions.json").read_text())["points"]


def test_the_bound_covers_every_committed_h200_point() -> None:
    assert len(EVIDENCE) == 30
    for p in EVIDENCE:
        key = p["key"]
        bound = reserved_upper_bound(p["predicted_peak_reserved_bytes"], layout=key["layout"],
                                     batch_size=key["batch_size"])
        assert bound >= p["measured_peak_reserved_bytes"], key


def test_each_bound_is_the_worst_under_prediction_of_its_kind() -> None:
    worst: dict[float, float] = {}
    for p in EVIDENCE:
        key = p["key"]
        share = reserved_bound_fraction(key["layout"], key["batch_size"])
        above = p["measured_peak_reserved_bytes"] / p["predicted_peak_reserved_bytes"] - 1
        worst[share] = max(worst.get(share, 0.0), above)
    # Each bound is its kind's worst case rounded up to 0.01%: none is larger than its evidence needs.
    assert sorted(worst) == [0.0093, 0.0253, 0.0377]
    for share, w in worst.items():
        assert w <= share < w + 1e-4


def _estimate(layout: str, batch: int, reserved_gib: float, *, target: str = "cuda") -> Estimate:
    point = Point(model="llama-7b", layout=layout, batch_size=batch, seq_len=2048, precision="bf16",
                  lora="none", optimizer="adamw_fused")
    reserved = Reserved(int(reserved_gib * GIB), int(reserved_gib * GIB) - GIB, 0, None, "h200", GIB // 2, True)
    return Estimate(point, target, "fast", int(reserved_gib * GIB) - GIB, {}, {}, None, 80 * GIB, reserved=reserved)


def test_fits_is_decided_on_the_bound() -> None:
    # 88.06 GiB predicted (the all@attn+mlp b=8 case): fits 89 GiB on the figure, not on its 3.63% bound.
    e = _estimate("all@attn+mlp", 8, 88.06)
    parts = dict.fromkeys(CATEGORIES, 1)
    e = Estimate(e.point, e.target, e.method, e.peak_bytes, parts, {}, None, 89 * GIB, reserved=e.reserved)
    assert e.reserved_bound_bytes == reserved_upper_bound(int(88.06 * GIB), layout="all@attn+mlp", batch_size=8)
    assert e.reserved_bound_bytes > 91 * GIB
    assert e.needed_bytes == e.reserved_bound_bytes + GIB // 2 and e.fits is False
    assert "reserved bound" in (e.reason or "")
    cpu = _estimate("all@attn+mlp", 8, 88.06, target="cpu")
    assert cpu.reserved_bound_bytes is None  # the bound's evidence is a CUDA card's


def test_the_mlp_recomputing_layouts_carry_the_larger_bound() -> None:
    assert reserved_bound_fraction("all", 8) == fit.RESERVED_UNDER_PREDICTION
    assert reserved_bound_fraction("every:2@selective", 2) == 0.0253
    assert reserved_bound_fraction("all@attn+mlp", 16) == 0.0377
    assert reserved_bound_fraction("all@attn", 8) == fit.RESERVED_UNDER_PREDICTION
