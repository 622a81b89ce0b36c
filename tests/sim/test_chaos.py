"""Migrations (all modes, and of preempted requests waiting to recompute), preemptions,
completions and role changes interleaved at
random on small clusters: every request ends, KV blocks are conserved and no
reservation leaks."""

import numpy as np
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from baton.core import ChangeRole, Migrate, MigrationMode, Role
from baton.core.request import Request
from baton.policies import PolicyContext, Scheduler, Stage, build_scheduler
from baton.sim import ClusterSpec, EngineConfig, Simulator
from tests.sim.helpers import KVGuard, assert_all_ended, assert_drained, tiny_perf


class Chaos(Stage):
    """Every tick: migrate a few decoding requests anywhere, in any mode, and sometimes
    flip an instance's role (never leaving the cluster without a decode instance)."""

    tick_interval_s = 0.02

    def __init__(self, context, migrate_p: float, flip_p: float):
        super().__init__(context)
        self.migrate_p, self.flip_p = migrate_p, flip_p

    def tick(self, view):
        rng, out = self.context.rng, []
        ids = [i.instance_id for i in view.instances()]
        for inst in view.instances():
            for rid in view.decode_snapshot(inst.instance_id)[0].tolist():
                if rng.random() < self.migrate_p:
                    mode = list(MigrationMode)[int(rng.integers(len(MigrationMode)))]
                    out.append(Migrate(int(rid), int(rng.choice(ids)), mode))
            for rid in view.waiting_decodes(inst.instance_id):  # preempted: moved by recompute
                if rng.random() < self.migrate_p:
                    out.append(Migrate(rid, int(rng.choice(ids)), MigrationMode.RECOMPUTE))
        if rng.random() < self.flip_p:
            target = int(rng.choice(ids))
            role = list(Role)[int(rng.integers(len(Role)))]
            others_decode = any(i.role.decodes for i in view.instances() if i.instance_id != target)
            if role.decodes or others_decode:
                out.append(ChangeRole(target, role))
        return out


rows_strategy = st.lists(st.tuples(st.floats(0, 2), st.integers(1, 700), st.integers(2, 900)),
                         min_size=2, max_size=20)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(rows=[(0.0, 539, 143), (1.0, 337, 2), (1.0, 346, 2), (1.5, 1, 2), (1.5, 465, 2), (1.125, 3, 75),
               (1.625, 545, 2), (1.34375, 1, 46)], kv=1024, seed=512, migrate_p=1.0, flip_p=0.05,
         policy="round-robin")  # two handoffs in opposite directions waited for each other's blocks
@given(rows=rows_strategy, kv=st.integers(1000, 4000), seed=st.integers(0, 1000),
       migrate_p=st.sampled_from([0.05, 0.3, 1.0]), flip_p=st.sampled_from([0.0, 0.05]),
       policy=st.sampled_from(["least-loaded", "round-robin", "colocated"]))
def test_migrations_preemptions_and_role_changes_conserve_everything(rows, kv, seed, migrate_p,
                                                                     flip_p, policy):
    reqs = [Request(i, t, p, o) for i, (t, p, o) in enumerate(sorted(rows))]
    perf = tiny_perf(kv)
    ctx = PolicyContext(np.random.default_rng(seed), perf)
    base = build_scheduler(policy, ctx)
    sched = Scheduler("chaos", [*base.stages, Chaos(ctx, migrate_p, flip_p)])
    mixed = 2 if policy == "colocated" else 0
    cluster = ClusterSpec(prefill=0 if mixed else 1, decode=0 if mixed else 2, mixed=mixed,
                          engine=EngineConfig(256, 8, 16), nic_gbps=10)
    sim = Simulator(cluster, perf, sched, reqs, sample_interval_s=0.5)
    guard = KVGuard(sim)
    result = sim.run()
    assert_all_ended(sim, result, len(reqs))
    assert not guard.violations
    assert_drained(sim)
