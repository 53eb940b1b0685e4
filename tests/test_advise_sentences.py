"""Every comparison `ckptbench advise` states holds for the numbers it cites, over 21 rendered answers (cards,
budgets, headrooms, batches, precisions, an observed figure, nothing fitting).

advise/answer.py says comparisons in a few forms that carry both sides; each form has a pattern here and a check
of its numbers. Whatever comparison is left in the text after the checked ones are taken out is a failure: a
sentence that compares without its numbers (or in a new form) must get a pattern and a check first.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

from tests._advise_shared import advise_shared, rendered

pytestmark = pytest.mark.trace_cache  # its traces kept on disk, shared with the other files that ask for them

THREAD = {"model": "llama-7b", "batches": (2, 8), "seqs": (2048,)}
REQUESTS: list[dict[str, Any]] = [
    {**THREAD, "gpu": "a100-80gb"},
    {**THREAD, "gpu": "a100-80gb", "headroom": "0"},
    {**THREAD, "gpu": "a100-80gb", "headroom": "10%"},
    {**THREAD, "gpu": "a100-80gb", "headroom": "1%", "precision": "bf16"},
    {**THREAD, "gpu": "a100-80gb", "budget": "70GiB", "headroom": "2GiB"},
    {"model": "llama-7b", "gpu": "a100-80gb", "batches": (2,), "seqs": (2048,), "observed": "70GiB"},
    {"model": "llama-7b", "gpu": "a100-80gb", "batches": (2,), "seqs": (2048,), "observed": "64GiB"},
    {"model": "llama-7b", "gpu": "a100-80gb", "batches": (2,), "seqs": (2048,), "precision": "amp_bf16"},
    {"model": "llama-7b", "gpu": "a100-80gb", "batches": (2,), "seqs": (2048,), "precision": "amp_bf16",
     "headroom": "0", "observed": "78GiB"},
    {**THREAD, "gpu": "a100-40gb"},
    {**THREAD, "gpu": "a100-40gb", "headroom": "0", "precision": "bf16"},
    {**THREAD, "gpu": "a100-40gb", "headroom": "2GiB", "precision": "bf16"},
    {"model": "llama-7b", "gpu": "a100-40gb", "batches": (2,), "seqs": (2048,), "precision": "amp_bf16"},
    {"model": "llama-7b", "gpu": "a100-40gb", "batches": (8,), "seqs": (2048,), "precision": "bf16",
     "observed": "38GiB"},
    {**THREAD, "gpu": "l40s"},
    {**THREAD, "gpu": "l40s", "headroom": "0", "precision": "bf16"},
    {"model": "llama-7b", "gpu": "l40s", "batches": (2,), "seqs": (2048,), "precision": "amp_bf16"},
    {"model": "llama-7b", "gpu": "l40s", "batches": (8,), "seqs": (2048,), "budget": "40GiB", "precision": "bf16"},
    {"model": "qwen3-8b", "gpu": "a100-80gb", "batches": (2,), "seqs": (2048,), "precision": "bf16",
     "headroom": "0"},
    {"model": "qwen3-8b", "gpu": "a100-80gb", "batches": (2,), "seqs": (2048,), "precision": "bf16"},
    {"model": "qwen3-8b", "gpu": "l40s", "batches": (2,), "seqs": (2048,), "precision": "bf16", "headroom": "0"},
]
_N = r"([0-9][0-9,]*\.[0-9]+)"
_TOLERANCE = 0.011  # two decimals on each side


def _f(text: str) -> float:
    return float(text.replace(",", ""))


def _near(a: float, b: float, tol: float = _TOLERANCE) -> bool:
    return abs(a - b) <= tol


# (pattern, check of its numbers): every comparison form advise uses
CHECKS: list[tuple[str, Callable[..., bool]]] = [
    (rf"needs {_N} GiB, {_N} GiB below the {_N} GiB limit", lambda a, m, l_: _near(a + m, l_) and a <= l_ + 0.005),
    (rf"needs {_N} GiB, {_N} GiB above the {_N} GiB limit", lambda a, m, l_: _near(a - m, l_) and a > l_ - 0.005),
    (rf"needs {_N} GiB, {_N} GiB above (?:[\w-]+'s|the) {_N} GiB (?:usable|budget)",
     lambda a, m, b: _near(a - m, b) and a > b - 0.005),
    (rf"its allocated peak alone would be {_N} GiB, above the card's {_N} GiB", lambda a, c: a > c),
    (rf"its allocated peak {_N} GiB is below the card's {_N} GiB", lambda a, c: a < c),
    (rf"its allocated peak alone is {_N} GiB, {_N} GiB above the {_N} GiB limit",
     lambda a, m, l_: _near(a - m, l_) and a > l_),
    (rf"{_N}x the speed of [^(]*\({_N} vs {_N} s/step\)", lambda r, a, b: _near(r, b / a, 0.006 + 0.005 * r)),
    (rf"([+-][0-9]+)% time vs no checkpointing \({_N} vs {_N} s/step if it fit\)",
     lambda p, a, b: abs(p - 100 * (a / b - 1)) <= 0.6 + 100 * 0.01 / b),
    (rf"{_N} GiB is {_N} GiB above the predicted {_N} GiB", lambda o, g, e: _near(o - e, g) and o >= e - 0.005),
    (rf"{_N} GiB is {_N} GiB below the predicted {_N} GiB", lambda o, g, e: _near(e - o, g) and o <= e + 0.005),
]
# A comparison said in any other form (after the checked ones are taken out of the text).
LEFT = re.compile(r"\b(above|below|over|under|exceeds?|more than|less than|faster|slower|larger|smaller)\b(?!-)|"
                  r"[<>]|x the speed|% time")
TIGHT = re.compile(rf"below the {_N} GiB limit[^.]*?\. Tight: less than 1\.00 GiB to spare")


def _sentences(advice: Any) -> str:
    """The answer as printed, on lines long enough that no sentence is folded."""
    return rendered(advice, width=2000)


def _checked(text: str) -> tuple[int, str]:
    """How many comparisons were checked, and the text with them (and the tight notes) taken out."""
    count = 0
    for m in TIGHT.finditer(text):  # a tight choice: its margin, said just before, is under 1 GiB
        before = re.findall(rf"{_N} GiB below the", text[: m.start() + len("below the")])
        assert before and _f(before[-1]) < 1.0, m.group(0)
        count += 1
    text = re.sub(r"Tight: less than 1\.00 GiB to spare", "", text)
    for pattern, check in CHECKS:
        for m in re.finditer(pattern, text):
            numbers = [_f(g) for g in m.groups()]
            assert check(*numbers), m.group(0)
            count += 1
        text = re.sub(pattern, "", text)
    return count, text


@pytest.fixture(scope="module")
def answers() -> list[tuple[dict[str, Any], Any]]:
    return [(fields, advise_shared(**fields)) for fields in REQUESTS]


def test_every_comparison_holds_for_its_own_numbers(answers: list[tuple[dict[str, Any], Any]]) -> None:
    assert len(answers) >= 20
    total = 0
    for fields, advice in answers:
        count, left = _checked(_sentences(advice))
        assert count > 0, fields
        total += count
        # The code compares nothing, and the step times' source states the fit's error bound (a figure of the
        # model, not a comparison): the rest of the text holds no unchecked comparison.
        prose = re.sub(r"Step times:\n.*?\n\n", "", left.split("Code for")[0], flags=re.S)
        found = [m.group(0) for m in LEFT.finditer(prose)]
        assert not found, (fields, found, [line for line in prose.splitlines() if LEFT.search(line)][:3])
    assert total > 120


def test_what_fills_the_memory_adds_up_to_the_figure_it_explains(answers: list[tuple[dict[str, Any], Any]]) -> None:
    for fields, advice in answers:
        text = _sentences(advice)
        head = re.search(rf"Why {_N} GiB: ", text)
        if head is None:
            continue
        block = text[head.end(): text.index("\n\n", head.end())]
        parts = [_f(v) for v in re.findall(rf" {_N} GiB  ", block)]
        assert _near(sum(parts), _f(head.group(1)), 0.005 * len(parts) + 0.006), fields


def test_nothing_fits_is_said_only_when_no_row_fits(answers: list[tuple[dict[str, Any], Any]]) -> None:
    seen = 0
    for _, advice in answers:
        for t, sentence in zip(advice.tables, advice.answers, strict=False):
            if "nothing fits the" in sentence:
                seen += 1
                assert not any(o.fits for o in t.rows) and advice.ways_out
            elif "do not checkpoint" in sentence:
                assert t.none.fits
            else:
                assert t.choice is not None and t.choice.fits
    assert seen >= 3


def test_a_row_that_does_not_fit_shows_no_step_time(answers: list[tuple[dict[str, Any], Any]]) -> None:
    from ckptbench.render.advise import _row

    for _, advice in answers:
        for t in advice.tables:
            for o in t.rows:
                if not o.fits:
                    assert _row(o)["step s"] == "-" and _row(o)["tok/s"] == "-"
