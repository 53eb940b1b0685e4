"""Each claim's verdict on hand-built runs: one run where it holds, one where it does not (or is open)."""

from __future__ import annotations

from typing import Any

from ckptbench.answers import verdicts
from ckptbench.answers.verdicts import STAGE_BATCH_MAX, STAGE_CLAIMS, STAGE_SEQ, STAGE_TUNE, Answer, Verdict
from tests.handbuilt import answers, base_points, pt, run_of

H, F, W, OPEN = Verdict.HOLDS, Verdict.FAILS, Verdict.ONLY_WHEN, Verdict.OPEN


def claim(n: int, points: list[dict[str, Any]], *more: list[dict[str, Any]]) -> Answer:
    runs = [run_of(points, path="runs/a")] + [run_of(p, path=f"runs/{i}") for i, p in enumerate(more)]
    return answers(*runs).answers[n - 1]


def replace(points: list[dict[str, Any]], *new: dict[str, Any]) -> list[dict[str, Any]]:
    """The points with those of the same key replaced by ``new``."""
    return [p for p in points if not any(p["key"] == n["key"] for n in new)] + list(new)


def test_claim_1_partial_layouts_that_save_flip_it() -> None:
    a = claim(1, base_points())
    assert a.verdict is F and "first:16 gets 99.0% of all's saving" in a.summary
    # Partial layouts that save almost nothing: then "anything less" really does not drop memory.
    flat = replace(base_points(), pt("first:16", 2, 62.5), pt("last:16", 2, 62.9), pt("every:2", 2, 62.4),
                   pt("every:4", 2, 62.8))
    assert claim(1, flat).verdict is H


def test_claim_2_depends_on_whether_every_4_fits() -> None:
    fits = base_points()
    assert claim(2, fits).verdict is H
    big = [*fits, pt("every:4", 8, 123.7, 1538), pt("all", 8, 54.8, 1830)]
    a = claim(2, big)
    assert a.verdict is W and a.condition == "every:4 fits (batch 2: 58.00 GiB)"
    assert [p.verdict for p in a.parts] == [H, F]
    assert claim(2, replace(big, pt("every:4", 2, 77.0))).verdict is F


def test_claim_3_all_reclaims_badly_only_if_an_alternative_is_lower() -> None:
    assert claim(3, base_points()).verdict is F
    assert claim(3, replace(base_points(), pt("every:2", 2, 52.0))).verdict is H


def test_claim_4_most_of_all_s_saving() -> None:
    a = claim(4, base_points())
    assert a.verdict is H and a.parts[0].short == "b=2: -10.40 GiB (99.0% of all's saving)"
    assert claim(4, replace(base_points(), pt("first:16", 2, 58.0))).verdict is F  # 47.6% of the saving


def test_claim_5_open_until_range_8_12_is_measured_then_judged() -> None:
    a = claim(5, base_points())
    assert a.verdict is OPEN
    assert {p.stage for p in a.pending} == {STAGE_CLAIMS, STAGE_BATCH_MAX}
    mid = [*base_points(), pt("range:8-12", 2, 55.0, 420), pt("range:8-12", 4, 60.0), pt("range:8-12", 8, 80.0),
           pt("range:8-12", 6, 70.0)]
    assert claim(5, mid).verdict is H  # 59.1 GB, 7.1% slower, batch 6 within 76 GiB
    tight = replace(mid, pt("range:8-12", 6, 77.0))
    a = claim(5, tight)
    assert a.verdict is W and a.parts[2].verdict is F and a.parts[2].short == "batch 6 does not fit"


def test_claim_6_about_50_gb() -> None:
    a = claim(6, [*base_points(), pt("last:6", 2, 61.1)])
    assert a.verdict is F and a.partly_open  # last:4 not measured
    assert claim(6, [*base_points(), pt("last:6", 2, 50.0), pt("last:4", 2, 51.0)]).verdict is H


def test_claim_7_finer_wrapping() -> None:
    pts = [*base_points(), pt("all@attn+mlp", 2, 53.0, 475)]
    assert claim(7, pts).verdict is F
    assert claim(7, replace(pts, pt("all@attn+mlp", 2, 50.0, 800))).verdict is H  # saves 2.5 GiB, 2.05x


def test_claim_8_offloading_helps_only_where_nothing_plain_fits() -> None:
    plain = [*base_points(), pt("none", 2, 51.2, 2150, offload="all")]
    a = claim(8, plain)
    assert a.verdict is F and a.partly_open
    assert a.parts[0].short == "none b=2 offload=all: none b=2 fits and is 5.51x as fast"
    # At batch 8 nothing plain fits the 76 GiB limit, the offloaded point does.
    big = [pt("none", 8, status="oom"), pt("all", 8, 90.0, 1800), pt("first:8", 8, 70.0, 4000, offload="all")]
    a = claim(8, big)
    assert a.verdict is H and not a.partly_open  # first:8 has 8 checkpointed layers


def test_claim_9_static_share() -> None:
    assert claim(9, base_points()).verdict is H
    act = replace(base_points(), pt("none", 2, 140.0, alloc=139.0), pt("all", 2, 60.0))
    assert claim(9, act).verdict is F


def test_claim_10_batch_4_and_shorter_sequences() -> None:
    a = claim(10, base_points())
    assert a.verdict is OPEN and {p.stage for p in a.pending} == {STAGE_BATCH_MAX, STAGE_SEQ}
    fits = [*base_points(), pt("none", 4, 74.0, 760), pt("none", 4, status="oom", seq=1024),
            pt("none", 16, 70.0, seq=512)]
    a = claim(10, fits)
    assert [p.verdict for p in a.parts] == [H, F, H] and a.verdict is W


def test_claim_11_accumulation() -> None:
    b8 = [*base_points(), pt("all", 8, 55.0, 1830)]
    slow = [*b8, pt("none", 1, 57.0, 2000, micro_batches=8)]
    assert claim(11, slow).verdict is F
    fast = [*b8, pt("none", 1, 57.0, 1500, micro_batches=8)]
    a = claim(11, fast)
    assert a.verdict is H and not a.partly_open


def test_claim_12_several_gb() -> None:
    a = claim(12, [*base_points(), pt("none", 2, 51.6, 558, optimizer="adamw_8bit")])
    assert a.verdict is H and a.partly_open
    assert {p.stage for p in a.pending} >= {STAGE_TUNE}
    small = [*base_points(), pt("none", 2, 62.0, 558, optimizer="adamw_8bit")]
    assert claim(12, small).verdict is F
    amp = [*small, pt("all", 2, status="oom", precision="amp_bf16")]
    assert claim(12, amp).parts[0].verdict is F


def test_claim_13_twice_as_slow() -> None:
    assert claim(13, base_points()).verdict is F
    assert claim(13, replace(base_points(), pt("all", 2, 52.5, 800))).verdict is H


def test_claim_14_needs_the_optimizer_offload_axis() -> None:
    a = claim(14, base_points())
    assert a.verdict is OPEN and a.pending[0].stage == STAGE_TUNE
    assert a.estimates and "about 38.00 GiB" in a.estimates[0]  # 63 GiB minus the 25 GiB AdamW state
    offload = [*base_points(), pt("none", 2, 40.0, 450, extra_key={"optimizer_offload": "cpu"})]
    assert claim(14, offload).verdict is H  # 42.9 GB, 1.15x < all's 1.27x
    assert claim(14, replace(offload, pt("none", 2, 40.0, 600, extra_key={"optimizer_offload": "cpu"}))).verdict is F


def test_an_unknown_axis_is_never_plain_training() -> None:
    """A newer run's point with optimizer_offload=cpu must not stand in for plain none."""
    ev = answers(run_of([pt("none", 2, 40.0, extra_key={"optimizer_offload": "cpu"})])).answers
    assert ev[8].parts[0].verdict is OPEN  # claim 9 found no plain none at batch 2


def test_the_first_run_given_is_cited() -> None:
    a, b = base_points(), replace(base_points(), pt("none", 2, 70.0))
    assert claim(4, a, b).parts[0].cites[0].run == "runs/a"
    assert claim(4, b, a).parts[0].cites[0].mem == 70 * 2**30


def test_every_stage_an_answer_waits_for_is_a_stage_script() -> None:
    import re
    from pathlib import Path

    stages = Path(__file__).resolve().parents[1] / "scripts" / "gpu_stages"
    named = {v for k, v in vars(verdicts).items() if k.startswith("STAGE_") and re.fullmatch(r"\d\d-[\w-]+", v)}
    assert len(named) == 5  # 20, 21, 22, 23, 50 (the tune stage is issue 13's: its number only)
    for name in named:
        assert (stages / f"{name}.sh").is_file(), name
