"""Each claim's verdict on hand-built runs: one run where it holds, one where it does not (or is open)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from ckptbench.answers import verdicts
from ckptbench.answers.predictions import Predictions
from ckptbench.answers.verdicts import (
    STAGE_BATCH_MAX,
    STAGE_CLAIMS,
    STAGE_LAYOUT_FIT,
    STAGE_SEQ,
    STAGE_TUNE,
    Answer,
    Verdict,
)
from tests._known import known
from tests.handbuilt import answers, base_points, key, predicted, predictions, pt, run_of, times

pytestmark = pytest.mark.trace_cache  # its traces kept on disk, shared with the other files that ask for them

H, F, W, OPEN = Verdict.HOLDS, Verdict.FAILS, Verdict.ONLY_WHEN, Verdict.OPEN


def claim(n: int, points: list[dict[str, Any]], *more: list[dict[str, Any]], pr: Predictions | None = None) -> Answer:
    runs = [run_of(points, path="runs/a")] + [run_of(p, path=f"runs/{i}") for i, p in enumerate(more)]
    return answers(*runs, pr=pr).answers[n - 1]


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
    # The claim's case: batch 8 in one pass does not fit without checkpointing.
    b8 = [*base_points(), pt("none", 8, status="oom"), pt("all", 8, 55.0, 1830)]
    slow = [*b8, pt("none", 1, 57.0, 2000, micro_batches=8)]
    assert claim(11, slow).verdict is F
    fast = [*b8, pt("none", 1, 57.0, 1500, micro_batches=8)]
    a = claim(11, fast)
    assert a.verdict is H and not a.partly_open and a.basis == "measured"
    assert a.parts[0].short == "b=1x8 1.22x the speed of all b=8"
    # Where batch 8 fits without checkpointing, accumulation only costs speed.
    fits = [*base_points(), pt("none", 8, 70.0, 1400), pt("none", 1, 57.0, 1500, micro_batches=8)]
    assert claim(11, fits).verdict is F and "it fits, so accumulation is not needed" in claim(11, fits).parts[0].text


def test_claim_11_is_not_settled_by_accumulation_where_the_larger_batch_fits() -> None:
    """all 2 x 4 against all at batch 8 (which fits) is not the claim's case: a note, not the verdict."""
    pts = [*base_points(), pt("all", 8, 55.0, 1830), pt("all", 2, 55.4, 1925, micro_batches=4)]
    a = claim(11, pts)
    assert a.verdict is OPEN and a.pending[0].stage == STAGE_CLAIMS
    assert a.notes and a.notes[0].startswith("Not the claim's case (measured): all b=2 micro_batches=4 fits")


def test_claim_11_from_predictions_and_fitted_times() -> None:
    b8 = [*base_points(), pt("none", 8, status="oom"), pt("all", 8, 55.0, 1830)]
    case = key("none", 1, micro_batches=8)
    pr = predictions(predicted("none", 1, 65.0, micro_batches=8), ms=times((case, 1595.3)))
    a = claim(11, b8, pr=pr)
    assert a.verdict is H and a.basis == "predicted" and a.parts[0].predicted[0].label.startswith("none b=1")
    assert "10,270 tok/s (fitted)" in a.parts[0].text and "65.60 GiB (predicted)" in a.parts[0].text
    assert a.parts[0].short.endswith("(fitted)")
    # The fastest way to batch 8 in one pass that fits may itself be predicted: the fewest first:k.
    pr = predictions(predicted("none", 1, 65.0, micro_batches=8), predicted("first:23", 8, 75.0),
                     predicted("first:22", 8, 78.0), ms=times((case, 1900.0), (key("first:23", 8), 1722.5)))
    a = claim(11, b8, pr=pr)
    assert a.verdict is F and "first:23 b=8, at 9,512 tok/s (fitted)" in a.parts[0].text
    # Accumulation that does not fit either.
    assert claim(11, b8, pr=predictions(predicted("none", 1, 80.0, micro_batches=8))).verdict is F


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
    assert a.verdict is F and a.partly_open and a.pending[0].stage == STAGE_TUNE
    assert a.parts[0].label == "ZeRO-2 itself on one GPU" and a.parts[0].short == "ZeRO-2 alone: 67.6 GB"
    assert a.estimates and "about 38.00 GiB" in a.estimates[0]  # 63 GiB minus the 25 GiB AdamW state
    offload = [*base_points(), pt("none", 2, 40.0, 450, extra_key={"optimizer_offload": "cpu"})]
    a = claim(14, offload)
    assert a.verdict is W and a.parts[1].verdict is H  # 42.9 GB, 1.15x < all's 1.27x
    slow = replace(offload, pt("none", 2, 40.0, 600, extra_key={"optimizer_offload": "cpu"}))
    assert claim(14, slow).verdict is F


def test_claim_14_offload_memory_from_the_prediction() -> None:
    a = claim(14, base_points(), pr=predictions(predicted("none", 2, 63.2)))
    mem = a.parts[1]
    assert mem.verdict is H and mem.short == "offload: 41.6 GB (predicted)" and not a.estimates
    assert "predicted by arithmetic" in mem.text and a.parts[2].verdict is OPEN  # its speed: nothing can say
    small_state = predictions(predicted("none", 2, 63.2, state=5.0))
    assert claim(14, base_points(), pr=small_state).parts[1].verdict is F  # 62.5 GB: not the 40s


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


def test_claim_1_the_fewest_first_k_at_batch_8_by_prediction() -> None:
    b8 = [*base_points(), pt("none", 8, status="oom"), pt("all", 8, 54.8, 1830), pt("first:16", 8, 96.4, 1637)]
    part = claim(1, b8).parts[1]
    assert part.pending[0].stage == STAGE_LAYOUT_FIT and not part.predicted
    pr = predictions(predicted("first:23", 8, 75.0), predicted("first:22", 8, 78.0))
    part = claim(1, b8, pr=pr).parts[1]
    assert not part.pending and part.short.endswith("first:23 fits (predicted)")
    assert "needs 75.70 GiB (predicted) and first:22 78.73 GiB (predicted)" in part.text
    # Not bracketed (first:22 not predicted): no boundary is claimed.
    assert claim(1, b8, pr=predictions(predicted("first:23", 8, 75.0))).parts[1].pending


def test_the_none_out_of_memory_against_a_fresh_process() -> None:
    oom = pt("none", 8, status="oom")
    oom["reason"] = ("CUDA out of memory. Tried to allocate 1.95 GiB. GPU 0 has a total capacity of 139.80 GiB of "
                     "which 327.12 MiB is free. Including non-PyTorch memory, this process has 139.47 GiB memory in "
                     "use. Of the allocated memory 132.21 GiB is allocated by PyTorch, and 6.52 GiB is reserved by "
                     "PyTorch but unallocated.")
    b8 = [*base_points(), oom, pt("all", 8, 54.8, 1830), pt("first:16", 8, 96.4, 1637)]
    same = predictions(predicted("none", 8, oom=(1.95, 132.21, 138.48)))
    note = claim(1, b8, pr=same).notes[0]
    assert "after 6 other points" in note and "138.73 GiB reserved (measured)" in note
    assert "256.00 MiB (more in the sweep's process), not the outcome" in note
    assert note.endswith("This out-of-memory error does not depend on the process.")
    fresh_fits = predictions(predicted("none", 8, 130.0))
    note = claim(1, b8, pr=fresh_fits).notes[0]
    assert "9.06 GiB below what the 139.80 GiB card leaves the allocator (predicted)" in note
    assert note.endswith("this out-of-memory error depends on the process.")
    assert not claim(1, b8).notes  # nothing to set against without a prediction


def test_claim_5_from_predictions() -> None:
    mid = key("range:8-12", 2)
    pr = predictions(predicted("range:8-12", 2, 59.9), predicted("range:8-12", 3, 72.0),
                     predicted("range:8-12", 4, 80.7), predicted("range:8-12", 6, 106.2), ms=times((mid, 418.5)))
    a = claim(5, base_points(), pr=pr)
    assert [p.verdict for p in a.parts] == [F, H, F] and a.basis == "predicted" and not a.partly_open
    assert a.parts[0].text == "At batch 2, range:8-12 goes from 67.6 GB (63.00 GiB, measured) to 64.9 GB (60.46 GiB, " \
        "predicted)."
    assert a.parts[1].short == "6.8% slower (fitted)"  # 9,787 fitted vs 10,503 measured tokens/s
    assert a.parts[2].short == "largest batch 3 (predicted)"
    assert "Batch 6 needs 107.19 GiB (predicted)" in a.parts[2].text
    roomy = predictions(predicted("range:8-12", 2, 52.0), predicted("range:8-12", 6, 70.0),
                        predicted("range:8-12", 7, 80.0), ms=times((mid, 800.0)))
    a = claim(5, base_points(), pr=roomy)
    assert [p.verdict for p in a.parts] == [H, F, H]  # 55.8 GB; 51% slower; batch 6 fits


def test_claim_6_last_4_from_the_prediction() -> None:
    a = claim(6, [*base_points(), pt("last:6", 2, 61.1)], pr=predictions(predicted("last:4", 2, 61.3)))
    assert a.verdict is F and not a.partly_open and a.basis == "partly predicted"
    assert a.parts[0].short == "last:4: 66.4 GB (predicted)"
    low = predictions(predicted("last:4", 2, 50.0))
    assert claim(6, [*base_points(), pt("last:6", 2, 50.0)], pr=low).verdict is H


def test_claim_7_says_when_allocated_and_reserved_disagree() -> None:
    # all b=2: 52.5 GiB reserved, 51.5 allocated. Finer: 51.5 reserved (-1.9%), 51.4 allocated (-0.2%).
    pts = [*base_points(), pt("all@attn+mlp", 2, 51.5, 475, alloc=51.4)]
    a = claim(7, pts)
    part = a.parts[0]
    assert part.verdict is W and part.condition == "memory is counted as reserved (batch 2)"
    assert "Allocated and reserved disagree: it saves more than 1.0% counted as reserved memory" in part.text
    # Lower allocated but higher reserved, neither by 1%: does not hold, and says they disagree in direction.
    part = claim(7, replace(pts, pt("all@attn+mlp", 2, 53.0, 475, alloc=51.3))).parts[0]
    assert part.verdict is F and "disagree in direction: lower allocated, higher reserved" in part.text
    part = claim(7, replace(pts, pt("all@attn+mlp", 2, 50.0, 475, alloc=49.0))).parts[0]
    assert part.verdict is H and "agree: it saves more than 1.0% either way" in part.text


def test_claim_8_offloading_with_checkpointed_layers_from_predictions() -> None:
    big = [pt("none", 8, status="oom"), pt("all", 8, 90.0, 1800)]
    a = claim(8, big, pr=predictions(predicted("first:8", 8, 55.0, offload="all")))
    assert a.verdict is H and a.basis == "predicted"  # fits where nothing plain does
    a = claim(8, replace(big, pt("all", 8, 54.8, 1830)), pr=predictions(predicted("first:8", 8, 55.0, offload="all")))
    assert a.verdict is OPEN and a.pending[0].what == "first:8 b=8 offload=all (its step time)"
    assert "all b=8 54.80 GiB (measured)" in a.parts[0].text
    a = claim(8, big, pr=predictions(predicted("first:8", 8, 80.0, offload="all")))
    assert a.verdict is F


def test_claim_10_from_predictions() -> None:
    pr = predictions(predicted("none", 4, 87.5), predicted("none", 5, 72.4, seq=1024),
                     predicted("none", 6, 77.7, seq=1024), predicted("none", 8, 74.0, seq=512),
                     predicted("none", 9, 80.0, seq=512))
    a = claim(10, base_points(), pr=pr)
    assert [p.verdict for p in a.parts] == [F, H, F, OPEN] and a.parts[3].label == "speed at seq 1024"
    assert a.parts[1].short == "s=1024: batch 5 fits (predicted)"
    assert {p.stage for p in a.pending} == {STAGE_SEQ}
    fits = predictions(predicted("none", 4, 74.0), ms=times((key("none", 4), 742.1)))
    part = claim(10, base_points(), pr=fits).parts[0]
    assert part.verdict is H and "11,039 tok/s (fitted)" in part.text and "(10,503 tok/s (measured))" in part.text


def test_claim_12_mixed_precision_from_the_prediction() -> None:
    pts = [*base_points(), pt("none", 2, 51.6, 558, optimizer="adamw_8bit")]
    fp32 = 25 * 2**30  # fp32 parameters and gradients of LLaMA-7B
    amp = dataclasses.replace(predicted("all", 2, 103.8, alloc=100.8, precision="amp_bf16", state=50.2),
                              params_bytes=fp32, grads_bytes=fp32)
    part = claim(12, pts, pr=predictions(amp)).parts[0]
    assert part.verdict is F and part.short == "mixed precision (amp_bf16): all needs 104.77 GiB (predicted)"
    assert "state alone take 100.20 GiB (predicted)" in part.text
    assert "no layout makes it fit an 80 GB card" in part.text  # the static part alone is over the budget
    part = claim(12, pts, pr=predictions(predicted("all", 2, 78.0, precision="amp_bf16", state=50.2))).parts[0]
    assert part.verdict is F and part.text.endswith("over the 76.00 GiB limit. Pure bf16 all: 52.50 GiB (measured).")
    small = predicted("all", 2, 50.0, precision="amp_bf16", state=20.0)
    assert claim(12, pts, pr=predictions(small)).parts[0].verdict is H  # fits and below pure bf16's 52.5 GiB


def test_claim_13_against_none_s_fitted_time_where_none_does_not_run() -> None:
    b8 = [*base_points(), pt("none", 8, status="oom"), pt("all", 8, 54.8, 1830), pt("first:16", 8, 96.4, 1637)]
    assert [p.label for p in claim(13, b8).parts] == ["batch 2"]
    pr = predictions(predicted("none", 8, oom=(1.95, 132.2, 138.5)), ms=times((key("none", 8), 1437.4)))
    a = claim(13, b8, pr=pr)
    assert a.parts[1].label == "batch 8" and a.parts[1].short == "b=8: at most 1.27x (none fitted)"
    assert "1437.4 ms/step (fitted)" in a.parts[1].text
    pr = predictions(predicted("none", 8, oom=(1.95, 132.2, 138.5)), ms=times((key("none", 8), 900.0)))
    assert claim(13, b8, pr=pr).parts[1].verdict is H  # 2.03x


def test_a_search_is_read_only_where_predictions_bracket_its_boundary() -> None:
    from ckptbench.answers.evidence import Scope
    from ckptbench.answers.predictions import searches

    s = searches(Scope())["fewest first:k b=8"]
    limit = 76 * 2**30
    assert predictions(predicted("first:16", 8, 96.0), predicted("first:24", 8, 74.0)).search(s, limit) is None
    found = predictions(predicted("first:24", 8, 74.0), predicted("first:23", 8, 77.0)).search(s, limit)
    assert found is not None and found.value == 24 and found.beyond is not None
    assert known(predictions(predicted("first:1", 8, 70.0)).search(s, limit)).value == 1  # the range's end fits
    up = searches(Scope())["largest batch range:8-12"]
    assert known(predictions(predicted("range:8-12", 8, 70.0)).search(up, limit)).beyond is None  # 8 or more
