"""PD handoff, early binding, bandwidth sharing, preemption, watches and migration."""

import numpy as np
import pytest

from baton.core import ArrivalPlan, Migrate, MigrationMode, Watch
from baton.core.request import Request
from baton.policies import PolicyContext, Scheduler, Stage
from baton.sim import ClusterSpec, EngineConfig
from baton.perf import batch_shape
from tests.sim.helpers import run, tiny_perf

CLUSTER = ClusterSpec(prefill=1, decode=2, engine=EngineConfig(512, 32, 16), nic_gbps=1.0, nic_latency_s=0.0)


class Fixed(Stage):
    """Prefill on 0; decode on a fixed instance, bound early or late."""

    def __init__(self, context, decode=1, early=False):
        super().__init__(context)
        self.decode, self.early = decode, early

    def plan_arrival(self, view, request, plan):
        return ArrivalPlan(0, self.decode if self.early else None)

    def choose_decode(self, view, request):
        return self.decode


def sched(*stages_fn):
    perf = tiny_perf(20_000)
    ctx = PolicyContext(np.random.default_rng(0), perf)
    return perf, Scheduler("test", [f(ctx) for f in stages_fn])


def test_pd_first_token_comes_from_the_decode_instance_after_the_transfer():
    """As with vLLM's KV connectors: the prefill instance's sampled token is not the
    client's; the decode instance recomputes the last prompt token after the KV pull and
    samples the first token, so transfer and decode-side waits count in TTFT."""
    perf, s = sched(lambda c: Fixed(c))
    reqs = [Request(0, 0.0, 480, 3)]
    sim, res = run(reqs, cluster=CLUSTER, perf=perf, scheduler=s)
    st = sim.states[0]
    prefill_s = perf.iteration_time_s(batch_shape([(480, 0)], []))
    transfer_s = 480 * perf.kv_bytes_per_token / (1e9 / 8)
    assert st.transfer_start_s == pytest.approx(prefill_s)
    assert st.transfer_end_s == pytest.approx(prefill_s + transfer_s)
    first_decode_s = perf.iteration_time_s(batch_shape([], [480]))
    assert st.first_token_s == pytest.approx(st.transfer_end_s + first_decode_s)
    assert res.records[0].ttft_s == pytest.approx(prefill_s + transfer_s + first_decode_s)
    # three tokens, all sampled on the decode instance: two gaps after the first
    gaps = [perf.iteration_time_s(batch_shape([], [480 + k])) for k in (1, 2)]
    assert st.finish_s == pytest.approx(st.first_token_s + sum(gaps))
    assert st.path == [0, 1] and res.records[0].finished


def test_colocated_first_token_is_the_prefill_iteration():
    perf, s = sched(lambda c: Deflect(c))
    sim, _ = run([Request(0, 0.0, 64, 3)], cluster=CLUSTER, perf=perf, scheduler=s)
    assert sim.states[0].first_token_s == pytest.approx(perf.iteration_time_s(batch_shape([(64, 0)], [])))


def test_early_binding_overlaps_transfer_with_prefill():
    reqs = [Request(0, 0.0, 480, 3)]
    perf, late = sched(lambda c: Fixed(c))
    _, early = sched(lambda c: Fixed(c, early=True))
    sim_l, _ = run(reqs, cluster=CLUSTER, perf=perf, scheduler=late)
    sim_e, _ = run(reqs, cluster=CLUSTER, perf=perf, scheduler=early)
    assert sim_e.states[0].transfer_start_s == 0.0
    assert sim_e.states[0].transfer_end_s < sim_l.states[0].transfer_end_s
    assert sim_e.states[0].transfer_end_s <= sim_e.states[0].first_token_s
    assert sim_e.states[0].first_token_s < sim_l.states[0].first_token_s


def test_concurrent_transfers_share_the_nic():
    perf, s = sched(lambda c: Fixed(c))
    one = run([Request(0, 0.0, 240, 3)], cluster=CLUSTER, perf=perf, scheduler=s)[0].states[0]
    perf, s = sched(lambda c: Fixed(c))
    sim, _ = run([Request(0, 0.0, 240, 3), Request(1, 0.0, 240, 3)], cluster=CLUSTER, perf=perf, scheduler=s)
    alone = one.transfer_end_s - one.transfer_start_s
    a, b = sim.states[0], sim.states[1]
    lag = b.transfer_start_s - a.transfer_start_s  # the second prefill ran one iteration later
    assert 0 < lag < alone
    # the first flow runs alone for `lag`, then both share the NIC at half rate
    assert a.transfer_end_s - a.transfer_start_s == pytest.approx(2 * alone - lag, rel=1e-9)
    assert b.transfer_end_s == pytest.approx(a.transfer_start_s + 2 * alone, rel=1e-9)


def test_decode_instance_out_of_blocks_preempts_latest_admitted():
    reqs = [Request(i, 0.001 * i, 200, 400) for i in range(6)]
    cluster = ClusterSpec(prefill=1, decode=1, engine=EngineConfig(512, 32, 16))
    sim, res = run(reqs, cluster=cluster, perf=tiny_perf(1800))
    assert res.counters.preemptions > 0
    assert all(r.finished for r in res.records)
    assert sim.states[0].preemptions == 0  # the earliest-admitted request is never the victim


class Watcher(Fixed):
    def __init__(self, context):
        super().__init__(context)
        self.fired = []
        self.watched = set()

    def plan_arrival(self, view, request, plan):
        return ArrivalPlan(0, None)

    def tick(self, view):
        fresh = [rid for rid in view.active_request_ids() if rid not in self.watched]
        self.watched.update(fresh)
        return [Watch(rid, 300) for rid in fresh]

    tick_interval_s = 0.05

    def on_threshold(self, view, req_id, context_tokens):
        self.fired.append((req_id, context_tokens, view.context_tokens(req_id)))
        return []


def test_watch_fires_exactly_at_the_context_length():
    holder = {}
    perf, s = sched(lambda c: holder.setdefault("w", Watcher(c)))
    run([Request(0, 0.0, 100, 500)], cluster=CLUSTER, perf=perf, scheduler=s)
    assert holder["w"].fired == [(0, 300, 300)]


class Mover(Fixed):
    tick_interval_s = 0.3

    def __init__(self, context, mode="live", target=2):
        super().__init__(context)
        self.mode, self.target, self.done = MigrationMode(mode), target, False

    def tick(self, view):
        if self.done or not view.decode_snapshot(1)[0].size:
            return []
        self.done = True
        return [Migrate(int(view.decode_snapshot(1)[0][0]), self.target, self.mode)]


@pytest.mark.parametrize("mode", ["live", "recompute"])
def test_migration_moves_a_running_decode(mode):
    perf, s = sched(lambda c: Mover(c, mode))
    sim, res = run([Request(0, 0.0, 300, 800)], cluster=CLUSTER, perf=perf, scheduler=s)
    st = sim.states[0]
    assert res.records[0].finished and st.generated_tokens == 800
    assert st.path == [0, 1, 2] and st.migrations == 1 and res.counters.migrations == 1
    if mode == "live":
        assert res.counters.migration_bytes >= 300 * perf.kv_bytes_per_token
    for inst in sim.instances.values():
        assert inst.kv_blocks_used == 0


def test_migration_that_cannot_be_placed_is_refused_and_request_kept():
    perf, s = sched(lambda c: Mover(c, "live", target=1))  # target == source
    sim, res = run([Request(0, 0.0, 300, 800)], cluster=CLUSTER, perf=perf, scheduler=s)
    assert res.counters.migrations_refused == 1 and res.counters.migrations == 0
    assert res.records[0].finished and sim.states[0].path == [0, 1]


class Deflect(Fixed):
    """Prefill on the decode instance with a chunk limit, decoding there (no transfer)."""

    def plan_arrival(self, view, request, plan):
        return ArrivalPlan(1, 1, prefill_chunk_limit_tokens=64)


def test_deflected_prefill_respects_chunk_limit_and_skips_transfer():
    perf, s = sched(lambda c: Deflect(c))
    sim, res = run([Request(0, 0.0, 300, 5)], cluster=CLUSTER, perf=perf, scheduler=s)
    st = sim.states[0]
    from baton.perf import batch_shape
    chunks = [64, 64, 64, 64, 44]
    expected = sum(perf.iteration_time_s(batch_shape([(c, 64 * i)], [])) for i, c in enumerate(chunks))
    assert st.first_token_s == pytest.approx(expected)
    assert st.transfer_start_s is None and st.path == [1] and res.counters.transfer_bytes == 0


class Flip(Fixed):
    """Turn decode instance 1 into a prefill instance at 0.2 s; later requests avoid it."""

    tick_interval_s = 0.2

    def __init__(self, context):
        super().__init__(context)
        self.flipped = False

    def tick(self, view):
        from baton.core import ChangeRole, Role
        if self.flipped:
            return []
        self.flipped = True
        return [ChangeRole(1, Role.PREFILL)]

    def plan_arrival(self, view, request, plan):
        return ArrivalPlan(0, None)

    def choose_decode(self, view, request):
        return view.decode_ids[0]


def test_role_change_drains_existing_work():
    perf, s = sched(lambda c: Flip(c))
    reqs = [Request(0, 0.0, 100, 2000), Request(1, 0.5, 100, 50)]
    sim, res = run(reqs, cluster=CLUSTER, perf=perf, scheduler=s)
    assert res.counters.role_changes == 1
    assert sim.states[0].path == [0, 1]  # kept decoding on the flipped instance
    assert sim.states[1].path == [0, 2]  # new work went to the remaining decode instance
    assert all(r.finished for r in res.records)


class Sampler(Fixed):
    """Fixed placement, sampling the decode instance's running tokens every 10 ms."""

    tick_interval_s = 0.01

    def __init__(self, context):
        super().__init__(context)
        self.samples = []

    def tick(self, view):
        self.samples.append((view.now_s, view.running_tokens(1)))
        return []


def test_a_handoff_waiting_for_decode_blocks_is_booked_there_and_timed():
    """The second prompt's KV does not fit beside the first request's decode: it waits for
    blocks, and while it waits it is the decode instance's load (as a decode leg queued in
    vLLM is), and its wait is ``receive_wait_s``, part of its TTFT."""
    holder = {}

    def make(c):
        holder["s"] = Sampler(c)
        return holder["s"]
    perf = tiny_perf(1600)
    s = Scheduler("test", [make(PolicyContext(np.random.default_rng(0), perf))])
    cluster = ClusterSpec(prefill=1, decode=1, engine=EngineConfig(512, 32, 16), nic_gbps=1.0, nic_latency_s=0.0)
    sim, res = run([Request(0, 0.0, 1000, 100), Request(1, 0.01, 800, 5)], cluster=cluster, perf=perf, scheduler=s)
    b = sim.states[1]
    rec = {r.req_id: r for r in res.records}
    assert rec[0].receive_wait_s == 0.0 and rec[1].receive_wait_s > 0.1
    assert b.transfer_start_s == pytest.approx(sim.states[0].finish_s)  # its blocks: the first's, freed
    r = rec[1]
    assert r.ttft_s == pytest.approx(r.queue_s + r.prefill_s + r.receive_wait_s + r.transfer_s + r.decode_wait_s)
    waiting = [tokens for t, tokens in holder["s"].samples if b.handoff_start_s < t < b.transfer_start_s]
    assert waiting and min(waiting) >= 1000 + 800  # the first's context and the waiting prompt
