"""SIBYL on hand-built views: each load type, the ablations, and the cached projection
against a from-scratch evaluation of equations 6-8."""

import numpy as np
import pytest

from baton.core import ClusterView, InstanceState, Request, RequestState, Role
from baton.core.decisions import ArrivalPlan
from baton.core.events import Completed, DecodeProgress
from baton.core.request import Phase
from baton.perf import build
from baton.policies import PolicyContext, build_scheduler

NOW = 100.0
PERF = build("llama-3.1-8b@a100-80g")


def sibyl(name="sibyl"):
    sched = build_scheduler(name, PolicyContext(np.random.default_rng(0), PERF))
    return sched.stages[0]


def cluster(decodes_per_instance, prefill_queue=0):
    """Instance 0 prefills; instances 1.. decode. decodes: list of (prompt, generated, rate)."""
    instances = {0: InstanceState(0, Role.PREFILL, 10_000, 16)}
    if prefill_queue:
        instances[0].queue_prefill(99_999, prefill_queue)
    states, rid = {}, 0
    for i, decs in enumerate(decodes_per_instance, start=1):
        inst = InstanceState(i, Role.DECODE, 100_000, 16)
        for prompt, gen, rate in decs:
            rid += 1
            st = RequestState(Request(rid, 0.0, prompt, 50_000))
            st.phase, st.decode_instance = Phase.DECODE, i
            st.decode_start_s, st.generated_tokens = NOW - (gen - 1) / rate, gen
            states[rid] = st
            # joined with its first token, decoding at ``rate`` since
            inst.decodes.add(rid, prompt + 1, 1, 50_000, rid, -(-(prompt + gen) // 16),
                             joined_s=NOW - (gen - 1) / rate)
            inst.decodes.set(rid, "ctx", prompt + gen)
            inst.decodes.set(rid, "generated", gen)
        instances[i] = inst
    view = ClusterView(instances, states)
    view.now_s = NOW
    return view


def teach(stage, lengths):
    view = cluster([[]])
    for k, n in enumerate(lengths):
        view._requests[10_000 + k] = RequestState(Request(10_000 + k, 0.0, 1, n))
        stage.observe(view, Completed(10_000 + k, n, 0.0))


def arrive(stage, view, rid=500, prompt=8000):
    st = RequestState(Request(rid, NOW, prompt, 100))
    view._requests[rid] = st
    return stage.plan_arrival(view, st, ArrivalPlan())


# Instance 1: a young request (2000 tokens). Instance 2: more tokens now (3050), but every
# output so far ended at 1024 tokens and it is at 1050 generating 100 tok/s: it will be gone
# by the handoff. Least-loaded and PROB@1 see instance 2 as heavier; SIBYL does not.
TYPE1 = [[(1900, 100, 100.0)], [(2000, 1050, 100.0)]]


@pytest.mark.parametrize("name,expected", [
    ("sibyl", 2), ("sibyl-prob1", 1), ("sibyl-no-type2", 2), ("sibyl-no-type3", 2),
])
def test_type1_survival_weighting(name, expected):
    stage = sibyl(name)
    teach(stage, [1024] * 50)
    assert arrive(stage, cluster(TYPE1)).decode_instance == expected


def test_least_loaded_takes_the_instance_with_fewer_tokens_now():
    view = cluster(TYPE1)
    assert build_scheduler("least-loaded", PolicyContext(np.random.default_rng(0), PERF)).choose_decode(
        view, RequestState(Request(7, NOW, 100, 10))) == 1


def test_without_type1_running_decodes_are_ignored():
    stage = sibyl("sibyl-no-type1")
    view = cluster([[(30_000, 10, 30.0)], []])
    assert stage.assign(view, NOW + 0.5) == 1  # tie on zero load: lowest id
    assert sibyl().assign(view, NOW + 0.5) == 2


@pytest.mark.parametrize("name,pending_start,expected", [
    # Type 2: bound to instance 1 and starting before τ.
    ("sibyl", NOW + 0.1, 2), ("sibyl-no-type2", NOW + 0.1, 1), ("sibyl-no-type3", NOW + 0.1, 2),
    # Type 3: starting shortly after τ; its prompt still counts, discounted by the gap.
    ("sibyl", NOW + 0.6, 2), ("sibyl-no-type3", NOW + 0.6, 1), ("sibyl-no-type2", NOW + 0.6, 2),
    # Type 3 far after τ: discounted to nothing.
    ("sibyl", NOW + 400.0, 1),
])
def test_pending_types(name, pending_start, expected):
    stage = sibyl(name)
    view = cluster([[], []])
    stage.pending.add(77, 1, pending_start, 4000)
    assert stage.assign(view, NOW + 0.5) == expected


def test_type3_value_is_relu_of_the_discounted_prompt():
    stage = sibyl()
    stage.v_sys = 40.0
    view = cluster([[], []])
    stage.pending.add(1, 1, NOW + 10.0, 1000)  # 40 tok/s x 9.5 s = 380 tokens of discount
    stage.pending.add(2, 2, NOW + 0.2, 1000)  # Type 2: 0.3 s x 40 = 12 tokens decoded
    _, load = stage.projected_loads(view, NOW + 0.5)
    assert load[0] == pytest.approx(620.0)
    assert load[1] == pytest.approx(1012.0 * stage.survival.survival(12.0))


def test_reqlevel_counts_requests_not_tokens():
    view = cluster([[(30_000, 10, 30.0)], [(50, 10, 30.0)] * 3])
    assert sibyl("sibyl").assign(view, NOW + 0.2) == 2
    assert sibyl("sibyl-reqlevel").assign(view, NOW + 0.2) == 1


def test_reqlevel_counts_pending_requests():
    stage = sibyl("sibyl-reqlevel")
    view = cluster([[(50, 10, 30.0)], []])
    stage.pending.add(9, 2, NOW + 5, 10)
    stage.pending.add(8, 2, NOW + 5, 10)
    assert stage.assign(view, NOW) == 1


def test_back_to_back_arrivals_spread_where_ils_collides():
    view = cluster([[], [], []])
    stage = sibyl()
    picks = [arrive(stage, view, rid=600 + k, prompt=3000).decode_instance for k in range(3)]
    assert sorted(picks) == [1, 2, 3]
    ils = build_scheduler("ils", PolicyContext(np.random.default_rng(0), PERF))
    picks = []
    for k in range(3):
        st = RequestState(Request(700 + k, NOW, 3000, 10))
        picks.append(ils.plan_arrival(view, st).decode_instance)
    assert picks == [1, 1, 1]  # instantaneous load does not see the shadow


def test_projection_matches_equations_from_scratch():
    rng = np.random.default_rng(3)
    decs = [[(int(rng.integers(50, 4000)), int(rng.integers(2, 3000)), float(rng.uniform(20, 60)))
             for _ in range(int(rng.integers(0, 12)))] for _ in range(6)]
    view = cluster(decs)
    stage = sibyl()
    teach(stage, rng.lognormal(6.5, 1.0, 400).astype(int) + 1)
    tau = NOW + 0.7  # a grid horizon, so the cached curve is exact there
    _, got = stage.projected_loads(view, tau)
    want = []
    for i in range(1, 7):
        total = 0.0
        for rid in view.instance(i).decodes.req_ids():
            st = view.request(rid)
            gen = st.generated_tokens
            rate = (gen - 1) / (NOW - st.decode_start_s)
            later = gen + rate * (tau - NOW)
            total += (st.request.prompt_tokens + later) * stage.survival.conditional(gen, later)
        want.append(total)
    assert got == pytest.approx(np.array(want), rel=1e-6)  # join times are kept in microseconds


def test_completion_is_subtracted_from_the_cached_curve():
    stage = sibyl()
    view = cluster([[(100, 10, 30.0), (5000, 10, 30.0)], []])
    _, before = stage.projected_loads(view, NOW + 0.5)
    stage.pending.add(1, 1, NOW, 100)
    view.request(2).decode_instance = 1
    stage.observe(view, Completed(2, 10, NOW))  # the 5,000-token request on instance 1 ends
    _, after = stage.projected_loads(view, NOW + 0.5)
    assert before[0] > 5000 and after[0] < 200 and stage.survival.count == 1
    stage.observe(view, Completed(1, 10, NOW))
    assert len(stage.pending) == 0


def test_tick_refreshes_stale_curves_and_drops_joined_pending():
    stage = sibyl()
    view = cluster([[(100, 10, 30.0)], []])
    stage.projected_loads(view, NOW)
    stage.pending.add(1, 1, NOW, 100)  # request 1 is already in instance 1's batch
    view.now_s = NOW + 0.5
    stage.tick(view)
    assert len(stage.pending) == 1  # not stale yet
    view.now_s = NOW + 1.5
    stage.tick(view)
    assert len(stage.pending) == 0 and stage.curves.t0_s[1] == NOW + 1.5


def test_type1_load_counts_requests_preempted_and_waiting_to_recompute():
    """A request preempted on an instance will decode there again: it is Type-1 load."""
    from baton.core import ClusterView, InstanceState, Request, RequestState, Role
    from baton.core.request import Phase
    from baton.policies.projection import ActiveCurves
    from baton.predict.survival import SurvivalTable
    inst = InstanceState(0, Role.DECODE, 1000, 16)
    inst.recent_token_interval_s = 0.02
    st = RequestState(Request(5, 0.0, 400, 2000))
    st.phase, st.decode_instance, st.generated_tokens = Phase.PREFILL, 0, 100
    inst.queue_prefill(5, 500)
    view = ClusterView({0: inst}, {5: st})
    curves = ActiveCurves(1)
    ids = curves.refresh(view, 0, SurvivalTable(), weighted=False)
    assert ids.tolist() == [5]
    assert curves.curves[0, 0] == 500  # its context now
    assert curves.curves[0, -1] > 500  # and growing at the instance's rate (50 tokens/s)


@pytest.mark.parametrize("iterations", [1, 2, 7, 300])
def test_decode_rate_moves_by_iterations_not_by_reports(iterations):
    """v̄_sys after one report of k iterations at a rate equals k one-iteration reports at
    it: how a runtime groups iterations (one per segment, or per token) does not move it."""
    grouped, single = sibyl(), sibyl()
    grouped.v_sys = single.v_sys = 40.0
    grouped.observe(None, DecodeProgress(0, iterations, 0.02, NOW))
    for _ in range(iterations):
        single.observe(None, DecodeProgress(0, 1, 0.02, NOW))
    assert grouped.v_sys == pytest.approx(single.v_sys, rel=1e-12)
    assert 40.0 < grouped.v_sys <= 50.0
