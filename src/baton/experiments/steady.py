"""Sustainable rates on steady windows (issue 52).

A rate "passes" when the SLO attainment of the requests arriving in its steady window
(``metrics.summary.Window``: after a 10% warm-up, up to the last arrival) reaches the
target. A window of a fixed request count arrives in seconds at a high rate and fits in
the cluster at once: it measures a burst. So a point is run on enough requests for its
steady window to span ``max(MIN_STEADY_S, STEADY_E2E_MULTIPLE x mean e2e)`` of arrivals
(the summary's ``steady`` and ``steady_needed_s``): a point that passes on a shorter
window runs once more on enough requests for one. A point that still is not steady
(a trace too short for it) cannot pass: a knee that rests on one is "not measurable",
and a search that never failed is "capped" (a lower bound), both said wherever the rate
is shown.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from baton.metrics.summary import MIN_STEADY_S

WARMUP_SHARE = 0.1  # Window.of's default warm-up: this share of the arrival span
MAX_GROWTH = 20  # a point's second run holds at most this many times its first's requests
# a longer window at the same rate holds more requests at once, so its mean e2e comes out
# higher (reasoning at 1.6 req/s on 4P4D: 171 s on 2,400 requests, 228 s on 7,200): the
# second run is sized for this much more than the first asked
E2E_MARGIN = 1.5
EXHAUSTED = 0.9  # a source that gave less than this share of the requests asked has no more
KNEE, CAPPED, BELOW, UNMEASURABLE = "knee", "capped", "below range", "not measurable"


def requests_for_span(rate_rps: float, span_s: float, warmup_s: float | None = None) -> int:
    """Requests whose arrivals at ``rate_rps`` give a steady window of ``span_s`` seconds
    after the warm-up (``warmup_s``, else ``WARMUP_SHARE`` of the arrival span)."""
    arrivals_s = span_s + warmup_s if warmup_s is not None else span_s / (1.0 - WARMUP_SHARE)
    return math.ceil(rate_rps * arrivals_s) + 1


def steady_point(run: Callable[[int], Mapping[str, float]], rate_rps: float, requests: int,
                 target: float = 0.9, warmup_s: float | None = None) -> Mapping[str, float]:
    """The summary of ``run(n)`` (``n`` requests at ``rate_rps``) on a steady window where
    it passes: first ``requests`` of them; a point that passes (attainment >= ``target``)
    on a window shorter than its ``steady_needed_s`` runs again on enough requests for it
    (at most ``MAX_GROWTH`` times as many). A miss stays a miss on any window (an
    overloaded point's mean e2e grows with its window: it never gets steady), so it runs
    once."""
    summary = run(requests)
    if summary.get("steady") or not summary.get("slo_attainment", 1.0) >= target:
        return summary
    needed = max(MIN_STEADY_S, E2E_MARGIN * summary["steady_needed_s"])
    bigger = min(requests_for_span(rate_rps, needed, warmup_s), MAX_GROWTH * requests)
    if bigger <= requests or summary.get("requests", requests) < EXHAUSTED * requests:  # the source has no more
        return summary
    return run(bigger)


@dataclass(frozen=True, slots=True)
class Sustained:
    """A policy's max sustainable rate (req/s; None when there is none to give) and what
    it is: ``knee`` (interpolated where attainment crosses the target), ``capped`` (no rate
    tried missed: the highest is a lower bound), ``below range`` (the lowest missed) or
    ``not measurable`` (a passing rate at the knee had no steady window)."""

    rate_rps: float | None
    status: str

    def text(self) -> str:
        """As a table shows it: ``12.34``, ``>= 40.00`` (capped), ``< 1.00``, ``n/m``."""
        if self.status == UNMEASURABLE:
            return "not measurable"
        if self.rate_rps is None:
            return "-"
        return {CAPPED: ">= ", BELOW: "< "}.get(self.status, "") + f"{self.rate_rps:.2f}"


def sustained(rates_rps: Sequence[float], points: Sequence[Mapping[str, float]], target: float) -> Sustained:
    """The max sustainable rate of points (summaries in increasing rate order) at ``target``
    attainment; a point without a ``steady`` key (an older summary) counts as steady."""
    if not rates_rps:
        return Sustained(None, BELOW)
    passes = [p.get("slo_attainment", math.nan) >= target for p in points]
    steady = [bool(p.get("steady", 1.0)) for p in points]
    if not passes[0]:
        return Sustained(rates_rps[0], BELOW)
    for i in range(1, len(points)):
        if not passes[i]:
            if not steady[i - 1]:
                return Sustained(None, UNMEASURABLE)
            a0, a1 = points[i - 1]["slo_attainment"], points[i]["slo_attainment"]
            r0, r1 = rates_rps[i - 1], rates_rps[i]
            return Sustained(float(r0 + (a0 - target) / (a0 - a1) * (r1 - r0)), KNEE)
    return Sustained(float(rates_rps[-1]), CAPPED) if steady[-1] else Sustained(None, UNMEASURABLE)
