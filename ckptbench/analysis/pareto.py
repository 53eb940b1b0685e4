"""The memory/throughput Pareto front of a run's candidates."""

from __future__ import annotations

from collections.abc import Sequence

from ckptbench.analysis.recommend_candidates import Candidate


def pareto_front(cands: Sequence[Candidate]) -> list[Candidate]:
    """Points no other point beats on both axes (less or equal memory and more or equal tokens/s,
    one of them strictly), by memory ascending. Exact duplicates both stay."""

    def dominated(c: Candidate) -> bool:
        return any(
            o.memory_bytes <= c.memory_bytes
            and o.tokens_per_s >= c.tokens_per_s
            and (o.memory_bytes < c.memory_bytes or o.tokens_per_s > c.tokens_per_s)
            for o in cands
        )

    return sorted((c for c in cands if not dominated(c)), key=lambda c: (c.memory_bytes, c.index))
