"""The real-engine fidelity benchmark's pure parts: the paired ranking and its interval,
the sessions rate for a load, and the JSON keys issue 53 names."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from fidelity_fleet import arrival_rate, paired_difference, ranking, session_rate_for  # noqa: E402
from fidelity_real import real_keys, sessions_trace  # noqa: E402


def _runs(e2e: list[float]) -> dict[int, tuple[float, float, float]]:
    return {i: (0.1, 0.01, x) for i, x in enumerate(e2e)}


def test_the_paired_difference_is_over_shared_requests_with_an_interval_around_it():
    a, b = _runs([2.0, 3.0, 4.0, 5.0]), _runs([1.0, 1.0, 1.0, 1.0, 9.0])  # b's request 4: a did not finish it
    d = paired_difference(a, b)
    assert d["requests"] == 4 and d["mean_s"] == pytest.approx(2.5)
    assert d["lo_s"] <= 2.5 <= d["hi_s"] and d["lo_s"] >= 1.0 and d["hi_s"] <= 4.0
    assert math.isnan(paired_difference({}, b)["mean_s"])


@pytest.mark.parametrize("real_ll, sim_ll, agrees, decided", [
    ([1.0, 1.1, 0.9, 1.0], [1.0, 1.0, 1.0, 1.0], True, True),     # least-loaded faster in both
    ([1.0, 1.1, 0.9, 1.0], [3.0, 3.0, 3.0, 3.0], False, True),    # the simulator orders them the other way
    ([1.0, 3.5, 1.0, 3.0], [2.5, 2.5, 2.5, 2.5], True, False),    # the real runs do not decide it
])
def test_the_ranking_compares_the_signs_and_says_whether_the_real_runs_decide(real_ll, sim_ll, agrees, decided):
    rr = [2.0, 2.0, 2.0, 2.0]
    real = {"colocated": _runs(real_ll), "colocated-rr": _runs(rr)}
    sim = {"colocated": _runs(sim_ll), "colocated-rr": _runs(rr)}
    r = ranking(real, sim)
    assert (r["agrees"], r["real_decided"]) == (agrees, decided)


@pytest.mark.parametrize("target", [0.19, 0.5])
def test_sessions_arrive_so_that_their_turns_bring_the_rate(target):
    """The sessions trace at the found start rate brings the target request rate (dividing
    by the mean turns brought 0.25 req/s for 0.19)."""
    rate = session_rate_for(target, lambda r: sessions_trace(20, r))
    assert arrival_rate(sessions_trace(20, rate)) == pytest.approx(target, rel=0.1)


def test_the_json_keys_are_issue_53s_and_null_where_a_case_did_not_run():
    def case(e2e):
        return {"ttft_mape": 0.1, "tpot_mape": 0.05, "e2e_mape": e2e}
    real = {"profile_busy": False, "loaded": {
        "sustainable_rps": 0.35, "cases": {"70": case(0.04), "85": case(0.06)},
        "prefix": {"ttft_mape": 0.12, "hits_error": 0.02},
        "fleet": {"colocated": case(0.08), "colocated-rr": case(0.11), "pd": case(0.2),
                  "ranking": {"agrees": True}}}}
    keys = real_keys(real)
    assert (keys["real70_e2e_mape"], keys["real85_e2e_mape"], keys["two_instance_e2e_mape"], keys["pd_e2e_mape"],
            keys["ranking_agrees"], keys["prefix70_ttft_mape"], keys["prefix70_hits_error"]) == \
        (0.04, 0.06, 0.11, 0.2, True, 0.12, 0.02)
    empty = real_keys(None)
    assert empty["two_instance_e2e_mape"] is None and empty["ranking_agrees"] is None and "real70_e2e_mape" not in empty
