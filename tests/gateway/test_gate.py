"""The live flow-control gate (``gateway.gate``) on a real LiveCluster, without HTTP:
requests wait while the prefill instance's booked queue is full and leave placed, in band
order, as it drains; a full queue sheds the lowest band's newest with a 429 that carries
``Retry-After``; nothing is placed while no instance is healthy, and held requests go once
one is; a request whose flow ends while held is withdrawn."""

from __future__ import annotations

import asyncio

import pytest

from baton.core.flow_control import FlowControlSettings
from baton.core.request import Request, RequestState
from baton.gateway.config import parse_engine
from baton.gateway.gate import LiveGate
from baton.gateway.live import LiveCluster
from baton.protocol.errors import ApiError

NOW = [0.0]


def cluster() -> LiveCluster:
    c = LiveCluster(lambda: NOW[0], 1000, 16, 1.0)
    for i, role in enumerate(("prefill", "decode")):
        c.add_engine(parse_engine({"name": f"e{i}", "url": f"http://127.0.0.1:{9000 + i}", "role": role}, "e"))
    return c


def gate(c: LiveCluster, placed: list[int], shed: list[int], **flow) -> LiveGate:
    settings = FlowControlSettings(enabled=True, max_queued_prefill_tokens=1000, fairness="none", **flow)

    def place(st: RequestState) -> int:
        c.bind(st, 0, 1, None)  # its prompt is booked on the prefill instance at once
        placed.append(st.req_id)
        return st.req_id
    return LiveGate(settings, lambda: (c.now(), c.view)[1], 2.0, place, lambda st: shed.append(st.req_id))


def state(rid: int, prompt: int, priority: int = 0) -> RequestState:
    return RequestState(Request(rid, NOW[0], prompt, 10, priority=priority))


def test_held_while_the_queue_is_full_then_placed_in_band_order():
    async def run():
        c, placed, shed = cluster(), [], []
        g = gate(c, placed, shed, max_queued=3)
        big = state(0, 1200)
        first = asyncio.ensure_future(g.enter(big))  # room 1000: it goes, and fills it
        await asyncio.sleep(0)
        assert first.result() == 0
        waiting = [asyncio.ensure_future(g.enter(state(rid, 300, pri))) for rid, pri in
                   ((1, 0), (2, 1), (3, 0), (4, 0))]  # the fourth held overflows max_queued
        await asyncio.sleep(0)
        assert placed == [0] and shed == [4] and g.control.held == 3
        with pytest.raises(ApiError) as err:
            await waiting[3]
        assert err.value.status == 429 and err.value.headers() == {"Retry-After": "1"}
        c.prefill_done(big)  # its prompt leaves the queue: room for 1000 tokens again
        g.poke()
        assert [await w for w in waiting[:3]] == [1, 2, 3] and placed == [0, 2, 1, 3]  # band 1 first
        g.close()
    asyncio.run(run())


def test_nothing_placed_while_no_instance_is_healthy():
    async def run():
        c, placed, shed = cluster(), [], []
        g = gate(c, placed, shed)
        c.set_health(0, False)
        held = asyncio.ensure_future(g.enter(state(0, 100)))
        await asyncio.sleep(0.12)  # two polls
        assert placed == [] and not held.done()
        c.set_health(0, True)
        assert await asyncio.wait_for(held, 1.0) == 0  # the next poll places it
        g.close()
    asyncio.run(run())


def test_a_request_that_ends_while_held_is_withdrawn():
    async def run():
        c, placed, shed = cluster(), [], []
        g = gate(c, placed, shed)
        await g.enter(state(0, 1200))
        gone = state(1, 100)
        held = asyncio.ensure_future(g.enter(gone))
        await asyncio.sleep(0)
        g.completed(gone)  # its flow ended (a relay's client left): out of the queue
        with pytest.raises(asyncio.CancelledError):
            await held
        assert g.control.held == 0 and shed == []
        g.close()
    asyncio.run(run())
