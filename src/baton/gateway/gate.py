"""Flow control live (``core.flow_control``, config key ``flow_control``): a placement waits
here while the cluster is saturated and is made when it has room, in band order, fairly
across tenants; one held past ``ttl_s`` or pushed out of a full queue is refused with 429
and ``Retry-After``, one whose client leaves is withdrawn.

The same ``FlowControl`` decides as in the simulator (``sim.gate``), on the gateway's own
bookings (prompt tokens queued per instance) and its scraped KV usage. A request leaves
the queue placed: ``place`` runs as it is released, so the next release already sees its
booking. The gate looks again whenever room may have freed: an arrival, a prefill done, a
request's end, a scrape; and every ``POLL_S`` while anything is held (a time to live, an
instance that became healthy). Requests wait here even while no instance is ready at all,
for at most ``ttl_s``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from baton.core.decisions import ArrivalPlan
from baton.core.flow_control import FlowControl, FlowControlSettings
from baton.core.request import RequestState
from baton.core.view import ClusterView
from baton.protocol.errors import ApiError

POLL_S = 0.05


class LiveGate:
    """Held placements and their futures (see the module docstring)."""

    def __init__(self, settings: FlowControlSettings, view: Callable[[], ClusterView], ttft_slo_s: float,
                 place: Callable[[RequestState], ArrivalPlan], on_shed: Callable[[RequestState], None]) -> None:
        self.settings, self.view, self.ttft_slo_s = settings, view, ttft_slo_s
        self.place, self.on_shed = place, on_shed
        self.control = FlowControl(settings)
        self.waiting: dict[int, tuple[asyncio.Future, Callable[[RequestState], Any]]] = {}
        self._soon: asyncio.Handle | None = None
        self._poll: asyncio.TimerHandle | None = None

    @property
    def enabled(self) -> bool:
        return self.settings.enabled

    async def enter(self, st: RequestState, place: Callable[[RequestState], Any] | None = None) -> Any:
        """``st`` placed by ``place`` (default: the gate's) once flow control lets it go: what
        ``place`` returned; ApiError 429 if it is shed (or the placement's own error)."""
        fut = asyncio.get_running_loop().create_future()
        self.waiting[st.req_id] = (fut, place or self.place)
        try:
            for out in self.control.offer(st, self.view().now_s, self.ttft_slo_s):
                self._shed(out, "the flow-control queue is full")
            self.pump()
            return await fut
        except asyncio.CancelledError:
            self.control.withdraw(st)  # its client left while it was held
            raise
        finally:
            self.waiting.pop(st.req_id, None)

    def poke(self) -> None:
        """Room may have freed: look again once the current step is over (never inside a
        booking being changed)."""
        if self.control.held and self._soon is None:
            self._soon = asyncio.get_running_loop().call_soon(self.pump)

    def pump(self) -> None:
        """Shed what expired, then place what the cluster has room for now."""
        self._soon = None
        view = self.view()
        for out in self.control.expired(view.now_s):
            self._shed(out, f"held longer than the flow-control time to live ({self.settings.ttl_s:g} s)")
        for st in self.control.ready(view):
            fut, place = self.waiting.get(st.req_id, (None, None))
            if fut is None or fut.done():
                continue
            try:
                fut.set_result(place(st))
            except Exception as err:  # noqa: BLE001 - the request's own flow answers it, the rest go on
                fut.set_exception(err)
        self._schedule()

    def _schedule(self) -> None:
        if self._poll is not None:
            self._poll.cancel()
            self._poll = None
        if self.control.held:
            self._poll = asyncio.get_running_loop().call_later(POLL_S, self.pump)

    def _shed(self, st: RequestState, why: str) -> None:
        self.on_shed(st)
        fut, _ = self.waiting.get(st.req_id, (None, None))
        if fut is not None and not fut.done():
            fut.set_exception(ApiError(429, f"request shed by flow control: {why}; retry later",
                                       err_type="rate_limit_exceeded", code="shed",
                                       retry_after_s=self.settings.retry_after_s))

    def completed(self, st: RequestState) -> None:
        """A request that went through the gate ended: its tenant is charged its output (one
        still held, whose client left, is withdrawn first)."""
        fut, _ = self.waiting.pop(st.req_id, (None, None))
        if fut is not None:
            self.control.withdraw(st)
            fut.cancel()
        self.control.completed(st)
        self.poke()

    def close(self) -> None:
        for handle in (self._soon, self._poll):
            if handle is not None:
                handle.cancel()


class Admission:
    """What one gateway process does about request classes: classing requests
    (``gateway.classes``), flow control (``LiveGate``) and the by-class figures."""

    def __init__(self, config, metrics, view: Callable[[], ClusterView],
                 place: Callable[[RequestState], ArrivalPlan]) -> None:
        from baton.gateway.class_metrics import ClassMetrics, HeldGauge
        from baton.gateway.classes import Classes
        from baton.metrics.summary import SLO
        self.classes = Classes(config.classes)
        self.by_class = ClassMetrics(metrics.registry, self.classes, config.ttft_slo_s, config.tpot_slo_s,
                                     metrics.slo.ttft_s)
        edf_default_s = config.ttft_slo_s or SLO().ttft_s  # EDF's deadline for a request without a TTFT SLO

        def shed(st: RequestState) -> None:
            metrics.rejected.labels("shed").inc()
            self.by_class.shed_one(st)
        self.gate = LiveGate(config.flow_control, view, edf_default_s, place, shed)
        if self.gate.enabled:
            metrics.registry.register(HeldGauge(self.gate, self.classes))

    async def place(self, st: RequestState, place: Callable[[RequestState], Any] | None = None) -> Any:
        """``st`` placed by ``place`` (default: plan and book it), through flow control
        where it is on: what ``place`` returned."""
        place = place or self.gate.place
        return await self.gate.enter(st, place) if self.gate.enabled else place(st)

    def room_changed(self) -> None:
        if self.gate.enabled:
            self.gate.poke()

    def ended(self, st: RequestState) -> None:
        if self.gate.enabled:
            self.gate.completed(st)
