"""CascadeInfer's stage partition: the exact DP equals brute force on tiny inputs, the
two-phase heuristic is never worse than its one-instance-per-stage chain (nor better than
the exact optimum), and the QoE profile fits the simulator's perf model."""

import itertools

import numpy as np
import pytest

from baton.perf.qoe import QoEModel
from baton.policies.cascade_plan import PlanCost, chain_plan, exact_plan, heuristic_plan

QOE = QoEModel((2.8e-3, 0.0, 5e-8, 2.7e-12, 6.6e-8))  # the shape profile_qoe fits on llama-3.2-3b@h100


def population(seed, n=300):
    rng = np.random.default_rng(seed)
    prompt = rng.lognormal(6.0, 1.0, n).clip(16, 6000)
    ctx = prompt + rng.lognormal(5.5, 1.2, n).clip(1, 8000)
    return prompt, ctx


def cost_of(seed, max_context):
    prompt, ctx = population(seed)
    return PlanCost(prompt, ctx, QOE, kv_bytes_per_token=114_688, link_bytes_per_s=50e9, first_cut=512,
                    max_context=max_context)


def brute_force(cost, instances):
    best = None
    k = cost.tiers
    for n_stages in range(1, min(instances, k) + 1):
        for cuts in itertools.combinations(range(1, k), n_stages - 1):
            bounds = [0, *cuts, k]
            for alloc in itertools.product(range(1, instances + 1), repeat=n_stages):
                if sum(alloc) != instances:
                    continue
                plan = cost.plan_of([(bounds[i], bounds[i + 1], alloc[i]) for i in range(n_stages)])
                best = plan.cost if best is None else min(best, plan.cost)
    return best


@pytest.mark.parametrize("seed,instances,max_context", [(0, 3, 4096), (1, 4, 4096), (2, 4, 8192), (3, 2, 8192)])
def test_exact_dp_equals_brute_force(seed, instances, max_context):
    cost = cost_of(seed, max_context)
    plan = exact_plan(cost, instances)
    assert sum(plan.instances) == instances and plan.bounds[-1] == float("inf")
    assert plan.cost == pytest.approx(brute_force(cost, instances), rel=1e-12)


@pytest.mark.parametrize("seed,instances", [(0, 4), (1, 6), (2, 8), (3, 5)])
def test_heuristic_is_never_worse_than_its_chain(seed, instances):
    cost = cost_of(seed, 16384)
    chain = cost.plan_of(chain_plan(cost, instances))
    plan = heuristic_plan(cost, instances)
    assert sum(plan.instances) == instances
    assert plan.cost <= chain.cost + 1e-12
    assert plan.cost >= exact_plan(cost, instances).cost - 1e-9


def test_qoe_profile_fits_the_perf_model_on_held_out_cases():
    from baton.profiling.qoe import profile_qoe
    profile = profile_qoe("llama-3.2-3b@h100", max_tokens=4096, max_batch=64)
    assert profile.held_out_mape < 0.05 and len(set(profile.cases)) >= 10
