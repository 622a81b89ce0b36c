"""Verdicts on a paper's claim, one per row of the table in experiments/verdicts.py, on
log ratios (an interval never below -100%)."""

import math

import pytest

from baton.experiments.verdicts import DIRECTION_ONLY, INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED, judge, log_ratios


def ratios(*changes):
    return [math.log1p(c) for c in changes]


@pytest.mark.parametrize("measured,claim,verdict", [
    ((-0.40, -0.35, -0.30, -0.38), -0.34, REPRODUCED),       # excludes 0, contains the claim
    ((-0.10, -0.12, -0.08, -0.11), -0.34, DIRECTION_ONLY),   # excludes 0, same sign, misses
    ((0.20, 0.25, 0.18, 0.22), -0.34, NOT_REPRODUCED),       # excludes 0, opposite sign
    ((0.01, -0.02, 0.015, -0.01), -0.34, NOT_REPRODUCED),    # includes 0, misses the claim
    ((-0.5, 0.3, -0.6, 0.2), -0.34, INCONCLUSIVE),           # includes 0 and the claim
])
def test_each_row_of_the_verdict_table(measured, claim, verdict):
    v = judge(ratios(*measured), claim)
    assert v.verdict == verdict
    assert v.ci95[0] > -1.0  # a relative change is never below -100%


def test_an_inconclusive_claim_says_how_many_repeats_would_decide_it():
    v = judge(ratios(-0.3, 0.1, -0.4, 0.05), -0.2)
    assert v.verdict == INCONCLUSIVE and v.repeats_to_decide > 4
    even = judge([math.log(0.8), -math.log(0.8)], 0.1)  # a mean ratio of exactly 1: no number of repeats decides
    assert even.verdict == INCONCLUSIVE and even.repeats_to_decide is None


def test_a_huge_spread_stays_above_minus_100_percent_and_the_change_is_the_geometric_mean():
    v = judge(ratios(-0.9, 4.0, -0.8, 2.0), -0.67)
    assert v.ci95[0] > -1.0 and v.verdict == INCONCLUSIVE
    assert v.change == pytest.approx(math.exp(sum(ratios(-0.9, 4.0, -0.8, 2.0)) / 4) - 1)


def test_a_claim_of_no_change_is_not_reproduced_by_a_clear_change():
    assert judge(ratios(-0.2, -0.25, -0.22), 0.0).verdict == NOT_REPRODUCED
    assert judge(ratios(-0.1, 0.1, 0.05), 0.0).verdict == INCONCLUSIVE


def test_log_ratios_skip_repeats_without_a_positive_value():
    assert log_ratios([2.0, 0.0, float("nan"), 3.0], [1.0, 1.0, 1.0, 0.0]) == [math.log(2.0)]


def _outcome(ratios, claim=0.2, max_repeats=10):
    from baton.experiments.config import Experiment
    from baton.experiments.reproduce import Claim, Outcome
    c = Claim("x", "fig", "", Experiment(), "a", "b", "mean_ttft_s", claim, max_repeats=max_repeats)
    return Outcome(c, 1.0, 1.0, 0, list(ratios))


def test_an_inconclusive_first_look_grows_once_to_the_repeats_that_would_decide_at_most_the_cap():
    from baton.experiments.reproduce import _second_look
    wide = _outcome([0.3, -0.1, 0.25])  # includes 0 and the claim: inconclusive
    needed = wide.judged.repeats_to_decide
    assert wide.judged.verdict == INCONCLUSIVE and needed > 3
    assert _second_look(wide, 3, 100, wide.claim.experiment) == needed
    assert _second_look(wide, 3, 5, wide.claim.experiment) == 5  # capped
    decided = _outcome([0.20, 0.21, 0.19])
    assert decided.judged.verdict == REPRODUCED and _second_look(decided, 3, 10, decided.claim.experiment) == 3


def test_a_capped_rate_is_counted_and_said_in_the_verdict():
    """A policy that passed every rate tried has a lower bound, not a knee: the figure
    counts the repeats where that happened and the table's verdict says so."""
    from dataclasses import replace

    from baton.cli.commands import _verdict_text
    from baton.experiments.config import Experiment
    from baton.experiments.repeats import repeat_workloads
    from baton.experiments.reproduce import SUSTAINABLE, Claim, _compare
    exp = Experiment()
    claim = Claim("x", "fig", "", exp, "a", "b", SUSTAINABLE, 0.2, rates=(1.0, 2.0))
    cache = {}
    for i, (seed, _) in enumerate(repeat_workloads(exp, 3)):
        for name, rate, capped in (("a", 2.0 + 0.1 * i, float(i == 0)), ("b", 1.0, 0.0)):
            cache[(repr(replace(exp, policy=name, seed=seed)), i)] = {SUSTAINABLE: rate, "capped": capped}
    outcome = _compare(claim, exp, 3, None, cache)
    assert outcome.capped == 1 and outcome.json()["capped_repeats"] == 1
    assert "1 capped" in _verdict_text(outcome)
    cache = {k: {**v, "capped": 0.0} for k, v in cache.items()}
    assert "capped" not in _verdict_text(_compare(claim, exp, 3, None, cache))
