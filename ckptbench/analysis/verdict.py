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
from dataclasses import dataclass, replace
from types import EllipsisType

MANN_WHITNEY = "mann-whitney"
RANGES_DISJOINT = "ranges disjoint"

# Marks this module decides (analysis/marks.py adds the memory marks; both are imported from where they are defined).
WORSE, BETTER, NOISE = "worse", "better", "within noise"
TOO_FEW, NOT_COMPARABLE = "too few samples", "not comparable"
# A change the step times show but that is not declared: the point was flagged busy or spread (family_verdicts).
NOISY = "noisy steps"


@dataclass(frozen=True)
class TimeVerdict:
    """What the step-time samples of two runs say about one point."""

    mark: str  # WORSE (slower), BETTER (faster), NOISE, TOO_FEW, NOISY or NOT_COMPARABLE
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


def time_verdict(
    base_s: list[float], new_s: list[float], *, time_rtol: float, alpha: float,
    p_value: float | EllipsisType | None = ...,
) -> TimeVerdict:
    """Judge the new step times against the base ones (see the module docstring for the rules);
    ``p_value``: their ``mann_whitney_p`` when already computed (analysis/mann_whitney.py, many points at
    once), computed here when left out."""
    n, m = len(base_s), len(new_s)
    p = mann_whitney_p(base_s, new_s) if isinstance(p_value, EllipsisType) else p_value
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


# -- many points at once: the false-alarm rate of a whole comparison ------------------------------------
#
# Each point's verdict alone would flag 1 in 20 unchanged points with 3 and 3 steps, so a comparison of
# twelve points would raise a false alarm more often than not. A change a point's own verdict saw stands
# only with evidence that survives the whole family of points:
#
# - **Clean evidence** (a GPU run, no warning on the point): the Benjamini-Hochberg adjusted p-value
#   (scipy.stats.false_discovery_control over the points' Mann-Whitney p-values) stays below alpha (when
#   nothing changed at all, the same code measured twice, this bounds the chance of any false alarm by
#   alpha), or the two ranges lie apart by at least the noise band (``time_rtol``): the new run's fastest
#   step slower than the base's slowest (or mirrored, faster).
# - **A CPU run**: p-values never count (a busy host slows a point's steps together: they are not
#   independent samples); the ranges must lie at least ``CPU_MIN_EFFECT`` apart. Ten back-to-back tiny
#   CPU sweeps on a shared 2-core host put one point's ranges up to 98% apart by chance
#   (tests/test_false_alarms.py, tests/fixtures/ten_cpu/).
# - **A point flagged busy or spread** (on either side): no time change is declared at all, however
#   large: in those ten sweeps a busy host slowed whole points 4x. Its mark is 'noisy steps', and a time
#   gate that would have failed on it cannot judge it (analysis/compare.py: exit 2, never a silent pass).
CPU_MIN_EFFECT = 1.5  # on a CPU: the new fastest step at least 2.5x the base's slowest (or mirrored)
FAMILY_RULE = "Benjamini-Hochberg"


@dataclass(frozen=True)
class TimeEvidence:
    """One point's step-time samples and verdict, and what makes its evidence noisy."""

    verdict: TimeVerdict
    base_s: list[float]
    new_s: list[float]
    cpu: bool = False  # measured on a CPU (either run)
    flagged: str | None = None  # 'busy (new)', 'spread (base and new)': warnings of the point


def range_gap(base_s: list[float], new_s: list[float], *, slower: bool) -> float:
    """How far apart the two ranges lie, relative: min(new)/max(base) - 1 when slower, mirrored when faster
    (negative: they overlap)."""
    low, high = (base_s, new_s) if slower else (new_s, base_s)
    if not low or not high:
        return -math.inf
    return min(high) / max(low) - 1.0 if max(low) > 0 else math.inf


def adjusted_p_values(p_values: list[float | None]) -> list[float | None]:
    """Benjamini-Hochberg adjusted p-values over the points that have one (scipy)."""
    known = [p for p in p_values if p is not None]
    if not known:
        return list(p_values)
    from scipy.stats import false_discovery_control

    adjusted = iter(float(q) for q in false_discovery_control(known, method="bh"))
    return [None if p is None else next(adjusted) for p in p_values]


def family_verdicts(points: list[TimeEvidence], *, time_rtol: float, alpha: float) -> list[TimeVerdict]:
    """Each point's verdict, kept only when its change survives the family of points (rules above);
    one that does not becomes 'within noise' ('noisy steps' when a busy/spread flag kept it from being
    declared) with the reason appended to its evidence."""
    adjusted = adjusted_p_values([e.verdict.p_value for e in points])
    out = []
    for e, q in zip(points, adjusted, strict=True):
        v = e.verdict
        if v.mark not in (WORSE, BETTER):
            out.append(v)
            continue
        gap = range_gap(e.base_s, e.new_s, slower=v.mark == WORSE)
        apart = f"ranges {gap * 100:.0f}% apart" if gap >= 0 else "ranges overlap"
        if e.flagged:
            why = f"; not declared: measured while {e.flagged} ({apart}); rerun on a quiet host"
            out.append(replace(v, mark=NOISY, evidence=v.evidence + why))
            continue
        min_effect = CPU_MIN_EFFECT if e.cpu else time_rtol
        need = f"at least {min_effect * 100:g}% needed" + (" on a CPU" if e.cpu else "")
        if gap >= min_effect:
            out.append(replace(v, evidence=f"{v.evidence}; {apart} ({need})"))
        elif not e.cpu and q is not None and q < alpha:
            out.append(replace(v, evidence=f"{v.evidence}; {FAMILY_RULE} p={q:.2g} over {len(points)} points"))
        elif e.cpu:
            out.append(replace(v, mark=NOISE, evidence=f"{v.evidence}; not declared: {apart}, {need}"))
        else:
            adj = f"{FAMILY_RULE} p={q:.2g} over {len(points)} points" if q is not None else "no p-value"
            why = f"; not significant over the whole comparison ({adj}; {apart}, {need})"
            out.append(replace(v, mark=NOISE, evidence=v.evidence + why))
    return out
