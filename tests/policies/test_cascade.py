"""CascadeInfer's stage: routing to the earliest covering stage, the bid-ask auction, the
refinement freeze, and in the simulator: requests cross stage bounds by live migration
exactly when a Watch fires, and every request ends with its memory released."""

import math

import numpy as np

from baton.core import ClusterView, InstanceState, Request, RequestState, Role
from baton.core.request import Phase
from baton.core.decisions import ArrivalPlan
from baton.perf.qoe import QoEModel
from baton.policies import PolicyContext, build_scheduler
from baton.policies.cascade import Cascade
from baton.sim import ClusterSpec, EngineConfig
from tests.sim.helpers import req, run_checked, tiny_perf

M = Role.MIXED
QOE = QoEModel((2.8e-3, 0.0, 5e-8, 2.7e-12, 6.6e-8))


def view_of(loads, incoming=()):
    """One mixed instance per entry: (decode contexts); ``incoming``: (instance, tokens)."""
    instances, requests = {}, {}
    for i, ctxs in enumerate(loads):
        inst = InstanceState(i, M, kv_blocks_total=10_000, block_size_tokens=16)
        for j, c in enumerate(ctxs):
            inst.decodes.add(1000 * i + j, c, 1, 10_000, j, -(-c // 16))
            st = RequestState(Request(1000 * i + j, 0.0, c, 10_000))
            st.phase, st.decode_instance = Phase.DECODE, i
            requests[1000 * i + j] = st
        instances[i] = inst
    for k, (i, tokens) in enumerate(incoming):
        instances[i].add_incoming(99_000 + k, tokens)
    return ClusterView(instances, requests)


def cascade(**kw):
    ctx = PolicyContext(np.random.default_rng(0), tiny_perf(160_000), extras={"qoe": QOE})
    return Cascade(ctx, **kw)


def test_a_request_enters_the_earliest_stage_covering_its_prompt_with_a_watch_at_its_bound():
    c = cascade(layout="chain", first_cut=256)
    view = view_of([[], [], [100], []])
    c.start(view)
    assert c.bounds == [256, 512, 1024, math.inf]
    plan = c.plan_arrival(view, RequestState(Request(1, 0.0, 300, 10)), ArrivalPlan())
    assert (plan.prefill_instance, plan.decode_instance, plan.watch_context_tokens) == (1, 1, 512)
    plan = c.plan_arrival(view, RequestState(Request(2, 0.0, 5000, 10)), ArrivalPlan())
    assert (plan.prefill_instance, plan.watch_context_tokens) == (3, None)  # the last stage is unbounded


def test_bid_ask_drops_the_loaded_half_then_takes_the_earliest_start():
    c = cascade()
    # loads 100 / 200 / 3000 / 4000: the lower half is {0, 1}; instance 0 has KV arriving
    view = view_of([[100], [200], [3000], [4000]], incoming=[(0, 500)])
    assert c.choose_receiver(view, [0, 1, 2, 3], 300) == 1
    # a receiver with max_moves transfers arriving does not bid
    view = view_of([[100], [200]], incoming=[(1, 10), (1, 20), (1, 30)])
    assert c.choose_receiver(view, [1], 300) is None
    assert cascade(balance="rr").choose_receiver(view_of([[1], [1], [1]]), [0, 1, 2], 10) == 0


def test_refinement_is_frozen_below_five_sequences():
    c = cascade(layout="chain", first_cut=256)
    view = view_of([[100, 120], [300], [600], []])
    c.start(view)
    before = list(c.bounds)
    c._refine(view)
    assert c.bounds == before  # stage 0 + an even share of stage 1: 3 sequences < 5
    view = view_of([[100, 120, 130, 140, 150, 160], [300, 310], [600], []])
    c._refine(view)
    assert c.bounds[0] != before[0] and c.bounds[0] < before[1]


def test_stage_crossings_migrate_at_the_bound_in_the_simulator():
    perf = tiny_perf(kv_tokens=200_000)
    sched = build_scheduler({"name": "c", "stages": [{"stage": "cascade", "layout": "chain", "first_cut": 256,
                                                      "refine": "off"}]},
                            PolicyContext(np.random.default_rng(0), perf, extras={"qoe": QOE}))
    requests = [req(i, i * 0.01, 200, 600) for i in range(12)] + [req(12 + i, 0.05, 700, 50) for i in range(4)]
    cluster = ClusterSpec(prefill=0, decode=0, mixed=4, engine=EngineConfig(1024, 64, 16), nic_gbps=100)
    _, result = run_checked(cluster, perf, sched, requests)
    long_runs = [r for r in result.records if r.req_id < 12]
    # 200 + 600 tokens: start in stage 0 (< 256), cross 256 and 512 into stages 1 and 2
    assert all(r.path == "mixed-0>mixed-1>mixed-2" for r in long_runs), [r.path for r in long_runs]
    assert all(r.migrations == 2 for r in long_runs)
    assert all(r.path == "mixed-2" and r.migrations == 0 for r in result.records if r.req_id >= 12)  # 700 + 50 < 1024


def test_an_ask_waits_in_the_stage_queue_when_every_receiver_is_busy_with_transfers():
    c = cascade(layout="chain", first_cut=256)
    # instance 1 (stage 1) has max_moves transfers arriving: it would bid but for them
    view = view_of([[256], [300]], incoming=[(1, 10), (1, 20), (1, 30)])
    c.start(view)
    assert c.on_threshold(view, 0, 256) == [] and c.asks == {0: (1, 0.0)}
    # without room at all (no free KV), it retries later instead of queueing
    full = view_of([[256], [300]])
    full.instance(1).kv_blocks_used = full.instance(1).kv_blocks_total
    c2 = cascade(layout="chain", first_cut=256)
    c2.start(full)
    assert [type(d).__name__ for d in c2.on_threshold(full, 0, 256)] == ["Watch"] and not c2.asks


def test_receivers_serve_asks_by_sender_load_and_starving_asks_first():
    c = cascade(layout="chain", first_cut=256, starvation_s=2.0)
    # senders: instance 0 (load 300) holds request 0; instance 1 (load 900) holds 1000
    view = view_of([[300], [900], []], incoming=[(2, 10), (2, 20)])  # one free transfer slot
    c.start(view)
    c.asks = {0: (2, 0.0), 1000: (2, 0.5)}
    assert c.ask_order(view) == [1000, 0]  # the more loaded sender first
    view.now_s = 2.2  # request 0 has waited 2.2 s >= 2 s: it starves, so it goes first
    assert c.ask_order(view) == [0, 1000]
    # the one free slot takes the first in that order; the other ask keeps waiting
    moves = c._serve_asks(view)
    assert [(d.req_id, d.target_instance) for d in moves] == [(0, 2)] and c.asks == {1000: (2, 0.5)}


def test_the_stage_output_cv_is_reported_per_period():
    from baton.core.events import DecodeProgress

    c = cascade(layout="nopipe", plan_interval_s=10.0)
    view = view_of([[100, 100], [100, 100]])
    c.start(view)
    c.tick(view)  # the first period starts
    c.observe(view, DecodeProgress(0, 30, 0.01, 1.0))  # 2 running x 30 = 60 tokens
    c.observe(view, DecodeProgress(1, 10, 0.01, 1.0))  # 20 tokens
    view.now_s = 10.0
    c.tick(view)
    assert c.report()["stage_output_cv"] == np.std([60, 20]) / np.mean([60, 20])


def test_a_replan_hands_over_sequences_beyond_their_new_range():
    c = cascade(exact=True, first_cut=256, plan_window=False, prefill_residence_tokens=0.0)
    view = view_of([[100] * 8 + [3000] * 8, [100] * 8 + [3000] * 8, [100] * 8, [100] * 8])
    c.start(view)
    decisions = c.tick(view)
    assert len(c.members) >= 2, c.members
    # every sequence sits in a stage covering it, is moving to one, or watches its bound
    moving = {d.req_id for d in decisions if type(d).__name__ == "Migrate"}
    for s, members in enumerate(c.members):
        for i in members:
            rids, ctx, _ = view.decode_snapshot(i)
            for r, x in zip(rids.tolist(), ctx.tolist()):
                covering = next(k for k, b in enumerate(c.bounds) if x < b)
                assert covering <= s or r in moving or r in c.asks, (r, x, s, c.bounds)


def test_a_refused_handover_is_retried_and_ended_requests_are_forgotten():
    c = cascade(layout="chain", first_cut=256)
    view = view_of([[300], [10]])
    c.start(view)
    c.moving = {0: 1}  # handed to instance 1, but it stayed on 0 and is not migrating: refused
    decisions = c._landed(view)
    assert [(type(d).__name__, d.req_id) for d in decisions] == [("Watch", 0)] and not c.moving
    c.asks, c.moving = {1000: (1, 0.0)}, {1000: 0}
    view.request(1000).phase = Phase.FINISHED  # ended: the live view would drop it
    c._forget_ended(view)
    assert not c.asks and not c.moving


def test_a_sender_already_sending_three_queues_its_next_handover():
    c = cascade(layout="chain", first_cut=256)
    view = view_of([[256, 300, 310, 320], [10], [10]])
    c.start(view)
    c.moving = {1: 2, 2: 2, 3: 2}  # three of instance 0's requests are on their way to 2
    decisions = c.on_threshold(view, 0, 256)
    # instance 1 (stage 1) has room, but the sender is at its limit: the ask waits
    assert decisions == [] and c.asks == {0: (1, 0.0)}
    assert c._serve_asks(view) == []  # still three under way
    del c.moving[3]
    c.granted, c.sending = c._under_way(view)
    assert [(d.req_id, d.target_instance) for d in c._serve_asks(view)] == [(0, 1)]


def test_no_plan_before_the_warm_up_then_one_from_its_statistics():
    c = cascade(exact=True, first_cut=256, prefill_residence_tokens=0.0, warmup_s=10.0, hysteresis=0.05)
    view = view_of([[100] * 8 + [3000] * 8, [100] * 8 + [3000] * 8, [100] * 8, [100] * 8])
    c.start(view)
    for t in range(10):
        view.now_s = float(t)
        c.tick(view)
        assert c.members == [[0, 1, 2, 3]], f"planned at {t} s"
    view.now_s = 10.0
    c.tick(view)
    assert len(c.members) >= 2 and c.report()["cascade_plans_adopted"] == 1


def test_a_plan_that_gains_less_than_its_moves_cost_is_not_taken():
    view = view_of([[100] * 8 + [3000] * 8, [100] * 8 + [3000] * 8, [100] * 8, [100] * 8])
    eager = cascade(exact=True, first_cut=256, plan_window=False, prefill_residence_tokens=0.0, warmup_s=0.0,
                    hysteresis=0.0)
    eager.start(view)
    eager.tick(view)
    assert len(eager.members) >= 2
    # the same gain, but every change must win more than the whole current cost: never
    reluctant = cascade(exact=True, first_cut=256, plan_window=False, prefill_residence_tokens=0.0, warmup_s=0.0,
                        hysteresis=1.0)
    reluctant.start(view)
    reluctant.tick(view)
    assert reluctant.members == [[0, 1, 2, 3]] and reluctant.report()["cascade_plans_kept"] == 1


def test_a_stage_keeps_the_instances_its_arrivals_need():
    import numpy as np
    from baton.policies.cascade_guard import Arrivals, PlanGuard
    from baton.policies.cascade_plan import PlanCost, StagePlan
    cost = PlanCost(np.array([100.0] * 4 + [3000.0] * 4), np.array([200.0] * 4 + [3500.0] * 4), QOE, 1000, 1e9,
                    first_cut=256, max_context=8192)
    last = cost.edges.index(math.inf)
    plan = StagePlan((512.0, math.inf), (1, 3), 0.0)  # one instance for every short prompt
    arrivals = Arrivals(np.array([300.0] * 100), 1.0, 10_000.0)  # 30,000 prompt tokens/s below 512
    guard = PlanGuard(hysteresis=0.0, prefill_share=0.5)  # 5,000 tokens/s an instance: the first stage needs 6
    assert guard._repair(guard._tiers(plan, cost), cost, arrivals, 4) == [(0, last, 4)]  # cannot: one stage
    arrivals = Arrivals(np.array([300.0] * 10), 1.0, 10_000.0)  # 3,000 tokens/s: one instance is enough
    assert [k for *_, k in guard._repair(guard._tiers(plan, cost), cost, arrivals, 4)] == [1, 3]
    arrivals = Arrivals(np.array([300.0] * 20), 1.0, 10_000.0)  # 6,000 tokens/s: two
    assert [k for *_, k in guard._repair(guard._tiers(plan, cost), cost, arrivals, 4)] == [2, 2]
    assert guard.counts["repaired"] == 1 and guard.counts["merged"] == 1
