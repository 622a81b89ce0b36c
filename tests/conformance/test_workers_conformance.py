"""``baton serve --workers 2`` as a fourth runtime: every catalog policy runs its
conformance trace through two relay workers and a control that talk over real ZMQ
``ipc://`` sockets (the supervisor's processes, run in this process so that their logs
are read), under every rule of the one-process gateway (``test_conformance.py``): exact
answers, no error logged, ticks alive, nothing left behind, placements equal to the
simulator's or spread like them, the policy's own actions and no others, prefix-cache
hits. Process deaths are tested in ``tests/gateway/test_workers.py``."""

from __future__ import annotations

import pytest

from tests.conformance import test_conformance as rules
from tests.conformance.cases import CASES
from tests.conformance.runner import CONCURRENCY, Outcome, run_all

pytest.importorskip("zmq")
pytest.importorskip("msgpack")

NAMES = [c.name for c in CASES]
WORKERS_CONCURRENCY = max(1, CONCURRENCY - 2)
WITH_PREFIXES = [c.name for c in CASES if c.kv_events]


@pytest.fixture(scope="module")
def worker_runs(request) -> tuple[dict[str, Outcome], list[str]]:
    wanted = rules.wanted_cases(request, request.module)
    # fewer cases at a time than the gateway's: every case's engines, relays and control share
    # this process's one event loop, and here a KV event and the plan of the next request of
    # its prefix each take one more hop (engine -> control, relay -> control -> relay) than in
    # the one-process gateway; a sibling planned before control has read its prefix's event
    # goes by load alone. With six at a time kv-cost's hits fell from 7 prefixes to 5 in a
    # full-suite run, and every time with a thread in this process holding the interpreter
    # two thirds of the time (twelve had drifted under the full suite's load before).
    return run_all([c for c in CASES if c.name in wanted or None in wanted], "workers", WORKERS_CONCURRENCY)


@pytest.fixture
def run(worker_runs, request) -> Outcome:
    return rules.outcome(worker_runs, request)


_rule = rules.rule_for


test_every_request_is_answered_exactly = _rule(rules.test_every_request_is_answered_exactly, NAMES)
test_the_gateway_logs_no_error = _rule(rules.test_the_gateway_logs_no_error, NAMES)
test_policy_ticks_still_run_after_the_trace = _rule(rules.test_policy_ticks_still_run_after_the_trace, NAMES)
test_nothing_is_left_behind = _rule(rules.test_nothing_is_left_behind, NAMES)
test_placements_agree_with_the_simulator = _rule(rules.test_placements_agree_with_the_simulator, NAMES)
test_flow_control_dispatches_in_the_simulators_order = _rule(
    rules.test_flow_control_dispatches_in_the_simulators_order, [n for n in NAMES if n in rules.FLOW_NAMES])
test_the_policy_acts_on_its_trace_and_does_nothing_else = _rule(
    rules.test_the_policy_acts_on_its_trace_and_does_nothing_else, NAMES)
test_prefix_cache_hits_agree_with_the_simulator = _rule(rules.test_prefix_cache_hits_agree_with_the_simulator,
                                                        WITH_PREFIXES)


def test_every_case_shuts_down_cleanly(worker_runs) -> None:
    assert not worker_runs[1], f"tasks left on the loop: {worker_runs[1][:5]}"
