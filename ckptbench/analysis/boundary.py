"""Where a yes/no along an axis turns: the smallest or largest value with ``fits`` (pure; the one bisection every
search uses: advise, the answers' predictions, a sweep's batch_size: max and layout: fit).

Bisection assumes fitting is monotone along the axis. Near a card's limit the caching allocator can make it not
so in the number of checkpointed layers: where that matters, every count is judged instead
(advise/predictor.py ``FamilyScan``), and a bisection only plans which points to measure.
"""

from __future__ import annotations

from collections.abc import Callable


def smallest(fits: Callable[[int], bool], lo: int, hi: int) -> int | None:
    """The smallest k in lo..hi with ``fits(k)``, by bisection (fitting monotone in k); None if hi does not fit."""
    if not fits(hi):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def largest(fits: Callable[[int], bool], lo: int, hi: int) -> int | None:
    """The largest k in lo..hi with ``fits(k)``, by bisection (monotone); None if lo does not fit."""
    if not fits(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def largest_by_doubling(fits: Callable[[int], bool | None], limit: int) -> int | None:
    """The largest value in 1..limit with ``fits`` when the top is unknown: doubling from 1, then bisecting between
    the last that fits and the first that does not (0: not even 1 fits); None as soon as ``fits`` cannot say."""
    fit, fail, value = 0, None, 1
    while fail is None and value <= limit:
        ok = fits(value)
        if ok is None:
            return None
        fit, fail, value = (value, None, value * 2) if ok else (fit, value, value)
    while fail is not None and fail - fit > 1:
        mid = (fit + fail) // 2
        ok = fits(mid)
        if ok is None:
            return None
        fit, fail = (mid, fail) if ok else (fit, mid)
    return fit
