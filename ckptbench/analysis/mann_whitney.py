"""Many points' Mann-Whitney U p-values at once: scipy's ``mannwhitneyu`` over 2-D arrays, one call per
group of points whose step-time samples have the same sizes and the same choice of method.

Each p-value is exactly (bit for bit) what ``verdict.mann_whitney_p`` gives for the point alone: scipy
computes every row of a 2-D call with the same element-wise operations as a 1-D call, and a group never
mixes rows for which scipy's ``method='auto'`` would choose differently (exact when either side has at
most 8 samples and the pooled samples have no ties; asymptotic otherwise). A point whose samples are not
plain finite numbers takes the one-point call, with whatever it gives or raises.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ckptbench.analysis.verdict import mann_whitney_p

# scipy's 'auto' rule (stats/_mannwhitneyu.py _mwu_choose_method): exact unless both sides have more than
# this many samples or the pooled samples have ties.
_EXACT_MAX = 8


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


def mann_whitney_ps(pairs: Sequence[tuple[Sequence[float], Sequence[float]]]) -> list[float | None]:
    """``mann_whitney_p(base_s, new_s)`` of every (base_s, new_s) pair, in order, with one scipy call per
    group of equal sample sizes (and equal method) instead of one per pair."""
    out: list[float | None] = [None] * len(pairs)
    groups: dict[tuple[int, int, bool], list[tuple[int, list[float], list[float]]]] = {}
    for i, (base_s, new_s) in enumerate(pairs):
        if not base_s or not new_s:
            continue  # None, as mann_whitney_p
        base, new = _plain(base_s), _plain(new_s)
        if base is None or new is None:
            out[i] = mann_whitney_p(list(base_s), list(new_s))
            continue
        n, m = len(new), len(base)
        # Ties (equal floats in the pooled samples) decide the method only when a side is small.
        ties = (n <= _EXACT_MAX or m <= _EXACT_MAX) and len({*new, *base}) < n + m
        groups.setdefault((n, m, ties), []).append((i, base, new))
    if not groups:
        return out
    import numpy as np
    from scipy.stats import mannwhitneyu

    for rows in groups.values():
        x = np.array([new for _, _, new in rows], dtype=np.float64)
        y = np.array([base for _, base, _ in rows], dtype=np.float64)
        ps = mannwhitneyu(x, y, alternative="two-sided", axis=1).pvalue
        for (i, _, _), p in zip(rows, np.atleast_1d(ps).tolist(), strict=True):
            out[i] = 1.0 if math.isnan(p) else p  # all samples tied: no evidence of a change (as mann_whitney_p)
    return out
