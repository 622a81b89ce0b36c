"""Closed-form multi-iteration advance == per-iteration reference (relative diff <= 1e-6)."""

import math

import pytest

from baton.sim import ClusterSpec, EngineConfig
from tests.sim.helpers import run, tiny_perf, workload


def assert_same(a, b):
    assert len(a.records) == len(b.records)
    for ra, rb in zip(a.records, b.records):
        assert (ra.req_id, ra.finished, ra.preemptions, ra.path) == (rb.req_id, rb.finished, rb.preemptions, rb.path)
        for field in ("ttft_s", "tpot_s", "e2e_s", "queue_s", "transfer_s"):
            x, y = getattr(ra, field), getattr(rb, field)
            if math.isnan(x) or math.isnan(y):
                assert math.isnan(x) and math.isnan(y), (ra.req_id, field)
            else:
                assert abs(x - y) <= 1e-6 * max(abs(x), abs(y), 1e-9), (ra.req_id, field, x, y)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("policy", ["least-loaded", "least-kv", "power-of-two", "colocated"])
def test_closed_form_matches_per_iteration(seed, policy):
    reqs = workload(seed)
    _, fast = run(reqs, policy, closed_form=True, seed=seed)
    _, ref = run(reqs, policy, closed_form=False, seed=seed)
    assert_same(fast, ref)
    assert fast.counters.events < ref.counters.events / 2


def test_equivalence_holds_under_preemption():
    reqs = workload(5, n=80, rate=40.0, out_median=400)
    cluster = ClusterSpec(prefill=1, decode=2, engine=EngineConfig(512, 64, 16))
    _, fast = run(reqs, "round-robin", cluster=cluster, perf=tiny_perf(2500))
    _, ref = run(reqs, "round-robin", cluster=cluster, perf=tiny_perf(2500), closed_form=False)
    assert fast.counters.preemptions > 0
    assert fast.counters.preemptions == ref.counters.preemptions
    assert_same(fast, ref)
