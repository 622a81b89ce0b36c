"""Verdicts on a paper's claim: a relative change, measured as a ratio on the log scale.

Each repeat gives the ratio policy / baseline of the claim's metric; the interval is a
Student-t 95% interval of the mean log ratio, turned back into a relative change
(``exp(x) - 1``), so it can never fall below -100%. The verdict, with p the paper's change
and I Baton's interval:

| I excludes 0? | I contains p? | sign of I vs p | verdict |
|---|---|---|---|
| yes | yes | same | reproduced |
| yes | no | same | direction only |
| yes | - | opposite | not reproduced |
| no | no | - | not reproduced |
| no | yes | - | inconclusive |

An inconclusive claim also says how many repeats would decide it: the interval's half
width shrinks as 1/sqrt(n), so about n x (half width / |mean|)^2 repeats would exclude 0
if the mean stayed where it is (none when the mean is 0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

REPRODUCED, DIRECTION_ONLY, NOT_REPRODUCED, INCONCLUSIVE = "reproduced", "direction only", "not reproduced", \
    "inconclusive"


@dataclass(frozen=True, slots=True)
class Verdict:
    """Baton's measured change (mean over repeats on the log scale), its 95% interval, the
    verdict, and for an inconclusive one the repeats that would decide it (None: none would)."""

    change: float
    ci95: tuple[float, float]
    verdict: str
    repeats_to_decide: int | None = None


def log_ratios(policy: list[float], baseline: list[float]) -> list[float]:
    """ln(policy / baseline) per repeat where both are positive and finite."""
    return [math.log(p / b) for p, b in zip(policy, baseline)
            if b > 0 and p > 0 and math.isfinite(p) and math.isfinite(b)]


def _t_half(x: np.ndarray) -> float:
    from scipy import stats  # scipy.stats costs 0.6 s at import; only reproduce needs it

    return float(stats.t.ppf(0.975, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size))


def judge(ratios: list[float], claim: float) -> Verdict:
    """The verdict on ``claim`` (a relative change) from per-repeat log ratios."""
    x = np.array(ratios, dtype=float)
    if x.size == 0:
        return Verdict(math.nan, (math.nan, math.nan), NOT_REPRODUCED)
    mean = float(x.mean())
    change = math.expm1(mean)
    if x.size < 2:
        return Verdict(change, (math.nan, math.nan), INCONCLUSIVE, None)
    half = _t_half(x)
    lo, hi = math.expm1(mean - half), math.expm1(mean + half)
    excludes_zero = lo > 0 or hi < 0
    contains = lo <= claim <= hi
    if excludes_zero:
        same_sign = claim != 0 and (lo > 0) == (claim > 0)  # a claim of no change has no sign to share
        verdict = NOT_REPRODUCED if not same_sign else REPRODUCED if contains else DIRECTION_ONLY
        return Verdict(change, (lo, hi), verdict)
    if not contains:
        return Verdict(change, (lo, hi), NOT_REPRODUCED)
    needed = None if mean == 0 else max(x.size + 1, math.ceil(x.size * (half / abs(mean)) ** 2))
    return Verdict(change, (lo, hi), INCONCLUSIVE, needed)
