"""The step-time verdict of one matched point: slower, faster or not, which rule decided, and how sure.

Step times are few (3 measured steps is common) and noisy, so one test is not enough:

1. **Mann-Whitney U** (two-sided, scipy, on the raw per-step samples): a change when p < alpha.
   With 3 and 3 samples its smallest possible p-value is 2 / C(6, 3) = 0.1, so alone it never fires.
2. **Ranges disjoint**: every new step is slower than every base step (or every one faster). With no
   change (exchangeable samples) one given side lies entirely above the other with probability
   1 / C(n+m, n): 1 in 20 for 3 and 3, the exact one-sided Mann-Whitney p-value of that ordering.
   The rule counts when that chance is at most alpha.

Either rule decides a change only when the median also moved by at least the noise band
(``time_rtol``); a change the rules cannot see is "within noise". With so few samples that neither
rule could ever fire (1 and 1, 2 and 2, 2 and 4) the verdict is "too few samples": nothing is claimed,
and a ``--fail-time`` gate refuses to pass silently (analysis/compare.py).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

MANN_WHITNEY = "mann-whitney"
RANGES_DISJOINT = "ranges disjoint"

# Marks this module decides (analysis/marks.py re-exports them with the memory marks).
WORSE, BETTER, NOISE = "worse", "better", "within noise"
TOO_FEW, NOT_COMPARABLE = "too few samples", "not comparable"


@dataclass(frozen=True)
class TimeVerdict:
    """What the step-time samples of two runs say about one point."""

    mark: str  # WORSE (slower), BETTER (faster), NOISE, TOO_FEW or NOT_COMPARABLE
    rule: str | None  # MANN_WHITNEY or RANGES_DISJOINT when one of them saw a change, else None
    p_value: float | None  # two-sided Mann-Whitney U p-value (None without samples)
    n_base: int
    n_new: int
    evidence: str  # one line a person reads: the rule, its numbers and the sample counts


def disjoint_odds(n: int, m: int) -> int:
    """C(n+m, n): with no change, one given side lies entirely above the other once in this many runs."""
    return math.comb(n + m, n)


def can_decide(n: int, m: int, *, alpha: float) -> bool:
    """Whether n and m samples can give any verdict: the most extreme ordering is rare enough."""
    return n >= 1 and m >= 1 and 1 / disjoint_odds(n, m) <= alpha


def mann_whitney_can_fire(n: int, m: int, *, alpha: float) -> bool:
    """Whether the two-sided Mann-Whitney test can reach p < alpha at all (smallest p is 2 / C(n+m, n))."""
    return n >= 1 and m >= 1 and 2 / disjoint_odds(n, m) < alpha


def least_decidable(alpha: float) -> int:
    """The fewest steps per run (equal on both sides) that can give a verdict at this alpha."""
    n = 1
    while not can_decide(n, n, alpha=alpha):
        n += 1
    return n


def mann_whitney_p(base_s: list[float], new_s: list[float]) -> float | None:
    """Two-sided Mann-Whitney U p-value on the raw per-step times (None without samples)."""
    if not base_s or not new_s:
        return None
    from scipy.stats import mannwhitneyu

    p = float(mannwhitneyu(new_s, base_s, alternative="two-sided").pvalue)
    return 1.0 if math.isnan(p) else p  # all samples tied: no evidence of a change


def time_verdict(base_s: list[float], new_s: list[float], *, time_rtol: float, alpha: float) -> TimeVerdict:
    """Judge the new step times against the base ones (see the module docstring for the rules)."""
    n, m = len(base_s), len(new_s)
    p = mann_whitney_p(base_s, new_s)
    counts = f"n={n}/{m}"
    if p is None:
        return TimeVerdict(NOT_COMPARABLE, None, None, n, m, f"no step times on one side ({counts})")
    if not can_decide(n, m, alpha=alpha):
        least = least_decidable(alpha)
        why = f"too few measured steps for a time verdict ({counts}; at least {least} and {least} needed)"
        return TimeVerdict(TOO_FEW, None, p, n, m, why)
    base_med, new_med = statistics.median(base_s), statistics.median(new_s)
    slower = new_med > base_med
    apart = min(new_s) > max(base_s) if slower else max(new_s) < min(base_s)
    if p < alpha:
        rule, evidence = MANN_WHITNEY, f"p={p:.2g}, Mann-Whitney, {counts}"
    elif apart:
        rule = RANGES_DISJOINT
        evidence = f"ranges disjoint, {counts}: 1 in {disjoint_odds(n, m)} by chance with no change"
    else:
        return TimeVerdict(NOISE, None, p, n, m, f"ranges overlap and p={p:.2g}, {counts}")
    moved = abs(new_med / base_med - 1.0) if base_med else math.inf
    if moved < time_rtol:
        band = f"; the median moved {moved * 100:.1f}%, inside the {time_rtol * 100:g}% noise band"
        return TimeVerdict(NOISE, rule, p, n, m, evidence + band)
    return TimeVerdict(WORSE if slower else BETTER, rule, p, n, m, evidence)
