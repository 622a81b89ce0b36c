"""Small builders shared by simulator tests."""

import numpy as np

from baton.core.request import Request
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
