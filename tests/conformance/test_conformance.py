"""Live conformance: every policy of the catalog (and every composed stage list of
examples/*.yaml) runs a short fixed trace through the live gateway in front of in-process
engine emulators, and the same trace through the simulator. Per policy, as rules:

- every request gets its exact answer: no error status, the whole token sequence in order,
  exact usage (streamed and not, /v1/completions and /v1/chat/completions mixed);
- the gateway logs no ERROR and no traceback;
- the policy's periodic ticks still run after the trace (``baton_policy_ticks_total{stage}``
  advances between two reads 1.5 tick intervals apart) and none failed
  (``baton_policy_tick_errors_total``);
- nothing is left behind: no request in flight, no booking (``/admin/instances``
  ``in_flight``), no held prefill, nothing running or waiting on any engine;
- deterministic policies (``EXACT`` in ``cases.py``) place every request where the
  simulator does; the others spread their placements like the simulator: the total
  variation distance between the two runs' shares of placements per (phase, instance),
  least over renamings of interchangeable instances (same starting role), is at most
  ``TVD_TOLERANCE``;
- the actions a policy exists for happen, live and simulated; no other action happens.

Tolerance: 0.2 is two or three requests of twelve placed elsewhere (a request whose
prefill and decode both move shifts 1/12 = 0.083, one whose decode alone moves 0.042).
Each such trace keeps the simulator's own spread within 0.1 of itself when arrivals,
engine speed and scrape timing are perturbed (``test_cases.py``); the other 0.1 is for
what the simulator does not model of a live run on a loaded machine (event-loop lag,
HTTP). A larger distance is a difference in what the policy saw or did.
"""

from __future__ import annotations

import pytest

from tests.conformance.cases import CASES, EXACT, TVD_TOLERANCE
from tests.conformance.compare import (ACTIONS, interchangeable, live_actions, live_placements, sim_actions,
                                       sim_placements, tvd)
from tests.conformance.harness import by_label, total
from tests.conformance.runner import TICKS, Outcome, run_all

TICK_ERRORS = "baton_policy_tick_errors_total"
HITS_TOLERANCE = 0.2  # a sibling placed away from its prefix loses its 40 blocks: about 1/8 of the hits
STALE = "baton_stale_decisions_total"
NAMES = [c.name for c in CASES]
FLOW_NAMES = [c.name for c in CASES if c.flow]


def wanted_cases(request, module=None) -> set:
    """The case names the selected tests (of ``module``, if given) need; None among them
    when a selected test needs every case."""
    return {getattr(item, "callspec", None) and item.callspec.params.get("name") for item in request.session.items
            if module is None or item.module is module}


def rule_for(rule, names: list[str]):
    """The gateway's rule ``rule`` for another runtime's runs of ``names`` (its module's
    ``run`` fixture)."""
    @pytest.mark.parametrize("name", names)
    def check(run: Outcome, name: str) -> None:
        rule(run, name)
    check.__doc__ = rule.__doc__
    return check


def outcome(runs: tuple[dict[str, Outcome], list[str]], request) -> Outcome:
    """The run of the requesting test's case; the test fails if its live run did not finish."""
    out = runs[0][request.node.callspec.params["name"]]
    if out.error:
        pytest.fail(f"the live run did not finish: {out.error}")
    return out


@pytest.fixture(scope="session")
def runs(request) -> tuple[dict[str, Outcome], list[str]]:
    """The live and simulated runs of every case a selected test needs (all of them
    unless ``-k`` narrows the selection)."""
    wanted = wanted_cases(request)
    return run_all([c for c in CASES if c.name in wanted or None in wanted])


@pytest.fixture
def run(runs, request) -> Outcome:
    return outcome(runs, request)


def shed_in_sim(run: Outcome) -> set[int]:
    """The requests flow control shed in the simulator (live, they must get 429 ``shed``)."""
    return {r.req_id for r in run.sim.records if r.reject_reason == "shed"}


@pytest.mark.parametrize("name", NAMES)
def test_every_request_is_answered_exactly(run: Outcome, name: str) -> None:
    """Exact answers; under flow control, a 429 (code ``shed``) for exactly the requests
    the simulator shed."""
    trace, shed = run.case.requests(), shed_in_sim(run)
    assert len(run.live.answers) == len(trace)
    problems = [p for answer, r in zip(run.live.answers, trace) if r.req_id not in shed for p in answer.problems(r)]
    problems += [f"request {a.req_id}: shed in the simulator, live status {a.status} {a.error[:200]}"
                 for a in run.live.answers if a.req_id in shed and (a.status != 429 or '"shed"' not in a.error)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("name", NAMES)
def test_the_gateway_logs_no_error(run: Outcome, name: str) -> None:
    bad = [line for line in run.logs if line.gateway and (line.level >= 40 or line.traceback)]
    assert not bad, "\n".join(map(str, bad[:3])) + f"\n({len(bad)} in all)"


@pytest.mark.parametrize("name", NAMES)
def test_policy_ticks_still_run_after_the_trace(run: Outcome, name: str) -> None:
    intervals = run.live.policy.get("ticks_s") or []
    before, after = run.live.ticks_before, run.live.ticks_after
    if intervals:
        assert after, f"{TICKS}{{stage}} is not exported: cannot see the policy's {len(intervals)} ticking stage(s)"
    assert len(after) == len(intervals), f"tick series {sorted(after)} for tick intervals {intervals}"
    stalled = {stage: (before.get(stage, 0.0), n) for stage, n in after.items() if n <= before.get(stage, 0.0)}
    assert not stalled, f"ticks did not advance after the trace (before, after) by stage: {stalled}"
    errors = by_label(run.live.metrics, TICK_ERRORS, "stage")
    assert not any(errors.values()), f"failed ticks by stage: {errors}"


@pytest.mark.parametrize("name", NAMES)
def test_nothing_is_left_behind(run: Outcome, name: str) -> None:
    left = {k: v for k, v in run.live.residue.items() if v}
    assert run.live.residue and not left, f"after the settle: {left or 'nothing read'}"


@pytest.mark.parametrize("name", NAMES)
def test_placements_agree_with_the_simulator(run: Outcome, name: str) -> None:
    live, sim = live_placements(run.live.decisions), sim_placements(run.sim)
    placed = [i for i in range(len(run.case.trace)) if i not in shed_in_sim(run)]
    assert sorted(live) == placed, f"placed requests {sorted(live)}"
    if run.case.compare == EXACT:
        differ = {rid: (live[rid], sim.get(rid)) for rid in live if live[rid] != sim.get(rid)}
        assert not differ, f"(prefill, decode) live vs simulated: {differ}"
    else:
        distance = tvd(live, sim, interchangeable(run.case.cluster))
        assert distance <= TVD_TOLERANCE, f"TVD {distance:.3f}: live {live}, simulated {sim}"


@pytest.mark.parametrize("name", FLOW_NAMES)
def test_flow_control_dispatches_in_the_simulators_order(run: Outcome, name: str) -> None:
    """Requests reach the policy in the order flow control released them in the simulator
    (bands, fairness across tenants, ordering), and the same ones are shed."""
    live = [rid for kind, rid, _ in run.live.decisions if kind == "prefill"]
    assert live == run.sim.placement_order, f"placed live {live}, simulated {run.sim.placement_order}"
    shed = total(run.live.metrics, "baton_class_shed_total")
    assert shed == len(shed_in_sim(run)), f"shed live {shed}, simulated {sorted(shed_in_sim(run))}"


@pytest.mark.parametrize("name", NAMES)
def test_the_policy_acts_on_its_trace_and_does_nothing_else(run: Outcome, name: str) -> None:
    live, sim = live_actions(run.live.metrics), sim_actions(run.sim)
    context = f"live {live}, simulated {sim}; stale decisions live {by_label(run.live.metrics, STALE, 'kind')}"
    for action in ACTIONS:
        if action in run.case.acts:
            assert live[action] > 0 and sim[action] > 0, f"{action} expected: {context}"
        else:
            assert live[action] == 0 == sim[action], f"{action} not expected: {context}"


@pytest.mark.parametrize("name", [c.name for c in CASES if c.kv_events])
def test_prefix_cache_hits_agree_with_the_simulator(run: Outcome, name: str) -> None:
    """The engines' own hit counters against the simulated engines' (tokens): equal where
    placements must be, within HITS_TOLERANCE where they may spread differently."""
    sim = sum(s.hits for s in run.sim.prefix_cache.values())
    live = run.live.engine_hits_tokens
    assert sim > 0, "the trace shares prefixes: the simulated engines must hit"
    if run.case.compare == EXACT:
        assert live == sim, f"hits live {live:.0f} vs simulated {sim}"
    else:
        assert abs(live - sim) <= HITS_TOLERANCE * sim, f"hits live {live:.0f} vs simulated {sim}"


def test_every_case_shuts_down_cleanly(runs) -> None:
    assert not runs[1], f"tasks left on the loop: {runs[1][:5]}"

