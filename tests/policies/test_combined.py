"""The combined scheduler on hand-built views: decode binding by projected iteration time,
the prefix-aware deflection judgement, the sustained-demand flip controller, ARES's
overflow trigger, and one test per conflict rule (policies/combined.py)."""

import numpy as np
import pytest

from baton.core import ClusterView, InstanceState, Request, RequestState, Role
from baton.core.decisions import ArrivalPlan, ChangeRole, Deflect, Migrate
from baton.core.errors import ConfigError
from baton.core.request import Phase
from baton.perf.fitted import FittedModel
from baton.policies import PolicyContext, build_scheduler
from baton.policies.ares import Ares
from baton.policies.combined import Combined
from baton.policies.combined_flips import CacheSavings, FlipController
from baton.policies.kairos import Kairos
from baton.policies.prefill_time import PrefillPredictor

P, D = Role.PREFILL, Role.DECODE
# 5 ms + 10 us per prefill token + 0.5 ms per decode + 0.1 us per context token
PERF = FittedModel(np.array([5e-3, 10e-6, 0.0, 5e-4, 1e-7, 0.0]), kv_bytes_per_token=100_000,
                   kv_capacity_tokens=1_000_000)


def ctx(**kw):
    return PolicyContext(np.random.default_rng(0), PERF, ttft_slo_s=2.0, tpot_slo_s=0.05, **kw)


def view_of(specs, kv_blocks=100_000):
    """specs: (role, queued prompt lengths, decode contexts) per instance."""
    instances, states = {}, {}
    for i, (role, queued, ctxs) in enumerate(specs):
        inst = InstanceState(i, role, kv_blocks_total=kv_blocks, block_size_tokens=16)
        for j, q in enumerate(queued):
            rid = 100 * i + j
            inst.queue_prefill(rid, q)
            states[rid] = RequestState(Request(rid, 0.0, q, 10), prefill_instance=i)
        for j, c in enumerate(ctxs):
            rid = 1000 * i + j
            inst.decodes.add(rid, c, 1, 10_000, j, -(-c // 16))
            states[rid] = RequestState(Request(rid, 0.0, c - 1, 10_000), phase=Phase.DECODE,
                                       prefill_instance=i, decode_instance=i, generated_tokens=1)
        instances[i] = inst
    return ClusterView(instances, states), states


def handoff(states, rid, prompt, prefill_instance):
    st = RequestState(Request(rid, 0.0, prompt, 10), prefill_instance=prefill_instance, generated_tokens=1)
    states[rid] = st
    return st


BINDINGS = [
    # decode contexts per decode instance, the request's prompt, iteration's pick, token load's pick
    ("few long contexts iterate faster than many short ones (14 vs 17 ms)",
     [[40_000] * 2, [1_000] * 20], 100, 1, 2),
    ("equal batches: the lighter contexts", [[5_000] * 4, [2_000] * 4], 100, 2, 2),
]


@pytest.mark.parametrize("name,decodes,prompt,want,by_load", BINDINGS, ids=[b[0] for b in BINDINGS])
def test_decode_binding_by_projected_iteration_time(name, decodes, prompt, want, by_load):
    view, states = view_of([(P, [], [])] + [(D, [], c) for c in decodes])
    st = handoff(states, 7, prompt, 0)
    assert Combined(ctx()).choose_decode(view, st) == want
    assert Combined(ctx(), decode_binding="token-load").choose_decode(view, st) == by_load


def test_decode_binding_skips_an_instance_whose_kv_cannot_hold_the_request():
    # instance 1 iterates faster but 2 x 40k + 30k > 100k tokens of KV
    view, states = view_of([(P, [], []), (D, [], [40_000] * 2), (D, [], [1_000] * 20)], kv_blocks=100_000 // 16)
    assert Combined(ctx()).choose_decode(view, handoff(states, 7, 30_000, 0)) == 2


def test_rule7_a_prompt_prefilled_on_a_decoding_instance_decodes_there():
    view, states = view_of([(P, [], []), (D, [], [40_000] * 9), (D, [], [])])
    assert Combined(ctx()).choose_decode(view, handoff(states, 7, 100, 1)) == 1


def _arrival(view, states, rid, prompt, keys=()):
    st = RequestState(Request(rid, 0.0, prompt, 10))
    st.block_keys = tuple(keys)
    states[rid] = st
    return st


def test_a_cached_prefix_keeps_the_prompt_on_its_prefill_instance():
    """8,000 tokens: the prefill path (85 ms + 64 ms of transfer) loses to two 50 ms
    deflected chunks; with 7,000 of them cached there it wins (15 + 64 ms)."""
    keys = list(range(500))
    view, states = view_of([(P, [], []), (D, [], [])])
    cold = Combined(ctx())
    plan = cold.plan_arrival(view, _arrival(view, states, 1, 8000, keys), ArrivalPlan())
    assert (plan.prefill_instance, plan.decode_instance) == (1, 1)
    warm = Combined(ctx())
    warm.prefix.history.record(0, keys[:437], 100_000)  # 437 blocks of 16 = 6,992 tokens cached on 0
    plan = warm.plan_arrival(view, _arrival(view, states, 2, 8000, keys), ArrivalPlan())
    assert plan.prefill_instance == 0 and plan.decode_instance is None


def _queued(view, st, instance_id):
    """Book a placed prompt as the runtime does: queued whole on its prefill instance."""
    view.instance(instance_id).queue_prefill(st.req_id, st.request.prompt_tokens)
    st.prefill_instance = instance_id


def test_prompts_queued_on_their_cache_are_priced_by_their_uncached_tokens():
    """Two 8,000-token prompts sharing 6,992 cached tokens on instance 0: the first queued
    there must not push the second onto the cold instance 1 (8,000 booked tokens would
    predict 85 ms of queue there; uncached, 15 ms)."""
    keys = list(range(500))
    view, states = view_of([(P, [], []), (P, [], []), (D, [], [])])
    stage = Combined(ctx(), deflect=False)
    stage.prefix.history.record(0, keys[:437], 100_000)
    first = _arrival(view, states, 1, 8000, keys)
    assert stage.plan_arrival(view, first, ArrivalPlan()).prefill_instance == 0
    _queued(view, first, 0)
    assert stage.predictor.delay(view, 0) == pytest.approx(stage.predictor.pt(8000 - 6992))
    pt = stage.predictor.pt
    assert stage.savings.saved_s(0, view.now_s) == pytest.approx(pt(8000) - pt(8000 - 6992))  # the flip's price
    assert stage.plan_arrival(view, _arrival(view, states, 2, 8000, keys), ArrivalPlan()).prefill_instance == 0


def test_a_queued_prompt_is_not_replanned_away_from_its_cache():
    """A tick re-plans queued prompts onto decode instances by Kairos's rule: one whose
    prefix is cached where it waits costs its uncached tokens there (15 ms, not 85), so it
    stays; a plain Kairos stage, pricing every queued token, deflects it."""
    keys = list(range(500))
    view, states = view_of([(P, [], []), (D, [], [])])
    stage = Combined(ctx(), flips=False, migrate=False)
    stage.prefix.history.record(0, keys[:437], 100_000)
    st = _arrival(view, states, 1, 8000, keys)
    assert stage.plan_arrival(view, st, ArrivalPlan()).prefill_instance == 0
    _queued(view, st, 0)
    assert [d for d in stage.tick(view) if isinstance(d, Deflect)] == []
    kairos = Kairos(ctx(), tbt_slo_s=0.8 * 0.05, chunk_attention=True)  # combined's deflection settings
    assert [d.req_id for d in kairos.tick(view) if isinstance(d, Deflect)] == [1]


def test_rule2_an_instance_flipped_recently_takes_no_deflection():
    view, states = view_of([(P, [9000] * 3, []), (D, [], []), (D, [], [])])
    stage = Combined(ctx())
    first = stage.plan_arrival(view, _arrival(view, states, 1, 500), ArrivalPlan())
    assert first.prefill_instance == 1  # deflected to the first idle decode instance
    stage.flipped_at[1] = view.now_s  # as if the flip controller had just moved it
    second = stage.plan_arrival(view, _arrival(view, states, 2, 500), ArrivalPlan())
    assert second.prefill_instance == 2
    stage.flipped_at[2] = view.now_s
    third = stage.plan_arrival(view, _arrival(view, states, 3, 500), ArrivalPlan())
    assert third.prefill_instance == 0  # nowhere to deflect: the prefill path
    view.now_s = 10.0  # settled
    assert stage.plan_arrival(view, _arrival(view, states, 4, 500), ArrivalPlan()).prefill_instance == 1


def test_rule1_a_deflected_prompt_is_never_a_migration_candidate():
    view, states = view_of([(P, [], []), (D, [3000], [20_000] * 4), (D, [], [])])
    states[100].phase = Phase.WAITING  # deflected to instance 1, not started
    ares = Ares(ctx(), trigger="overflow")
    req_ids = ares.snapshot(view, np.array([1, 2]))[0]
    assert 100 not in req_ids.tolist() and len(req_ids) == 4


def flipper(window_s=3.0, share=0.125):
    return FlipController(PrefillPredictor(PERF), PERF, 2.0, 0.05, 50_000, window_s, share=share)


def prefill_pressure():
    # two prefill instances each 2 x 60k tokens deep (seconds of queue), decode side idle
    return view_of([(P, [60_000] * 2, []), (P, [60_000] * 2, []), (D, [], []), (D, [], [])])[0]


def test_a_flip_waits_for_the_demand_shift_to_hold_its_window():
    f, view = flipper(), prefill_pressure()
    decided = []
    for t in (0.0, 1.0, 2.0, 2.9, 3.0):
        view.now_s = t
        decided.append(f.decide(view, frozenset()))
    assert decided[:4] == [[]] * 4
    assert decided[4] == [ChangeRole(2, Role.PREFILL)]  # the decode instance with least running tokens


def test_a_broken_condition_restarts_the_window():
    f = flipper()
    view = prefill_pressure()
    view.now_s = 0.0
    assert f.decide(view, frozenset()) == []
    calm = view_of([(P, [], []), (P, [], []), (D, [], []), (D, [], [])])[0]
    calm.now_s = 1.0
    assert f.decide(calm, frozenset()) == []
    view.now_s = 3.5
    assert f.decide(view, frozenset()) == []  # held only since 3.5
    view.now_s = 6.5
    assert f.decide(view, frozenset()) != []


def test_rule3_an_instance_migrating_is_not_flipped_and_rule8_a_side_keeps_one():
    f, view = flipper(0.0), prefill_pressure()
    assert f.decide(view, frozenset({2})) == [ChangeRole(3, Role.PREFILL)]
    f2 = flipper(0.0)
    assert f2.decide(view, frozenset({2, 3})) == []
    lone = view_of([(P, [60_000] * 2, []), (D, [], [])])[0]
    assert flipper(0.0).decide(lone, frozenset()) == []  # the last decode instance stays


def test_rule5_a_decode_instance_holding_deflected_prompts_is_not_flipped_to_prefill():
    view = view_of([(P, [60_000] * 2, []), (P, [60_000] * 2, []), (D, [800], []), (D, [], [])])[0]
    assert flipper(0.0).decide(view, frozenset()) == [ChangeRole(3, Role.PREFILL)]


def test_a_flip_to_decode_waits_out_the_queue_it_must_drain():
    # decode side hot (long batches), prefill side cool: instance 0 has a short queue
    view = view_of([(P, [2000], []), (P, [], []), (D, [], [100_000] * 30), (D, [], [100_000] * 30)])[0]
    f = flipper(1.0)
    view.now_s = 0.0
    assert f.decide(view, frozenset()) == []
    view.now_s = 1.0
    assert f.decide(view, frozenset()) == [ChangeRole(1, Role.DECODE)]  # the empty one: no drain


def test_a_flip_to_decode_prices_the_prefix_cache_it_drops():
    """Decode side hot, both prefill instances idle: the one whose cache saved 10 s of
    prefill in the window is given up last, and alone it flips only once those savings
    have left the window (1 s)."""
    hot = [(P, [], []), (P, [], []), (D, [], [100_000] * 30), (D, [], [100_000] * 30)]
    view = view_of(hot)[0]
    savings = CacheSavings(1.0)
    f = FlipController(PrefillPredictor(PERF), PERF, 2.0, 0.05, 50_000, 1.0, savings=savings)
    savings.record(0, 0.0, 10.0)
    view.now_s = 0.0
    assert [i for i, _ in f.candidates(view, Role.DECODE, [0, 1], [2, 3], frozenset())] == [1, 0]
    assert f.decide(view, frozenset({1})) == []
    view.now_s = 1.0
    assert f.decide(view, frozenset({1})) == []  # held 1 s, but the flip costs 1 s + 10 s
    view.now_s = 1.5
    assert savings.saved_s(0, 1.5) == 0.0
    assert f.decide(view, frozenset({1})) == [ChangeRole(0, Role.DECODE)]


CACHE_SAVINGS = [
    # placements (instance, time s, saved s), query (instance, time s), seconds saved in the window (2 s)
    ("nothing recorded", [], (0, 5.0), 0.0),
    ("a sum within the window", [(0, 1.0, 0.5), (0, 2.0, 0.25)], (0, 3.0), 0.75),
    ("older entries leave", [(0, 1.0, 0.5), (0, 2.0, 0.25)], (0, 3.5), 0.25),
    ("per instance", [(0, 1.0, 0.5), (1, 1.0, 2.0)], (1, 2.0), 2.0),
    ("no saving is no entry", [(0, 1.0, 0.0)], (0, 1.0), 0.0),
]


@pytest.mark.parametrize("name,placements,query,want", CACHE_SAVINGS, ids=[c[0] for c in CACHE_SAVINGS])
def test_cache_savings_over_the_window(name, placements, query, want):
    savings = CacheSavings(2.0)
    for instance, t, saved in placements:
        savings.record(instance, t, saved)
    assert savings.saved_s(*query) == pytest.approx(want)


def test_rule4_and_6_a_flip_in_a_tick_is_kept_out_of_that_ticks_migrations():
    stage = Combined(ctx(), deflect=False, flip_window_s=0.0)
    view = prefill_pressure()
    out = stage.tick(view)
    flips = [d for d in out if isinstance(d, ChangeRole)]
    assert flips == [ChangeRole(2, Role.PREFILL)]
    assert 2 in stage.ares.exclude  # the same tick's ARES round saw it as owned
    assert not any(isinstance(d, Migrate) and d.target_instance == 2 for d in out)


def test_overflow_trigger_moves_work_only_off_an_instance_that_would_overflow():
    def round_on(kv_blocks):
        view, _ = view_of([(P, [], []), (D, [], [30_000] * 3), (D, [], [1_000])], kv_blocks=kv_blocks)
        view.now_s = 5.0
        return Ares(ctx(), estimator="none", trigger="overflow").tick(view)
    assert round_on(200_000 // 16) == []  # imbalanced, but 90k fits in 200k: nothing moves
    moves = round_on(92_000 // 16)  # 90k of 92k x 0.95 headroom: overflows
    assert moves and isinstance(moves[0], Migrate) and moves[0].target_instance == 2
    assert Ares(ctx(), estimator="none").tick(view_of([(P, [], []), (D, [], [30_000] * 3), (D, [], [1_000])],
                                                      kv_blocks=200_000 // 16)[0])  # the paper's trigger moves


def test_every_component_can_be_switched_off_and_bad_choices_are_named():
    stage = Combined(ctx(), prefill="least-loaded", deflect=False, flips=False, migrate=False)
    assert stage.prefix is None and stage.kairos is None and stage.flipper is None and stage.ares is None
    assert stage.tick_interval_s is None
    for bad in ({"prefill": "magic"}, {"decode_binding": "dice"}, {"tick_s": 0}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            Combined(ctx(), **bad)
    sched = build_scheduler({"name": "c", "stages": [{"stage": "combined", "flips": False}]}, ctx())
    assert sched.stages[0].flipper is None


def test_proactive_replans_skip_settling_instances():
    view, states = view_of([(P, [9000, 500], []), (D, [], []), (D, [], [])])
    for rid in (0, 1):
        states[rid].phase = Phase.WAITING
    stage = Combined(ctx(), flips=False, migrate=False)
    stage.flipped_at = {1: 0.0, 2: 0.0}
    assert [d for d in stage.tick(view) if isinstance(d, Deflect)] == []
    stage.flipped_at = {1: 0.0}
    targets = {d.instance for d in stage.tick(view) if isinstance(d, Deflect)}
    assert targets == {2}


def test_a_flip_that_would_overshoot_is_not_wanted():
    """Prefill pressure above decode's, but one more prefill instance would make decode the
    hotter side: the flip would invite the flip back, so none is wanted."""
    f = flipper(0.0)
    # 2 prefill with about 2 s of queue each (p near 1 at a 2 s SLO); 2 decode at 0.5 of MRT
    balanced = view_of([(P, [190_000], []), (P, [190_000], []), (D, [], [12_500] * 2), (D, [], [12_500] * 2)])[0]
    p, d = f.pressures(balanced, [0, 1], [2, 3])
    assert p > d and p * 2 / 3 < d * 2 / 1  # hotter now, colder after the flip
    assert f.wanted(balanced, [0, 1], [2, 3]) is None
    idle_decode = view_of([(P, [190_000], []), (P, [190_000], []), (D, [], []), (D, [], [])])[0]
    assert f.wanted(idle_decode, [0, 1], [2, 3]) is Role.PREFILL


def test_below_the_minimum_pressure_nothing_flips():
    f = flipper(0.0)
    light = view_of([(P, [500], []), (P, [], []), (D, [], []), (D, [], [])])[0]
    assert max(f.pressures(light, [0, 1], [2, 3])) < 0.25
    assert f.wanted(light, [0, 1], [2, 3]) is None


def decode_hot(prefill_instances, decode_instances, contexts, queued=()):
    """Prefill instances each with ``queued`` prompts; decode instances each running ``contexts``."""
    return view_of([(P, list(queued), [])] * prefill_instances + [(D, [], contexts)] * decode_instances)[0]


FLIP_COUNTS = [
    # (P, D, decode contexts each, prefill queue each, share, flips wanted)
    ("8 instances: one per decision (the 0.125 default)", 4, 4, [100_000] * 30, (), 0.125, 1),
    ("64 instances: up to eight", 32, 32, [100_000] * 30, (), 0.125, 8),
    ("64 instances, share 1/64: one", 32, 32, [100_000] * 30, (), 1 / 64, 1),
    # decode at 0.5 of MRT, prefill at 0.33 of the TTFT SLO: the seventh would overshoot
    ("a smaller gap moves fewer than the budget allows", 32, 32, [25_000], [60_000], 0.125, 6),
    ("the cooler side keeps one instance", 2, 2, [100_000] * 30, (), 1.0, 1),
]


@pytest.mark.parametrize("name,n_p,n_d,contexts,queued,share,want", FLIP_COUNTS, ids=[c[0] for c in FLIP_COUNTS])
def test_one_decision_flips_as_many_as_the_gap_allows_within_the_budget(name, n_p, n_d, contexts, queued,
                                                                        share, want):
    view = decode_hot(n_p, n_d, contexts, queued)
    f = flipper(0.0, share)
    prefill, decode = list(range(n_p)), list(range(n_p, n_p + n_d))
    p, d = f.pressures(view, prefill, decode)
    f.decide(view, frozenset())
    view.now_s = 10.0  # past every candidate's drain
    flips = f.decide(view, frozenset())
    assert len(flips) == want and all(c.role is Role.DECODE for c in flips)
    assert len({c.instance_id for c in flips}) == want and all(c.instance_id < n_p for c in flips)
    k = len(flips)
    assert d * n_d / (n_d + k) >= p * n_p / (n_p - k)  # the hot side stays the hotter one


def test_the_flips_of_one_decision_take_the_cheapest_drains_first():
    view = view_of([(P, [9_000], []), (P, [], []), (P, [3_000], []), (P, [60_000], [])]
                   + [(D, [], [100_000] * 30)] * 4)[0]
    f = flipper(0.0, share=0.25)
    assert f.decide(view, frozenset({1})) == []  # every free candidate still has a queue to drain
    drain_2, drain_0 = f.predictor.delay(view, 2), f.predictor.delay(view, 0)
    view.now_s = (drain_2 + drain_0) / 2  # past 2's drain (3k tokens), not 0's (9k)
    assert [c.instance_id for c in f.decide(view, frozenset({1}))] == [2]
    f.since.clear()
    f.decide(view, frozenset({1}))
    view.now_s = 10.0
    assert [c.instance_id for c in f.decide(view, frozenset({1}))] == [2, 0]  # 1 is blocked; 3's queue is the longest


def test_flip_share_is_checked():
    with pytest.raises(ConfigError, match="flip_share"):
        Combined(ctx(), flip_share=0.0)


def test_rule5_an_instance_a_replan_deflects_to_in_this_tick_is_not_flipped():
    view, states = view_of([(P, [60_000] * 3, []), (P, [60_000] * 3, []), (D, [], []), (D, [], []), (D, [], [])])
    for st in states.values():
        st.phase = Phase.WAITING
    stage = Combined(ctx(), flip_window_s=0.0, migrate=False, flip_share=1.0)
    out = stage.tick(view)
    targets = {d.instance for d in out if isinstance(d, Deflect)}
    flipped = {d.instance_id for d in out if isinstance(d, ChangeRole)}
    assert targets and not targets & flipped
    stage.flipper.since.clear()  # without the rule the same decision takes re-plan targets
    unruled = {c.instance_id for c in stage.flipper.decide(view, frozenset())}
    assert unruled & targets


def test_cache_savings_keep_only_one_window():
    savings = CacheSavings(1.0)
    for k in range(100):
        savings.record(0, 0.1 * k, 1.0)
    assert len(savings.entries[0]) == 11  # 8.9 s .. 9.9 s
    assert savings.saved_s(0, 9.9) == pytest.approx(11.0)
