"""The real-engine fidelity benchmark's pure parts: the paired ranking and its interval,
the sessions rate for a load, the 1P1D handoff's calibration (its fit and the link that
prices it, checked through a real simulation), and the JSON keys issue 53 names."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from fidelity_fleet import arrival_rate, paired_difference, ranking, session_rate_for  # noqa: E402
from fidelity_handoff import fit_handoff, handoff_trace, link_for  # noqa: E402
from fidelity_real import print_real, real_keys, sessions_trace  # noqa: E402


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
                  "pd_default_link": case(0.3), "ranking": {"agrees": True}}}}
    keys = real_keys(real)
    assert (keys["real70_e2e_mape"], keys["real85_e2e_mape"], keys["two_instance_e2e_mape"], keys["pd_e2e_mape"],
            keys["ranking_agrees"], keys["prefix70_ttft_mape"], keys["prefix70_hits_error"]) == \
        (0.04, 0.06, 0.11, 0.2, True, 0.12, 0.02)
    assert keys["pd_default_link_e2e_mape"] == 0.3
    empty = real_keys(None)
    assert empty["pd_default_link_e2e_mape"] is None and empty["two_instance_e2e_mape"] is None
    assert empty["ranking_agrees"] is None and "real70_e2e_mape" not in empty


FITS = [  # (fixed s, s a prompt token) the real pair adds, and what the fit keeps
    ("a fixed cost and a rate", 0.4, 0.0004, 0.4, 0.0004),
    ("no fixed cost", 0.0, 0.001, 0.0, 0.001),
    ("a faster real pair: nothing to add, never a negative term", -0.05, -0.0001, 0.0, 0.0),
    ("a negative rate: the fixed cost alone", 0.3, -0.00005, None, 0.0),
]


@pytest.mark.parametrize("name,fixed,rate,want_fixed,want_rate", FITS, ids=[f[0] for f in FITS])
def test_the_handoff_fit_is_what_the_real_pair_adds_and_never_negative(name, fixed, rate, want_fixed, want_rate):
    requests = handoff_trace()
    sim = {r.req_id: (0.1 + 1e-4 * r.prompt_tokens, 0.01, 1.0) for r in requests}
    real = {r.req_id: (sim[r.req_id][0] + fixed + rate * r.prompt_tokens, 0.01, 1.0) for r in requests[1:]}
    fit = fit_handoff(requests, real, sim)
    assert fit["points"] == len(requests) - 1  # the unanswered one is left out
    assert fit["per_token_s"] == pytest.approx(want_rate, abs=1e-12)
    if want_fixed is not None:
        assert fit["fixed_s"] == pytest.approx(want_fixed, abs=1e-9)
    assert fit["fixed_s"] >= 0 and fit["per_token_s"] >= 0
    with pytest.raises(ValueError, match="two answered"):
        fit_handoff(requests, {}, sim)


def test_a_calibrated_link_adds_the_fitted_handoff_to_a_simulated_requests_ttft():
    """Through the simulator itself: one request alone on 1P1D, over the default link and
    over the link fitted for 0.4 s + 0.5 ms a prompt token, differ by exactly that."""
    from baton.core.request import Request
    from baton.perf.presets import build
    from baton.sim import ClusterSpec, simulate
    preset = "llama-3.1-8b@a100-80g"
    kvb = build(preset).kv_bytes_per_token
    link = link_for(0.4, 0.0005, kvb)
    assert link["nic_latency_s"] == pytest.approx(ClusterSpec().nic_latency_s + 0.4)
    for tokens in (100, 1500):
        ttft = [simulate([Request(0, 0.0, tokens, 4)], ClusterSpec(prefill=1, decode=1, preset=preset, **extra),
                         "least-loaded").records[0].ttft_s for extra in ({}, link)]
        assert ttft[1] - ttft[0] == pytest.approx(0.4 + 0.0005 * tokens, rel=1e-6)
    assert [r.prompt_tokens for r in handoff_trace()] == [64, 256, 512, 1024, 1536] * 2
    assert all(r.output_tokens > 1 for r in handoff_trace())  # a one-token answer has no handoff


def test_the_real_rows_print_every_fleet_case_and_the_handoff(capsys):
    def case():
        return {"ttft_mape": 0.1, "tpot_mape": 0.05, "e2e_mape": 0.2, "failed": 0,
                **{f"{k}_p{q}_ratio": 1.0 for k in ("ttft", "tpot", "e2e") for q in (50, 90, 99)}}
    fleet = {"rate_rps": 0.38, "pd": case(), "pd_default_link": case(),
             "handoff": {"fixed_s": 0.164, "per_token_s": 0.000573, "nic_gbps": 0.32, "nic_latency_s": 0.164}}
    print_real({"loaded": {"fleet": fleet}})
    out = capsys.readouterr().out
    assert "real, 1P1D" in out and "1P1D, NIC link" in out and "164 ms + 0.573 ms" in out


def test_the_pd_case_calibrates_its_link_and_reports_both_links(monkeypatch, capsys):
    """run_fleet's 1P1D path with the engines replaced by canned answers: the calibration's
    handoff is fitted, the loaded trace is simulated over its link and over the default
    one, and the rows print."""
    import types

    import fidelity_fleet
    from baton.core.request import Request

    def answers(reqs, extra_s):  # replay records: 0.5 s + what the pair adds, before the tokens
        return [types.SimpleNamespace(req_id=r.req_id, status=200, ttft_s=0.5 + extra_s(r), e2e_s=2.0 + extra_s(r))
                for r in reqs]
    monkeypatch.setattr(fidelity_fleet, "fleet_case", lambda work, roles, policy, reqs, tools, say, before: (
        answers(before, lambda r: 0.2 + 0.0005 * r.prompt_tokens), answers(reqs, lambda r: 0.3), 1.0,
        fidelity_fleet.cpu_waits(["e0", "e1", "gateway"], [(1.0, 0.5)] * 3, [(3.0, 1.0), (2.0, 0.5), (1.5, 0.5)])))
    calls = []

    def simulate(reqs, roles, policy, link):
        calls.append((len(reqs), roles, link))
        return {r.req_id: (0.5 + (0.2 + 0.0005 * r.prompt_tokens if link else 0.0), 0.01, 2.0) for r in reqs}

    def compare(real, sim):
        return {"ttft_mape": 0.0, "tpot_mape": 0.0, "e2e_mape": 0.0,
                **{f"{k}_p{q}_ratio": 1.0 for k in ("ttft", "tpot", "e2e") for q in (50, 90, 99)}}
    from fidelity_real import _paired
    tools = types.SimpleNamespace(kv_bytes_per_token=23_040, simulate=simulate, compare=compare, paired=_paired,
                                  write_pairs=lambda *a: None)
    monkeypatch.setattr("fidelity_loaded.poisson_trace", lambda rate, span, seed, least: [
        Request(i, float(i), 300, 20) for i in range(5)])
    out = fidelity_fleet.run_fleet(Path("/nonexistent"), 0.27, tools, lambda m: None, kinds=("pd",))
    assert out["handoff"]["fixed_s"] == pytest.approx(0.2) and out["handoff"]["per_token_s"] == pytest.approx(0.0005)
    assert {"pd", "pd_default_link"} <= set(out) and "ranking" not in out
    waits = out["pd"]["cpu_waits"]
    assert waits["e0"] == {"cpu_s": 2.0, "wait_s": 0.5, "wait_share": 0.2} and waits["e1"]["wait_share"] == 0.0
    assert [c[2] is None for c in calls] == [True, False, True, False]  # calibration x2, then the trace x2
    print_real({"loaded": {"fleet": out}})
    assert "1P1D, NIC link" in capsys.readouterr().out
