"""Flow control (``core.flow_control``), table-driven on small hand-built views: band order,
fairness across tenants (VTC and round-robin), FCFS and EDF, the room the cluster has,
shedding by time to live and by a full queue."""

from __future__ import annotations

import pytest

from baton.core.flow_control import FlowControl, FlowControlSettings
from baton.core.info import InfoModel, ViewMode
from baton.core.instance import InstanceState, Role
from baton.core.request import Request, RequestState
from baton.core.view import ClusterView


def view(queued_tokens: int = 0) -> ClusterView:
    """One prefill instance with ``queued_tokens`` of prompts queued, one idle decode instance."""
    p, d = InstanceState(0, Role.PREFILL, 1000, 16), InstanceState(1, Role.DECODE, 1000, 16)
    if queued_tokens:
        p.queue_prefill(999, queued_tokens)
    return ClusterView({0: p, 1: d}, {}, InfoModel(ViewMode.EXACT))


def req(rid, t=0.0, prompt=100, priority=0, tenant="", ttft=None) -> RequestState:
    return RequestState(Request(rid, t, prompt, 10, priority=priority, tenant=tenant, ttft_slo_s=ttft))


def order(settings, requests, room_tokens=10**9, ttft_slo_s=2.0):
    fc = FlowControl(settings)
    for st in requests:
        assert fc.offer(st, st.request.arrival_s, ttft_slo_s) == []
    v = view(max(0, settings.max_queued_prefill_tokens - room_tokens))
    return [st.req_id for st in fc.ready(v)]


BIG = FlowControlSettings(enabled=True, max_queued_prefill_tokens=10**6)


@pytest.mark.parametrize("settings,requests,want", [
    # higher band first, FCFS inside it
    (BIG, [req(1, 0.0), req(2, 0.1, priority=1), req(3, 0.2), req(4, 0.3, priority=1)], [2, 4, 1, 3]),
    # EDF: an earlier deadline (arrival + own TTFT SLO) first, whatever the arrival
    (FlowControlSettings(enabled=True, ordering="edf", fairness="none", max_queued_prefill_tokens=10**6),
     [req(1, 0.0, ttft=30.0), req(2, 0.5, ttft=1.0), req(3, 1.0)], [2, 3, 1]),
    # VTC: the tenant served fewer tokens goes next (a's big prompt charges it)
    (BIG, [req(1, 0.0, 5000, tenant="a"), req(2, 0.1, 100, tenant="a"), req(3, 0.2, 100, tenant="b"),
           req(4, 0.3, 100, tenant="b")], [1, 3, 4, 2]),
    # round-robin: tenants in turn, whatever the tokens
    (FlowControlSettings(enabled=True, fairness="round-robin", max_queued_prefill_tokens=10**6),
     [req(1, 0.0, 5000, tenant="a"), req(2, 0.1, 100, tenant="a"), req(3, 0.2, 100, tenant="b"),
      req(4, 0.3, 100, tenant="b")], [1, 3, 2, 4]),
    # weights: b weighs 4, so it is charged a quarter
    (FlowControlSettings(enabled=True, tenant_weights={"b": 4.0}, max_queued_prefill_tokens=10**6),
     [req(1, 0.0, 400, tenant="a"), req(2, 0.1, 400, tenant="a"), req(3, 0.2, 400, tenant="b"),
      req(4, 0.3, 400, tenant="b"), req(5, 0.4, 400, tenant="b")], [1, 3, 4, 5, 2]),
])
def test_dispatch_order(settings, requests, want):
    assert order(settings, requests) == want


def test_the_room_bounds_what_leaves_and_a_full_queue_holds_everything():
    settings = FlowControlSettings(enabled=True, max_queued_prefill_tokens=1000)
    requests = [req(i, i * 0.1, 300) for i in range(5)]
    assert order(settings, requests, room_tokens=700) == [0, 1, 2]  # 700 tokens of room: a third fits
    assert order(settings, requests, room_tokens=0) == []


@pytest.mark.parametrize("used_blocks,room", [(400, True), (600, False)])
def test_kv_saturation_holds_everything(used_blocks, room):
    fc = FlowControl(FlowControlSettings(enabled=True, max_kv_usage=0.5))
    fc.offer(req(1), 0.0, 2.0)
    v = view()
    v.instance(1).kv_blocks_used = used_blocks  # of 1,000: above half is saturated
    v.instance(1).touch()
    assert (fc.room_tokens(v) > 0) is room and [s.req_id for s in fc.ready(v)] == ([1] if room else [])


def test_ttl_and_queue_cap_shed_lowest_band_newest_first():
    fc = FlowControl(FlowControlSettings(enabled=True, ttl_s=5.0, max_queued=2))
    assert fc.offer(req(1, 0.0, priority=1), 0.0, 2.0) == []
    assert fc.offer(req(2, 1.0), 1.0, 2.0) == []
    shed = fc.offer(req(3, 2.0), 2.0, 2.0)  # full: band 0's newest goes
    assert [s.req_id for s in shed] == [3] and fc.held == 2
    assert [s.req_id for s in fc.expired(5.5)] == [1]  # held 5.5 s > 5 s
    assert [s.req_id for s in fc.expired(6.5)] == [2] and fc.held == 0


def test_a_late_tenant_starts_level_with_the_least_served():
    fc = FlowControl(BIG)
    for i in range(3):
        fc.offer(req(i, i, 1000, tenant="a"), i, 2.0)
    assert [s.req_id for s in fc.ready(view())] == [0, 1, 2]
    fc.offer(req(10, 5.0, 100, tenant="b"), 5.0, 2.0)
    fc.offer(req(11, 5.1, 100, tenant="a"), 5.1, 2.0)
    # b starts at a's count (3,000), not 0: it does not take the next thousands of tokens alone
    assert [s.req_id for s in fc.ready(view())] == [10, 11]
