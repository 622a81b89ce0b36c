"""Flow control in front of the scheduler: requests wait here, in priority bands, while the
cluster is saturated, and go to the policy in band order, fairly across tenants within a
band, first-come or earliest-deadline within a tenant; they are shed past a time to live
or when the queue is full (lowest band first). Pure and synchronous, as policies are: the
runtime calls ``offer`` on arrival, ``ready`` whenever capacity may have freed, and sheds
what ``expired`` and ``offer`` return. Times are the runtime's clock in seconds.

Saturation is read from the view: dispatch stops while every prefill-capable instance has
more than ``max_queued_prefill_tokens`` of prompts queued, or every decode-capable
instance's KV usage is above ``max_kv_usage`` (GIE's flow control holds requests on the
same kind of signal: queue depth and KV usage from the endpoints' metrics)."""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field

from baton.core.request import RequestState
from baton.core.settings import setting
from baton.core.view import ClusterView

ORDERINGS = ("fcfs", "edf")
FAIRNESS = ("round-robin", "vtc", "none")


@dataclass(frozen=True, slots=True)
class FlowControlSettings:
    """Flow control: priority bands, fairness across tenants, ordering, saturation and
    shedding (config key ``flow_control``)."""

    enabled: bool = setting(False, doc="hold requests in priority bands while the cluster is saturated")
    ordering: str = setting("fcfs", choices=ORDERINGS,
                            doc="within a tenant: first come first served, or earliest TTFT deadline first")
    fairness: str = setting("vtc", choices=FAIRNESS,
                            doc="across a band's tenants: vtc (least tokens served per weight first), "
                                "round-robin (in turn), none (one queue)")
    tenant_weights: dict[str, float] = setting(factory=dict, doc="a tenant's share of its band (default 1)")
    max_queued_prefill_tokens: int = setting(4096, gt=0, unit="tokens",
                                             doc="saturated while every prefill-capable instance has more prompt "
                                                 "tokens queued than this")
    max_kv_usage: float = setting(0.95, gt=0, le=1, doc="saturated while every decode-capable instance's KV "
                                                        "usage is above this")
    ttl_s: float | None = setting(None, gt=0, unit="s", doc="a request held longer than this is shed "
                                                            "(none: never)")
    max_queued: int = setting(100_000, gt=0, doc="requests held at most; beyond it the lowest band's newest "
                                                 "is shed")
    retry_after_s: float = setting(1.0, gt=0, unit="s", doc="live: the Retry-After a shed request's 429 carries")


@dataclass(order=True, slots=True)
class _Held:
    key: tuple[float, int]
    state: RequestState = field(compare=False)


@dataclass(slots=True)
class _Band:
    """One priority band: a queue per tenant and each tenant's tokens served."""

    queues: dict[str, list[_Held]] = field(default_factory=dict)
    served_tokens: dict[str, float] = field(default_factory=dict)
    turn: deque[str] = field(default_factory=deque)

    def __len__(self) -> int:
        return sum(len(q) for q in self.queues.values())


class FlowControl:
    """The held requests and the order they leave in (see the module docstring)."""

    def __init__(self, settings: FlowControlSettings) -> None:
        self.settings = settings
        self.bands: dict[int, _Band] = {}
        self.held = 0

    def _tenant(self, st: RequestState) -> str:
        return st.request.tenant if self.settings.fairness != "none" else ""

    def offer(self, st: RequestState, now_s: float, ttft_slo_s: float) -> list[RequestState]:
        """Hold ``st`` (its TTFT SLO, seconds, orders it under EDF); the requests shed to
        make room (possibly ``st`` itself)."""
        band = self.bands.setdefault(st.request.priority, _Band())
        tenant = self._tenant(st)
        deadline = st.request.arrival_s + (st.request.ttft_slo_s or ttft_slo_s)
        first = deadline if self.settings.ordering == "edf" else st.request.arrival_s
        if tenant not in band.queues:
            band.queues[tenant] = []
            band.turn.append(tenant)
            # a tenant arriving late starts level with the least served, not at zero
            band.served_tokens.setdefault(tenant, min(band.served_tokens.values(), default=0.0))
        heapq.heappush(band.queues[tenant], _Held((first, st.req_id), st))
        self.held += 1
        shed = []
        while self.held > self.settings.max_queued:
            shed.append(self._drop_newest_lowest())
        return shed

    def _drop_newest_lowest(self) -> RequestState:
        band = self.bands[min(p for p, b in self.bands.items() if len(b))]
        queue, newest = max(((q, h) for q in band.queues.values() for h in q),
                            key=lambda qh: (qh[1].state.request.arrival_s, qh[1].state.req_id))
        queue.remove(newest)
        heapq.heapify(queue)
        self.held -= 1
        return newest.state

    def withdraw(self, st: RequestState) -> bool:
        """Take ``st`` out of its queue (its client left while it was held); False if it is
        not held."""
        band = self.bands.get(st.request.priority)
        queue = band.queues.get(self._tenant(st)) if band is not None else None
        for k, held in enumerate(queue or ()):
            if held.state is st:
                queue[k] = queue[-1]
                queue.pop()
                heapq.heapify(queue)
                self.held -= 1
                return True
        return False

    def held_by_band(self) -> dict[int, int]:
        """Requests held now, by priority band."""
        return {p: len(b) for p, b in self.bands.items()}

    def expired(self, now_s: float) -> list[RequestState]:
        """Requests held past the time to live, now leaving as shed."""
        ttl = self.settings.ttl_s
        if ttl is None or not self.held:
            return []
        out = []
        for band in self.bands.values():
            for tenant, queue in band.queues.items():
                keep = [h for h in queue if now_s - h.state.request.arrival_s <= ttl]
                if len(keep) != len(queue):
                    out += [h.state for h in queue if now_s - h.state.request.arrival_s > ttl]
                    heapq.heapify(keep)
                    band.queues[tenant] = keep
        self.held -= len(out)
        return out

    def room_tokens(self, view: ClusterView) -> int:
        """Prompt tokens the cluster takes now before it counts as saturated (0: saturated)."""
        cap = self.settings.max_queued_prefill_tokens
        decode = view.decode_ids
        if decode and all(view.kv_usage(i) > self.settings.max_kv_usage for i in decode):
            return 0
        return sum(max(0, cap - view.instance(i).prefill_queue_tokens) for i in view.prefill_ids)

    def ready(self, view: ClusterView) -> list[RequestState]:
        """The held requests to dispatch now, in order, while the cluster has room (what
        leaves counts against the room at once: the view sees it only once placed)."""
        room, out = self.room_tokens(view) if self.held else 0, []
        while self.held and room > 0:
            st = self._next()
            out.append(st)
            room -= st.request.prompt_tokens
        return out

    def completed(self, st: RequestState) -> None:
        """``st`` finished: its tenant is charged the tokens it generated (VTC counts served
        tokens: prompts when dispatched, outputs as they are known)."""
        band = self.bands.get(st.request.priority)
        if band is not None:
            tenant = self._tenant(st)
            band.served_tokens[tenant] = band.served_tokens.get(tenant, 0.0) + st.generated_tokens

    def _next(self) -> RequestState:
        band = self.bands[max(p for p, b in self.bands.items() if len(b))]
        tenants = [t for t, q in band.queues.items() if q]
        if self.settings.fairness == "round-robin":
            while not band.queues[band.turn[0]]:
                band.turn.rotate(-1)
            tenant = band.turn[0]
            band.turn.rotate(-1)
        else:
            weights = self.settings.tenant_weights
            tenant = min(tenants, key=lambda t: (band.served_tokens.get(t, 0.0) / weights.get(t, 1.0),
                                                 band.queues[t][0].key))  # a tie: the earlier head
        held = heapq.heappop(band.queues[tenant])
        req = held.state.request  # its output is charged when known (completed)
        band.served_tokens[tenant] = band.served_tokens.get(tenant, 0.0) + req.prompt_tokens
        self.held -= 1
        return held.state
