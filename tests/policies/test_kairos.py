"""Kairos on hand-built views: the chunk search (including no feasible chunk), the alpha
condition, the proactive re-plan, and the static deflection rules."""

import numpy as np
import pytest

from baton.core import ClusterView, InstanceState, Request, RequestState, Role
from baton.core.decisions import ArrivalPlan, Deflect
from baton.perf import BatchShape
from baton.perf.fitted import FittedModel
from baton.policies import PolicyContext, build_scheduler
from baton.policies.kairos import Kairos

P, D = Role.PREFILL, Role.DECODE
# 5 ms + 10 us per prefill token + 0.5 ms per decode + 0.1 us per context token
PERF = FittedModel(np.array([5e-3, 10e-6, 0.0, 5e-4, 1e-7, 0.0]), kv_bytes_per_token=100_000,
                   kv_capacity_tokens=1_000_000)


def view_of(specs, requests=()):
    """specs: (role, queued prompt lengths, decode contexts) per instance."""
    instances, states = {}, {}
    for i, (role, queued, ctxs) in enumerate(specs):
        inst = InstanceState(i, role, kv_blocks_total=100_000, block_size_tokens=16)
        for j, q in enumerate(queued):
            rid = 100 * i + j
            inst.queue_prefill(rid, q)
            states[rid] = RequestState(Request(rid, 0.0, q, 10), prefill_instance=i)
        for j, c in enumerate(ctxs):
            inst.decodes.add(1000 * i + j, c, 1, 10_000, j, -(-c // 16))
        instances[i] = inst
    return ClusterView(instances, states)


def kairos(**kw):
    return Kairos(PolicyContext(np.random.default_rng(0), PERF, ttft_slo_s=2.0, tpot_slo_s=0.05), **kw)


def request(prompt):
    return RequestState(Request(1, 0.0, prompt, 10))


CHUNKS = [
    # decode contexts on the instance, expected X* (largest chunk within the 50 ms TBT SLO)
    ("idle instance: 5 ms + 10 us x 4500 = 50 ms", [], 4500),
    ("ten decodes of 10k: 5 + 5 + 10 ms leave 30 ms = 3000 tokens", [10_000] * 10, 3000),
    ("decodes alone break the SLO: no feasible chunk", [100_000] * 60, 0),
]


@pytest.mark.parametrize("name,ctxs,want", CHUNKS, ids=[c[0] for c in CHUNKS])
def test_chunk_search(name, ctxs, want):
    k = kairos(max_chunk_tokens=8192)
    x, it = k.chunk_for(view_of([(P, [], []), (D, [], ctxs)]), 1)
    if want == 0:
        assert (x, it) == (0, float("inf"))
        return
    assert abs(x - want) <= 1 and it <= 0.05 + 1e-12
    assert PERF.iteration_time_s(BatchShape(x + 2, 0, len(ctxs), sum(ctxs))) > 0.05  # largest
    assert k.chunk_for(view_of([(P, [], []), (D, [], ctxs)]), 1)[0] == x


def test_the_chunk_is_capped_by_the_engine_budget():
    assert kairos(max_chunk_tokens=2048).chunk_for(view_of([(P, [], []), (D, [], [])]), 1)[0] == 2048


BUSY = [10_000] * 20  # 5 + 10 + 20 ms of decodes: X* = 1,500 tokens at 50 ms per iteration
ALPHA = [
    # prefill queue, decode contexts, alpha, prompt, deflected?
    ("idle decode instance: no transfer, one chunk, faster than PD", [], [], 1.0, 2000, True),
    ("busy decode instance: three chunks, slower than PD", [], BUSY, 1.0, 4000, False),
    ("long prefill queue: the busy decode instance is faster", [60_000], BUSY, 1.0, 4000, True),
    ("decode path 150 ms against PD 92 ms: within alpha = 2", [1000], BUSY, 2.0, 4000, True),
    ("same, alpha = 1", [1000], BUSY, 1.0, 4000, False),
    ("decode path beyond the TTFT SLO", [400_000], BUSY, 1.0, 90_000, False),
]


@pytest.mark.parametrize("name,queue,ctxs,alpha,prompt,deflected", ALPHA, ids=[c[0] for c in ALPHA])
def test_the_alpha_condition(name, queue, ctxs, alpha, prompt, deflected):
    view = view_of([(P, queue, []), (D, [], ctxs)])
    plan = kairos(alpha=alpha, max_chunk_tokens=2048).plan_arrival(view, request(prompt), ArrivalPlan())
    if deflected:
        assert (plan.prefill_instance, plan.decode_instance) == (1, 1)
        assert plan.prefill_chunk_limit_tokens == (2048 if not ctxs else pytest.approx(1500, abs=1))
    else:
        assert (plan.prefill_instance, plan.decode_instance, plan.prefill_chunk_limit_tokens) == (0, None, None)


def test_the_least_ttft_decode_instance_wins_counting_work_deflected_there():
    view = view_of([(P, [60_000], []), (D, [8000], []), (D, [], [5000] * 4)])  # 4 chunks vs 1
    plan = kairos(max_chunk_tokens=2048).plan_arrival(view, request(2000), ArrivalPlan())
    assert plan.prefill_instance == 2  # instance 1 is idle but has 8,000 deflected tokens queued


def test_proactive_replan_moves_waiting_prefills_in_queue_order():
    """Six 2,000-token prompts queued on the prefill instance (25 ms each, 16 ms transfer);
    the busy decode instance prefills one in two 50 ms iterations. The k-th waits 25k ms:
    the fourth is the first worth moving (116 > 100 ms); the fifth and sixth then see the
    fourth's tokens queued on the decode side (150 ms against 116 and 141 ms) and stay."""
    view = view_of([(P, [2000] * 6, []), (D, [], BUSY)])
    decisions = kairos(max_chunk_tokens=2048).tick(view)
    assert [(d.req_id, d.instance) for d in decisions] == [(3, 1)]
    assert all(d.chunk_limit_tokens == pytest.approx(1500, abs=1) for d in decisions)
    view.request(3).chunk_limit_tokens = 1500  # marked deflected: never re-planned, but still ahead
    assert [d.req_id for d in kairos(max_chunk_tokens=2048).tick(view)] == [4]
    assert kairos(proactive=False).tick_interval_s is None


RULES = [
    ("deflect-short", [(P, [], []), (D, [], [])], 300, 1),
    ("deflect-short", [(P, [], []), (D, [], [])], 3000, 0),
    ("deflect-queue", [(P, [9000], []), (D, [], [])], 3000, 1),
    ("deflect-queue", [(P, [100], []), (D, [], [])], 3000, 0),
]


@pytest.mark.parametrize("name,specs,prompt,want", RULES)
def test_static_rules(name, specs, prompt, want):
    sched = build_scheduler(name, PolicyContext(np.random.default_rng(0), PERF))
    plan = sched.plan_arrival(view_of(specs), request(prompt))
    assert plan.prefill_instance == want
    assert (plan.prefill_chunk_limit_tokens is not None) == (want == 1)


def test_deflected_work_follows_the_batch_it_shares():
    view = view_of([(P, [], []), (D, [3000], BUSY)])
    view.request(100).chunk_limit_tokens = 2048  # deflected while the instance was idle
    assert kairos(max_chunk_tokens=2048).tick(view) == [Deflect(100, 1, pytest.approx(1500, abs=1))]
    view.request(100).chunk_limit_tokens = kairos(max_chunk_tokens=2048).chunk_for(view, 1)[0]
    assert kairos(max_chunk_tokens=2048).tick(view) == []  # already fitted


def test_live_kairos_makes_no_re_fits_the_engine_cannot_apply():
    view = view_of([(P, [], []), (D, [3000], BUSY)])
    view.request(100).chunk_limit_tokens = 2048
    assert kairos(max_chunk_tokens=2048, fixed_chunk=True).tick(view) == []


@pytest.mark.parametrize("link_gbps, want_s", [(100.0, 8e-3), (10.0, 80e-3)])
def test_the_pd_paths_transfer_is_timed_over_the_prefill_instances_link(link_gbps, want_s):
    """1,000 prompt tokens x 100 kB = 100 MB of KV: 8 ms at 100 Gb/s, 80 ms at 10 (the
    runtime's link, not a guess of the policy's)."""
    view = view_of([(P, [], []), (D, [], [])])
    view.instance(0).link_bytes_per_s = link_gbps * 1e9 / 8
    assert kairos().transfer_s(view, 1000, 0) == pytest.approx(want_s)


@pytest.mark.parametrize("own_slo_s,want", [(None, True), (3.0, True), (0.5, False)])
def test_deflection_keeps_a_requests_own_ttft_slo(own_slo_s, want):
    # the decode path (1.0 s) beats the prefill path (5.0 s) and the run's 2 s SLO; a request
    # whose own SLO is 0.5 s is not deflected to miss it
    st = RequestState(Request(1, 0.0, 1000, 10, ttft_slo_s=own_slo_s))
    assert kairos().qualifies(1.0, 5.0, st) is want


@pytest.mark.parametrize("decodes,ctx,prompt", [(0, 0, 0), (8, 8000, 0), (40, 60000, 3000), (200, 400000, 0),
                                                (120, 150000, 12000)])
def test_the_warm_started_search_finds_what_the_bracketed_one_finds(decodes, ctx, prompt):
    """The chunk search from the last answer (a warm start) gives the same X* and iteration
    time as the search over the whole range, from any starting point."""
    from baton.perf.model import prefill_shape
    k = kairos()

    def iteration(x):
        return PERF.iteration_time_s(prefill_shape(x, max(0, prompt - x), decodes, ctx))
    want = k._bracketed(iteration)
    for start in (k.min_chunk, k.min_chunk + 1, 100, 511, 1024, k.max_chunk - 1, k.max_chunk):
        assert k._near(iteration, start) == want, start


JUMPS = [  # where the iteration time jumps (a roofline corner, a model's step), its size (s)
    ("no jump: crossing at 1,000", None, 0.0),
    ("a jump across the SLO just past the crossing", 990, 0.02),
    ("a jump well before the crossing", 400, 0.005),
    ("a jump at the bracket's far end", 2000, 0.05),
]


@pytest.mark.parametrize("name,at,size", JUMPS, ids=[j[0] for j in JUMPS])
def test_the_chunk_search_finds_the_largest_fitting_chunk_in_few_probes(name, at, size):
    """From any start and any slope the last search learned, the search finds what trying
    every chunk finds; where the time jumps, the interpolation's misses fall back to
    halving, so no search takes more than 24 probes (20 today; the interpolation alone took
    29 on the jump beside the SLO)."""
    k = kairos(max_chunk_tokens=2048)
    slo = k.tbt_slo_s

    def time_s(x):
        return 0.01 + slo * 0.8 * x / 1000 + (size if at is not None and x > at else 0.0)
    fitting = [x for x in range(k.min_chunk, k.max_chunk + 1) if time_s(x) <= slo]
    want = (fitting[-1], time_s(fitting[-1])) if fitting else (0, float("inf"))
    probes = []

    def iteration(x):
        probes.append(x)
        return time_s(x)
    for slope_s in (None, 1e-7, slo * 0.8 / 1000, 1e-3):
        for start in (k.min_chunk, 100, 989, 990, 991, 1000, 1500, k.max_chunk):
            k._slope_s = slope_s
            probes.clear()
            assert k._near(iteration, start) == want, (slope_s, start)
            assert len(probes) <= 24, (slope_s, start, probes)
