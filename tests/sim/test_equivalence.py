"""Closed-form multi-iteration advance == per-iteration reference (relative diff <= 1e-6):
decodes alone (affine iteration times) and prefill chunks planned several iterations at once."""

import math

import numpy as np
import pytest

from baton.policies import PolicyContext, build_scheduler
from baton.sim import ClusterSpec, EngineConfig
from baton.workload import SyntheticSpec, generate
from baton.workload.sessions import SessionsSpec, generate_sessions
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


def long_prompts(seed: int, n: int = 50, rate: float = 6.0):
    """Prompts of one to several 512-token chunks, so prefills run several iterations."""
    spec = SyntheticSpec(requests=n, rate_rps=rate, arrival="gamma", cv=2.0, prompt_median=1100,
                         prompt_sigma=0.6, prompt_cap=3500, output_median=60, output_sigma=0.8, output_cap=600)
    return generate(spec, np.random.default_rng(seed))


MIXED = ClusterSpec(prefill=0, decode=0, mixed=3, engine=EngineConfig(512, 32, 16), nic_gbps=10)


# not sibyl: it smooths its decode rate over each DecodeProgress observation, one per
# segment, so closed form and per-iteration mode differ for it by design (decode segments too)
@pytest.mark.parametrize("policy,cluster", [
    ("least-loaded", None), ("kairos", None), ("deflect-queue", None), ("ares", None), ("combined", None),
    ("kairos", ClusterSpec(prefill=1, decode=2, engine=EngineConfig(512, 32, 16), nic_gbps=1)),
    ("colocated", MIXED), ("least-loaded", MIXED), ("llumnix", MIXED)])
def test_multi_iteration_prefill_matches_per_iteration(policy, cluster):
    """Prefill chunks planned as one segment while the batch stays the same, decodes beside
    them on mixed instances, deflected chunk allowances (kairos), policies that read queued
    prefill tokens between iterations: the same runs as one segment per iteration."""
    reqs = long_prompts(3)
    sim, fast = run(reqs, policy, cluster=cluster, perf=tiny_perf(60_000))
    _, ref = run(reqs, policy, cluster=cluster, perf=tiny_perf(60_000), closed_form=False)
    assert sum(e.prefill_runs for e in sim.engines.values()) > 10  # the feature was exercised
    assert_same(fast, ref)
    assert fast.placement_order == ref.placement_order
    assert fast.tbt.percentile_s(99) == pytest.approx(ref.tbt.percentile_s(99), rel=0.011)  # a 1% bucket


def test_multi_iteration_prefill_matches_per_iteration_with_prefix_caching():
    """Cached blocks are registered chunk by chunk as per-iteration mode does, so a
    prefix-aware router reading the caches mid-prefill routes the same way."""
    reqs = [r for r in generate_sessions(SessionsSpec(), np.random.default_rng(4))[:120]]
    for policy in ("prefix-precise", "cache-aware"):
        sim, fast = run(reqs, policy, cluster=MIXED, perf=tiny_perf(200_000))
        _, ref = run(reqs, policy, cluster=MIXED, perf=tiny_perf(200_000), closed_form=False)
        assert sum(e.prefill_runs for e in sim.engines.values()) > 10
        assert_same(fast, ref)
        hits = [sum(c.hits for c in r.prefix_cache.values()) for r in (fast, ref)]
        assert hits[0] == hits[1] > 0
        assert fast.placement_order == ref.placement_order


def test_a_running_deflected_prefill_retuned_mid_segment_matches_per_iteration():
    """Kairos re-plans a running deflected prefill's chunk limit as its decode batch
    changes: the next iteration takes the new limit, so a segment planned past it ends at
    the boundary (without that cut, runs drifted 3% from per-iteration mode)."""
    spec = SyntheticSpec(requests=80, rate_rps=16.0, arrival="gamma", cv=2.0, prompt_median=1500, prompt_sigma=0.5,
                         prompt_cap=4000, output_median=80, output_sigma=0.8, output_cap=600)
    reqs = generate(spec, np.random.default_rng(1))
    stage = {"stage": "kairos", "max_chunk_tokens": 1024, "proactive": True, "replan_interval_s": 0.02}
    cluster = ClusterSpec(prefill=1, decode=2, engine=EngineConfig(2048, 64, 16), nic_gbps=10)
    results = []
    for closed_form in (True, False):
        perf = tiny_perf(200_000)
        ctx = PolicyContext(np.random.default_rng(0), perf, ttft_slo_s=1.0, tpot_slo_s=0.02)
        sched = build_scheduler({"name": "kairos", "stages": [stage]}, ctx)
        sim, result = run(reqs, cluster=cluster, perf=perf, closed_form=closed_form, scheduler=sched)
        results.append(result)
    assert sum(e.prefill_runs for e in sim.engines.values()) == 0  # per-iteration mode plans none
    assert any(r.deflected for r in results[0].records)
    assert_same(*results)
