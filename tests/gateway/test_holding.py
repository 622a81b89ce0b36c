"""The gateway's held prefills (Kairos live) on a real LiveCluster, without HTTP: legs go
in order under the in-flight limit, a stale scrape does not hold them after a leg ended,
a removed engine releases its held flows, and a Deflect reaches only a held request."""

import asyncio

from baton.core.decisions import Deflect
from baton.gateway.config import parse_engine
from baton.gateway.holding import PrefillHold
from baton.gateway.live import LiveCluster, ScrapeSample

NOW = [0.0]


def cluster():
    c = LiveCluster(lambda: NOW[0], 1000, 16, 1.0)
    for i, role in enumerate(("prefill", "decode")):
        c.add_engine(parse_engine({"name": f"e{i}", "url": f"http://127.0.0.1:{9000 + i}", "role": role}, "e"))
    return c


def scrape(c, waiting, at_s):
    c.engines[0].sample = ScrapeSample(at_s, 1, waiting, 0.1, 0)


def test_limit_order_staleness_removal_and_deflect():
    async def run():
        c = cluster()
        hold = PrefillHold(c, enabled=True, limit=1)
        assert await hold.admit(0, 1) is None  # nothing in flight, no scrape: goes
        second = asyncio.ensure_future(hold.admit(0, 2))
        third = asyncio.ensure_future(hold.admit(0, 3))
        await asyncio.sleep(0)
        assert hold.held(0) == 2 and not second.done()
        assert hold.deflect(Deflect(9, 1, 512)) is False  # not held here: ignored
        scrape(c, waiting=4, at_s=0.5)
        NOW[0] = 1.0
        hold.sent_done(0)  # the first leg ended after that scrape: its "4 waiting" is stale
        await asyncio.sleep(0)
        assert second.done() and second.result() is None and not third.done()  # in order, one slot
        assert hold.deflect(Deflect(3, 1, 512)) is True
        await asyncio.sleep(0)
        assert third.result() == Deflect(3, 1, 512) and hold.held(0) == 0
        fourth = asyncio.ensure_future(hold.admit(0, 4))  # the second leg is still out
        await asyncio.sleep(0)
        assert not fourth.done()
        c.remove_engine(0)
        hold.scraped(0)
        await asyncio.sleep(0)
        assert fourth.done() and fourth.result() is None  # released (the flow then falls back)
        assert PrefillHold(c, enabled=False).busy(0) is False
    asyncio.run(run())

