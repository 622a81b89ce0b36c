"""SIBYL inside the simulator: every request ends, its bookkeeping drains, and its early
bindings land on the least-loaded instance more often than instantaneous-load binding."""

import numpy as np

from baton.metrics import SLO
from baton.sim import ClusterSpec, simulate
from baton.workload import SyntheticSpec, generate


def workload():
    spec = SyntheticSpec(requests=400, rate_rps=6.0, arrival="gamma", cv=3.0, prompt="lognormal",
                         prompt_median=800, output="lognormal", output_median=300, output_sigma=1.2,
                         output_cap=4000)
    return generate(spec, np.random.default_rng(4))


def test_sibyl_runs_clean_and_binds_better_than_ils():
    reqs = workload()
    results = {}
    for policy in ("ils", "sibyl", "sibyl-reqlevel", "sibyl-prob1"):
        res = simulate(reqs, ClusterSpec(prefill=2, decode=6), policy, seed=1)
        assert all(r.finished for r in res.records)
        assert sum(r.output_tokens for r in res.records) == sum(r.output_tokens for r in reqs)
        results[policy] = res.summary(SLO())
    assert results["sibyl"]["oar_tokens"] > results["ils"]["oar_tokens"]


def test_pending_table_drains():
    from baton.policies import PolicyContext, build_scheduler
    from baton.perf import build
    from baton.sim.simulator import Simulator
    cluster = ClusterSpec(prefill=2, decode=4)
    perf = build(cluster.preset)
    sched = build_scheduler("sibyl", PolicyContext(np.random.default_rng(0), perf))
    Simulator(cluster, perf, sched, workload()).run()
    assert len(sched.stages[0].pending) == 0
    assert sched.stages[0].survival.count == 400
