"""Prefills the gateway holds back while their engine reports waiting requests.

A request sent to an engine is out of a router's hands: vLLM queues it, and nothing moves
it. So when the policy re-plans queued prefills (Kairos's proactive deflection), the
gateway keeps PD prefill legs in its own per-instance queue, in arrival order, while the
prefill engine's last scrape shows ``num_requests_waiting > 0`` or ``limit`` prefill legs
are already in flight there (``prefill_inflight_limit``, default 2: without it a scrape
that shows an empty queue would release every held request at once and the engine's queue
would hold them again). A finished leg or a new scrape lets the oldest go; an unhealthy
engine releases them all. A ``Deflect`` for a held request resolves it with the new plan,
and the flow sends one colocated leg to the decode instance instead. A leg already sent is
never aborted, and a ``Deflect`` for it is ignored.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from baton.core.decisions import Deflect

if TYPE_CHECKING:
    from baton.gateway.live import LiveCluster


class PrefillHold:
    """Per-instance held prefills (request id -> the future its flow awaits)."""

    def __init__(self, cluster: "LiveCluster", enabled: bool, limit: int = 2) -> None:
        self.cluster, self.enabled, self.limit = cluster, enabled, limit
        self.waiting: dict[int, dict[int, asyncio.Future]] = {}
        self.in_flight: dict[int, int] = {}
        self.last_done_s: dict[int, float] = {}  # gateway clock: a leg there ended

    def busy(self, instance_id: int) -> bool:
        """Whether new prefills for the instance wait at the gateway now."""
        eng, inst = self.cluster.engines[instance_id], self.cluster.instances[instance_id]
        if not self.enabled or not inst.healthy or eng.removed:
            return False
        # a scrape older than a leg that ended since is stale: its queue has moved
        fresh = eng.sample is not None and eng.sample.at_s >= self.last_done_s.get(instance_id, float("-inf"))
        queued = fresh and (eng.sample.waiting or 0) > 0
        return queued or self.in_flight.get(instance_id, 0) >= self.limit

    async def admit(self, instance_id: int, req_id: int) -> Deflect | None:
        """Wait until the prefill may be sent (None: call ``sent_done`` when its leg
        ends) or is re-planned (the ``Deflect``)."""
        plan = await self._wait(instance_id, req_id)
        if plan is None and self.enabled:
            self.in_flight[instance_id] = self.in_flight.get(instance_id, 0) + 1
        return plan

    def sent_done(self, instance_id: int) -> None:
        """A prefill leg let through by ``admit`` ended (either way): the next may go."""
        if self.enabled and self.in_flight.get(instance_id, 0) > 0:
            self.in_flight[instance_id] -= 1
            self.last_done_s[instance_id] = self.cluster.clock()
            self.scraped(instance_id)

    async def _wait(self, instance_id: int, req_id: int) -> Deflect | None:
        while self.busy(instance_id):
            fut = asyncio.get_running_loop().create_future()
            self.waiting.setdefault(instance_id, {})[req_id] = fut
            try:
                plan = await fut
            finally:
                self.waiting.get(instance_id, {}).pop(req_id, None)
            if plan is not None:
                return plan
        return None

    def scraped(self, instance_id: int) -> None:
        """The engine's state changed: held flows check again."""
        for fut in list(self.waiting.get(instance_id, {}).values()):
            if not fut.done():
                fut.set_result(None)

    def deflect(self, decision: Deflect) -> bool:
        """Hand a re-plan to the flow holding that request; False if none holds it."""
        for held in self.waiting.values():
            fut = held.get(decision.req_id)
            if fut is not None and not fut.done():
                fut.set_result(decision)
                return True
        return False

    def held(self, instance_id: int) -> int:
        return len(self.waiting.get(instance_id, {}))

    def held_total(self) -> dict[str, int]:
        """Prefills waiting at the gateway and legs let through and not yet ended (zero
        when the gateway is idle)."""
        return {"held": sum(len(w) for w in self.waiting.values()), "sent": sum(self.in_flight.values())}
