"""Benjamini-Hochberg adjusted p-values without scipy: ``scipy.stats.false_discovery_control(ps, method='bh')``
bit for bit, for p-values that are floats in [0, 1] (what the step-time verdicts give).

scipy sorts the p-values, multiplies the k-th smallest (k from 1) by m / k, takes the running minimum from the
largest down, puts them back in the input's order and clips them to [0, 1]. The same float operations in the
same order give the same bits (a tie's place in the sort does not matter: tied values end with the same
minimum). Importing scipy.stats for it cost about a second of every ``compare``.
"""

from __future__ import annotations

from collections.abc import Sequence


def bh_adjusted(ps: Sequence[float]) -> list[float] | None:
    """The adjusted p-values in input order; None for input scipy treats otherwise (a value that is not a float
    in [0, 1]: scipy refuses it or keeps integers): the caller asks scipy."""
    if not all(type(p) is float and 0.0 <= p <= 1.0 for p in ps):
        return None
    m = len(ps)
    if m <= 1:
        return list(ps)  # scipy returns one p-value as it is
    order = sorted(range(m), key=ps.__getitem__)
    adjusted = [ps[j] * (m / k) for k, j in enumerate(order, start=1)]
    for k in range(m - 2, -1, -1):  # numpy's minimum.accumulate over the reversed values
        if adjusted[k + 1] < adjusted[k]:
            adjusted[k] = adjusted[k + 1]
    out = [0.0] * m
    for q, j in zip(adjusted, order, strict=True):
        out[j] = min(max(q, 0.0), 1.0)
    return out
