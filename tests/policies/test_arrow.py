"""Arrow on small hand-built views: one case per branch of Algorithms 1-4, the overload
rule, the two-instance guards and the cluster monitor."""

import numpy as np
import pytest

from baton.core import ClusterView, InstanceState, Request, RequestState, Role
from baton.core.decisions import ArrivalPlan, ChangeRole, DecodeChoice
from baton.perf import build
from baton.policies import PolicyContext, build_scheduler
from baton.policies.arrow import Arrow, max_running_tokens
from baton.policies.prefill_time import fit_prefill_quadratic

P, D = Role.PREFILL, Role.DECODE
PERF = build("llama-3.1-8b@h100")
BIG = 60_000  # a queued prompt this long alone breaks the 3 s TTFT SLO (about 3.9 s)


def view_of(specs, now_s=0.0):
    """specs: (role, queued prompt lengths, decode contexts, token interval s) per instance."""
    instances = {}
    for i, (role, queued, ctxs, interval) in enumerate(specs):
        inst = InstanceState(i, role, kv_blocks_total=PERF.kv_capacity_tokens // 16, block_size_tokens=16)
        for j, q in enumerate(queued):
            inst.queue_prefill(100 * i + j, q)
        for j, c in enumerate(ctxs):
            inst.decodes.add(1000 * i + j, c, 1, 10_000, j, -(-c // 16))
        inst.recent_iteration_s = inst.recent_token_interval_s = interval
        instances[i] = inst
    view = ClusterView(instances, {})
    view.now_s = now_s
    return view


def arrow(**kw):
    return Arrow(PolicyContext(np.random.default_rng(0), PERF, ttft_slo_s=3.0, tpot_slo_s=0.1), **kw)


def request(prompt=1000, prefill_instance=None):
    st = RequestState(Request(1, 0.0, prompt, 10))
    st.prefill_instance = prefill_instance
    return st


LIGHT = [1000]  # a lightly loaded decode instance's contexts
FAST = 0.01     # a token interval well inside the TPOT SLO


def test_predictors_follow_the_perf_model():
    a, b, c = fit_prefill_quadratic(PERF)
    # a quadratic follows the roofline's prefill (compute corner, 8K chunks) to about 13%
    for n in (512, 1024, 2048, 4096, 8192, 16384):
        assert a * n * n + b * n + c == pytest.approx(PERF.prefill_time_s(n), rel=0.15)
    mrt = max_running_tokens(PERF, 0.1, 1024, PERF.kv_capacity_tokens)
    assert mrt == PERF.kv_capacity_tokens  # on H100 the KV, not the 100 ms TPOT, binds
    tight = max_running_tokens(PERF, 0.012, 1024, PERF.kv_capacity_tokens)
    assert 0 < tight < mrt
    assert PERF.iteration_time_s(_decode_shape(tight // 1024)) <= 0.012 < PERF.iteration_time_s(
        _decode_shape(tight // 1024 + 1))


def _decode_shape(n):
    from baton.perf import BatchShape
    return BatchShape(n_decodes=n, decode_ctx_tokens=n * 1024)


def test_pools_come_from_role_and_remaining_work():
    view = view_of([(P, [], [], 0), (P, [], LIGHT, FAST), (D, [], LIGHT, FAST), (D, [500], LIGHT, FAST)])
    pools = arrow().pools(view)
    assert {k: pools[k].tolist() for k in ("P", "DP", "D", "PD")} == {"P": [0], "DP": [1], "D": [2], "PD": [3]}


# Algorithm 1: (instances, expected prefill instance, expected role changes)
ALG1 = [
    ("least delay in P meeting the SLO",
     [(P, [20_000], [], 0), (P, [1000], [], 0), (D, [], LIGHT, FAST), (D, [], LIGHT, FAST)], 1, ()),
    ("P misses the SLO: D->P",
     [(P, [BIG], [], 0), (P, [], LIGHT, FAST), (D, [], LIGHT, FAST), (D, [], LIGHT, FAST)], 1, ()),
    ("both miss, decode load low: flip the least-loaded D",
     [(P, [BIG], [], 0), (D, [], [9000], FAST), (D, [], LIGHT, FAST)], 2, (ChangeRole(2, P),)),
    ("both miss: a P->D instance is flipped back first",
     [(P, [BIG], [], 0), (D, [], LIGHT, FAST), (D, [300], [5000], FAST)], 2, (ChangeRole(2, P),)),
    ("overload rule: decode slow, no flip, least delay in P",
     [(P, [BIG], [], 0), (P, [BIG, 10], [], 0), (D, [], LIGHT, 0.09), (D, [], LIGHT, 0.09)], 0, ()),
    ("overload rule: decode near Max Running Tokens, no flip",
     [(P, [BIG], [], 0), (D, [], [200_000], FAST), (D, [], [200_000], FAST)], 0, ()),
    ("guard: the last decode instance is never lent",
     [(P, [BIG], [], 0), (D, [], LIGHT, FAST)], 0, ()),
]


@pytest.mark.parametrize("name,specs,want,changes", ALG1, ids=[c[0] for c in ALG1])
def test_algorithm_1(name, specs, want, changes):
    plan = arrow().plan_arrival(view_of(specs), request(), ArrivalPlan())
    assert plan.prefill_instance == want and plan.role_changes == changes


def test_algorithm_1_without_flips_is_minimal_load():
    specs = [(P, [BIG], [], 0), (D, [], [9000], FAST), (D, [], LIGHT, FAST)]
    plan = arrow(flips=False).plan_arrival(view_of(specs), request(), ArrivalPlan())
    assert plan.prefill_instance == 0 and plan.role_changes == ()


# Algorithm 2: (instances, prefill instance, expected decode choice)
ALG2 = [
    ("the prefill instance is now decode-side: no transfer",
     [(P, [], [], 0), (D, [200], [], FAST), (D, [], [], FAST)], 1, 1),
    ("least running tokens in D",
     [(P, [], [], 0), (D, [], [5000], FAST), (D, [], LIGHT, FAST)], 0, 2),
    ("D too slow: P->D",
     [(P, [], [], 0), (D, [], LIGHT, 0.2), (D, [100], [5000], FAST)], 0, 2),
    ("neither accepts: flip the D->P instance back first",
     [(P, [], [], 0), (P, [], LIGHT, FAST), (D, [], LIGHT, 0.2)], 0, DecodeChoice(1, (ChangeRole(1, D),))),
    ("neither accepts: flip the least-delay P",
     [(P, [5000], [], 0), (P, [100], [], 0), (D, [], LIGHT, 0.2)], 0, DecodeChoice(1, (ChangeRole(1, D),))),
    ("guard: the last prefill instance is never lent; less loaded of t1, t2",
     [(P, [], [], 0), (D, [], [9000], 0.2), (D, [50], LIGHT, 0.2)], 0, 2),
]


@pytest.mark.parametrize("name,specs,src,want", ALG2, ids=[c[0] for c in ALG2])
def test_algorithm_2(name, specs, src, want):
    assert arrow().choose_decode(view_of(specs), request(prefill_instance=src)) == want


def test_monitor_flips_towards_decode_after_a_slow_window():
    a = arrow(monitor_interval_s=1.0, monitor_window_s=3.0)
    specs = [(P, [500], [], 0), (P, [100], [], 0), (D, [], LIGHT, 0.2)]
    decisions = [a.tick(view_of(specs, t)) for t in (1.0, 2.0, 3.0, 4.0)]
    assert decisions[:3] == [[], [], []]  # the window is not full before 3 s of samples
    assert decisions[3] == [ChangeRole(1, D)]  # the least-delay prefill instance
    assert a.tick(view_of(specs, 5.0)) == []  # the history restarts after a flip


def test_monitor_lends_an_idle_prefill_instance_only_while_decode_is_busy():
    busy = [(P, [500], [], 0), (P, [], [], 0), (D, [], LIGHT, 0.08)]
    assert arrow().tick(view_of(busy)) == [ChangeRole(1, D)]
    calm = [(P, [500], [], 0), (P, [], [], 0), (D, [], LIGHT, FAST)]
    assert arrow().tick(view_of(calm)) == []
    alone = [(P, [], [], 0), (D, [], LIGHT, 0.2), (D, [], LIGHT, 0.2)]
    assert arrow().tick(view_of(alone)) == []  # the last prefill instance stays
    assert arrow(flips=False).tick_interval_s is None


def test_named_policies_and_the_slo_from_the_run():
    ctx = PolicyContext(np.random.default_rng(0), PERF, ttft_slo_s=1.5, tpot_slo_s=0.05)
    stage = build_scheduler("arrow", ctx).stages[0]
    assert (stage.ttft_slo_s, stage.tpot_slo_s, stage.flips) == (1.5, 0.05, True)
    assert build_scheduler("arrow-static", ctx).stages[0].flips is False
    assert build_scheduler("arrow", ctx).needs_bookings


@pytest.mark.parametrize("own_slo_s,want,changes", [(None, 0, ()), (0.2, 2, (ChangeRole(2, P),))])
def test_a_request_is_judged_by_its_own_ttft_slo(own_slo_s, want, changes):
    # P0's queue meets the run's 3 s but not a 0.2 s interactive request's: that one flips a D
    specs = [(P, [20_000], [], 0), (D, [], [9000], FAST), (D, [], LIGHT, FAST)]
    st = RequestState(Request(1, 0.0, 1000, 10, ttft_slo_s=own_slo_s))
    plan = arrow().plan_arrival(view_of(specs), st, ArrivalPlan())
    assert (plan.prefill_instance, plan.role_changes) == (want, changes)


@pytest.mark.parametrize("own_slo_s,want", [(None, 2), (0.03, DecodeChoice(0, (ChangeRole(0, D),)))])
def test_a_request_is_judged_by_its_own_tpot_slo(own_slo_s, want):
    # the least-loaded decode instance runs at 50 ms a token: within 100 ms, not within 30 ms
    specs = [(P, [], [], 0), (P, [], [], 0), (D, [], LIGHT, 0.05), (D, [], [9000], 0.02)]
    st = request(prefill_instance=0)
    st.request = Request(1, 0.0, 1000, 10, tpot_slo_s=own_slo_s)
    assert arrow().choose_decode(view_of(specs), st) == want
