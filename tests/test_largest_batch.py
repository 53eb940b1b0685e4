"""advise's largest batch with every layer checkpointed (advise/predictor.py ``largest_batch``) on a made-up card:
the answer held to its neighbour, the probes few, and a batch traced already (an earlier question's) probed instead
of a new one near it: the same answer for fewer traces."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from ckptbench.advise import predictor
from ckptbench.advise.predictor import largest_batch
from ckptbench.config.grid import Point

GIB = 2**30
BASE = Point(precision="bf16", lora="none", layout="none", seq_len=2048, batch_size=2, model="llama-7b",
             optimizer="adamw_fused")


class _Card:
    """What a batch needs (convex in it, as activations grow past the optimizer's peak), against a limit; which
    batches were traced (a probe of any other traces it)."""

    def __init__(self, limit_gib: float, traced: set[int], needs: Callable[[int], int] | None = None,
                 fits: Callable[[int], bool] | None = None) -> None:
        self.limit = SimpleNamespace(limit_bytes=int(limit_gib * GIB))
        self.card = SimpleNamespace(context_bytes=GIB // 2)
        self.done, self.traces = set(traced), list[int]()
        self.need = needs or self.needs
        self.fit = fits or (lambda b: self.need(b) <= self.limit.limit_bytes)

    @staticmethod
    def needs(b: int) -> int:
        return int((40 + 1.5 * b + b * b / 40) * GIB)

    def traced(self, point: Point) -> bool:
        return point.batch_size in self.done

    def verdict(self, point: Point) -> Any:
        b = point.batch_size
        if b not in self.done:
            self.done.add(b)
            self.traces.append(b)
        need = self.need(b)
        return SimpleNamespace(fits=self.fit(b), needed_bytes=need, allocated_bytes=need)

    def estimate(self, point: Point) -> None:
        return None


def _largest(card: _Card) -> int:
    known = [SimpleNamespace(family="all", accumulation=1, point=SimpleNamespace(batch_size=b)) for b in (2, 8)]
    found = largest_batch(card, BASE, known)  # type: ignore[arg-type]
    assert found is not None
    return found[0]


@pytest.mark.parametrize("limit_gib", [60.0, 75.3, 130.0, 200.0])
def test_the_largest_batch_is_held_to_its_neighbour_and_an_earlier_questions_traces_are_probed_first(
        limit_gib: float, monkeypatch: pytest.MonkeyPatch) -> None:
    cold = _Card(limit_gib, {2, 8})
    assert _largest(cold) == _truth(limit_gib) and 0 < len(cold.traces) <= 6
    # asked again with 5-10% more or less room (headroom), or on a card 1% smaller or larger (an H100 after an A100:
    # 0.2% smaller): the same answer as without the earlier traces, for no more traces than the same search that
    # only reuses a batch it probes anyway (FREE_WINDOW 0)
    saved, plains = [], []
    for scale in (0.9, 0.95, 0.99, 1.01, 1.05):
        monkeypatch.setattr(predictor, "FREE_WINDOW", 4)
        again = _Card(limit_gib * scale, {2, 8, *cold.traces})
        assert _largest(again) == _truth(limit_gib * scale)
        monkeypatch.setattr(predictor, "FREE_WINDOW", 0)
        plain = _Card(limit_gib * scale, {2, 8, *cold.traces})
        assert _largest(plain) == _truth(limit_gib * scale)
        assert len(again.traces) <= len(plain.traces), (scale, again.traces, plain.traces)
        saved.append(len(plain.traces) - len(again.traces))
        plains.append(len(plain.traces))
    if limit_gib >= 130:  # a boundary far from the question's batches: the earlier probes save most traces
        fresh = sum(len(_traced(_Card(limit_gib * scale, {2, 8}))) for scale in (0.9, 0.95, 0.99, 1.01, 1.05))
        assert sum(plain - s for plain, s in zip(plains, saved, strict=True)) * 2 <= fresh, (saved, fresh)


def test_a_need_flat_at_the_questions_batches_is_probed_at_most_at_twice_the_largest_that_fits() -> None:
    """At the question's batches the step's peak may be the optimizer's (the need hardly grows with the batch): the
    line through them overshoots (LLaMA-7B at sequence 2048 on an A100-80GB: 53 for 19), so a probe goes at most to
    twice the largest batch that fits."""
    flat = lambda b: int((53.5 + 0.1 * b + 1.7 * max(0, b - 9)) * GIB)  # noqa: E731
    card = _Card(75.3, {2, 8}, needs=flat)
    assert _largest(card) == max(b for b in range(1, 4096) if flat(b) <= 75.3 * GIB)
    assert card.traces[0] == 16 and len(card.traces) <= 4, card.traces


def test_a_batch_that_runs_out_only_through_fragmentation_is_bisected_past() -> None:
    """A batch the allocator runs out of memory at (a card's fragmentation: LLaMA-7B's batches 25 to 29 on an
    A100-80GB) shows its allocated peak, under the limit: regula falsi's line through it would step down one batch at
    a time; the bracket is bisected instead."""
    need = lambda b: int((60 + 0.5 * b if b < 20 else 40 + b) * GIB)  # noqa: E731  (20 to 35: under the limit)
    card = _Card(75.3, {2, 8}, needs=need, fits=lambda b: b <= 19)
    assert _largest(card) == 19 and len(card.traces) <= 6, card.traces


def _traced(card: _Card) -> list[int]:
    _largest(card)
    return card.traces


def _truth(limit_gib: float) -> int:
    return max(b for b in range(1, 4096) if _Card.needs(b) <= limit_gib * GIB)
