"""Property-based invariants on random small workloads."""

import numpy as np
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from baton.core.request import Phase, Request
from baton.sim import ClusterSpec, EngineConfig
from tests.sim.helpers import KVGuard, assert_all_ended, assert_drained, tiny_perf

requests_strategy = st.lists(
    st.tuples(st.floats(0, 5), st.integers(1, 900), st.integers(1, 600)), min_size=1, max_size=25)
policies = st.sampled_from(["round-robin", "least-loaded", "least-kv", "least-requests",
                            "power-of-two", "colocated", "static-xpyd", "arrow", "kairos",
                            "deflect-short", "deflect-queue"])


def build(rows):
    rows = sorted(rows)
    return [Request(i, t, p, o) for i, (t, p, o) in enumerate(rows)]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=requests_strategy, policy=policies, kv=st.integers(1200, 6000), seed=st.integers(0, 5))
@example(rows=[(0.0, 1, 238), (0.125, 189, 100), (0.0625, 513, 2), (0.03125, 1, 2),
               (0.03125, 673, 224)], policy="round-robin", kv=1200, seed=0)  # KV read at a segment's end
def test_invariants(rows, policy, kv, seed):
    reqs = build(rows)
    cluster = ClusterSpec(prefill=1, decode=2, engine=EngineConfig(256, 8, 16), nic_gbps=10)
    from baton.policies import PolicyContext, build_scheduler
    from baton.sim import Simulator
    perf = tiny_perf(kv)
    sched = build_scheduler(policy, PolicyContext(np.random.default_rng(seed), perf))
    sim = Simulator(cluster, perf, sched, reqs, sample_interval_s=0.5)
    guard = KVGuard(sim)
    result = sim.run()
    assert_all_ended(sim, result, len(reqs))
    for state in sim.states.values():
        if state.phase is Phase.FINISHED:
            # timestamps monotone per request
            times = [state.request.arrival_s, state.prefill_start_s, state.first_token_s, state.finish_s]
            assert all(a <= b + 1e-12 for a, b in zip(times, times[1:])), times
            if state.decode_start_s is not None:
                assert state.decode_start_s <= state.finish_s
                # colocated: the prefill samples the first token; PD: the decode side does
                if state.path[-1] == state.path[0]:
                    assert state.first_token_s <= state.decode_start_s
                else:
                    assert state.decode_start_s <= state.first_token_s
    assert not guard.violations
    assert_drained(sim)
    # the same seed gives the same results
    sched2 = build_scheduler(policy, PolicyContext(np.random.default_rng(seed), perf))
    again = Simulator(cluster, perf, sched2, reqs, sample_interval_s=0.5).run()
    # exact equality (repr so that NaN compares equal to NaN)
    assert [repr((r.req_id, r.ttft_s, r.e2e_s, r.path)) for r in again.records] == \
        [repr((r.req_id, r.ttft_s, r.e2e_s, r.path)) for r in result.records]
