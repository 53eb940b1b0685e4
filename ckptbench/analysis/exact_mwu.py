"""Mann-Whitney U p-values of small samples without scipy: the exact null distribution, counted once per pair of
sample sizes, bit for bit scipy's.

Most runs measure a few steps a point (3 and 3), where scipy's ``method='auto'`` takes the exact distribution.
Importing scipy.stats for that costs about a second, a third of a 20,000-point ``compare``; counting the
distribution takes microseconds. Here the p-value of such a pair is computed as scipy computes it (in
``stats/_mannwhitneyu.py``, two-sided, no ties): U is the larger of U1 and n1*n2 - U1, the p-value twice the
sum, from the left, of the probabilities of 0 .. n1*n2 - U (each count divided by C(n1 + n2, n1), added one
by one as ``numpy.cumsum`` does), at most 1. For the sizes ``counted`` admits every count, and every product
and partial sum scipy forms on the way, is an exact integer in a float, so the same divisions and additions give
the same bits (tests/test_compare_speed.py checks every such size up to 12 against scipy). Every other pair
(ties, larger samples, values that are not plain finite numbers) goes to ``mann_whitney_ps``, which imports
scipy only when it has such a pair.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

from ckptbench.analysis.mann_whitney import mann_whitney_ps

_EXACT_MAX = 8  # scipy's 'auto' rule: exact when a side has at most this many samples and nothing is tied
_EXACT_INTEGERS = 2**53  # below it every count and partial sum is exact in a float (as in scipy's float math)


def _plain(samples: Sequence[object]) -> list[float] | None:
    """The samples as floats when each is a finite int or float (not a bool); None otherwise."""
    out = []
    for v in samples:
        if type(v) is not float and type(v) is not int:
            return None
        f = float(v)
        if not math.isfinite(f):
            return None
        out.append(f)
    return out


def counted(n1: int, n2: int) -> bool:
    """Whether a pair of sample sizes is computed here (scipy would take its exact method, with no ties)."""
    if not (n1 and n2) or (n1 > _EXACT_MAX and n2 > _EXACT_MAX):
        return False
    # scipy's C(n1 + n2, n1) is a product of the small side's factors before the division by its factorial, and
    # its counts come from sums of counts times divisor sums (at most (n1 + n2)**2): all exact below 2**53.
    bound = math.comb(n1 + n2, n1) * math.factorial(min(n1, n2)) * (n1 * n2 + 1) * (n1 + n2) ** 2
    return bound < _EXACT_INTEGERS


@functools.cache
def _cumulative(n1: int, n2: int) -> tuple[float, ...]:
    """P(U <= k) for k = 0 .. n1*n2 under no change, summed from the left one probability at a time."""
    # counts[m][u]: the orderings of the small sample's m values among the other's n2 with U = u; adding the
    # largest value of the pooled samples either to the small sample (raising U by the other's count) or not.
    small, large = min(n1, n2), max(n1, n2)
    counts = [[0] * (small * large + 1) for _ in range(small + 1)]
    for m in range(small + 1):
        counts[m][0] = 1  # no large value yet: one ordering, U = 0
    for j in range(1, large + 1):  # pools of m small values and j large ones, built up j by j
        new = [[0] * (small * large + 1) for _ in range(small + 1)]
        new[0][0] = 1
        for m in range(1, small + 1):
            for u in range(m * j + 1):
                # the pool's largest value is from the large sample (counts[m] with j-1) or the small one
                # (it beats all j large values: new[m-1] with j, shifted by j)
                new[m][u] = counts[m][u] + (new[m - 1][u - j] if u >= j else 0)
        counts = new
    total = float(math.comb(n1 + n2, n1))
    cumulative = []
    acc = 0.0
    for c in counts[small]:
        acc += c / total
        cumulative.append(acc)
    return tuple(cumulative)


def exact_p(base: list[float], new: list[float]) -> float:
    """scipy's two-sided exact p-value of plain samples with no ties and ``counted`` sizes."""
    n1, n2 = len(new), len(base)
    u1 = sum(1 for x in new for y in base if x > y)  # no ties: each pair counts 0 or 1
    u = max(u1, n1 * n2 - u1)
    p = 2.0 * _cumulative(n1, n2)[n1 * n2 - u]
    return min(max(p, 0.0), 1.0)


def quick_mann_whitney_ps(pairs: Sequence[tuple[Sequence[float], Sequence[float]]]) -> list[float | None]:
    """``mann_whitney_ps(pairs)``, the same values: small untied pairs counted here, the rest by scipy."""
    out: list[float | None] = [None] * len(pairs)
    rest: list[int] = []
    for i, (base_s, new_s) in enumerate(pairs):
        if not base_s or not new_s:
            continue  # None, as mann_whitney_ps
        base, new = _plain(base_s), _plain(new_s)
        tied = base is not None and new is not None and len({*base, *new}) < len(base) + len(new)
        if base is None or new is None or tied or not counted(len(new), len(base)):
            rest.append(i)
            continue
        out[i] = exact_p(base, new)
    if rest:
        for i, p in zip(rest, mann_whitney_ps([pairs[i] for i in rest]), strict=True):
            out[i] = p
    return out
