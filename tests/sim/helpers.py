"""Small builders shared by simulator tests."""

import numpy as np

from baton.core.request import Phase, Request
from baton.perf.fitted import FittedModel
from baton.policies import PolicyContext, Scheduler, build_scheduler
from baton.sim import ClusterSpec, EngineConfig, Simulator
from baton.workload import SyntheticSpec, generate


def tiny_perf(kv_tokens: int = 4000) -> FittedModel:
    """A linear model with a small KV cache, so preemption happens: 5 ms + 20 us per
    prefill token + 0.1 us per decode context token."""
    coef = np.array([5e-3, 20e-6, 0.0, 50e-6, 1e-7, 5e-8])
    return FittedModel(coef, kv_bytes_per_token=131072, kv_capacity_tokens=kv_tokens)


def workload(seed: int, n: int = 60, rate: float = 20.0, out_median: float = 120.0):
    spec = SyntheticSpec(requests=n, rate_rps=rate, arrival="gamma", cv=2.0, prompt_median=200,
                         prompt_sigma=0.7, prompt_cap=1500, output_median=out_median,
                         output_sigma=0.9, output_cap=1500)
    return generate(spec, np.random.default_rng(seed))


def run(requests, policy="least-loaded", cluster=None, perf=None, closed_form=True, seed=0,
        scheduler: Scheduler | None = None):
    cluster = cluster or ClusterSpec(prefill=1, decode=2, engine=EngineConfig(512, 32, 16), nic_gbps=10)
    perf = perf or tiny_perf()
    scheduler = scheduler or build_scheduler(policy, PolicyContext(np.random.default_rng(seed), perf))
    sim = Simulator(cluster, perf, scheduler, requests, closed_form=closed_form, sample_interval_s=0.5)
    return sim, sim.run()


def req(i, t, prompt, out):
    return Request(i, t, prompt, out)


class KVGuard:
    """Wraps the simulator's segment handler to check KV bounds (and the engines' count of
    admitted prefills) at every boundary."""

    def __init__(self, sim):
        self.sim, self.violations = sim, []
        original = sim._on_segment_end

        def checked(instance_id, version):
            original(instance_id, version)
            for inst in sim.instances.values():
                used = inst.kv_blocks_used_at(sim.now)
                if used < 0 or used > inst.kv_blocks_total:
                    self.violations.append((sim.now, inst.instance_id, used))
            for i, eng in sim.engines.items():  # the engine's running count of admitted prefills
                if eng.admitted != sum(it.admitted for it in eng.prefills.values()):
                    self.violations.append((sim.now, i, "admitted", eng.admitted))
        sim._on_segment_end = checked


def assert_all_ended(sim, result, n_requests: int) -> None:
    """Every request ends: finished with all its tokens, or rejected with a reason."""
    assert len(result.records) == n_requests
    for state in sim.states.values():
        assert state.phase in (Phase.FINISHED, Phase.REJECTED)
        assert not state.migrating
        if state.phase is Phase.REJECTED:
            assert state.reject_reason
        else:
            assert state.generated_tokens == state.request.output_tokens


def assert_drained(sim) -> None:
    """Memory conserved: every block, queue, transfer and reservation released."""
    assert not sim.migrator.moves and not sim.handoffs.transfers
    assert not any(sim.handoffs.receive_wait.values())
    for i, inst in sim.instances.items():
        assert inst.kv_blocks_used == 0 and inst.decodes.n == 0, i
        assert inst.prefill_queue_tokens == 0 and inst.incoming_tokens == 0 and inst.shadow_tokens == 0
        assert inst.prefill_queue_sq_tokens == 0
        eng = sim.engines[i]
        assert not eng.held_blocks and not eng.prefills and not eng.joins
        if eng.cache is not None:  # every block back in the free queue, none still shared
            assert eng.cache.free_blocks() == inst.kv_blocks_total and not eng.cache.active and not eng.cache.held


def run_checked(cluster, perf, scheduler, requests, sample_interval_s: float = 0.1):
    """Simulate and check the invariants: every request ends, KV stays within bounds at
    every segment boundary, and everything is released at the end. Returns (sim, result)."""
    sim = Simulator(cluster, perf, scheduler, requests, sample_interval_s=sample_interval_s)
    return sim, checked(sim, len(requests))


def checked(sim: Simulator, n_requests: int):
    """Run a simulator built (and perhaps instrumented) by the caller, checking the same
    invariants as ``run_checked``; returns the result."""
    guard = KVGuard(sim)
    result = sim.run()
    assert_all_ended(sim, result, n_requests)
    assert not guard.violations
    assert_drained(sim)
    # bytes are counted as they cross a link: never negative, migrations within the total
    assert 0 <= result.counters.migration_bytes and 0 <= result.counters.transfer_bytes
    return result
