"""The gateway's view of the cluster: its own exact in-flight accounting (it relays every
token) reconciled with engine metrics scraped at an interval.

The ``InstanceState``/``RequestState`` objects are the ones the simulator maintains, so
policies read the same ``ClusterView``. Decode rows are written per relayed token (there
is no closed-form segment in a live system).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from baton.core import bookings, lifecycle
from baton.core.info import EngineSample, InfoModel, ViewMode
from baton.core.instance import InstanceState, Role
from baton.core.request import Request, RequestState
from baton.core.view import ClusterView
from baton.gateway.config import EngineSpec
from baton.gateway.urls import endpoint_address, public_url

_RATE_SMOOTHING = 0.1  # EMA weight of each observed token gap in an instance's iteration time


@dataclass(slots=True)
class ScrapeSample:
    """Engine metrics read at ``at_s`` (gateway clock); None where the engine has no such metric."""

    at_s: float
    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None
    preemptions: float | None = None


@dataclass(slots=True)
class LiveEngine:
    """What the gateway knows about one engine besides its ``InstanceState``."""

    spec: EngineSpec
    own_blocks: int = 0
    own_blocks_at_scrape: int = 0
    sample: ScrapeSample | None = None
    failures: int = 0
    removed: bool = False
    probe_ok: bool = True   # it answers its health probes (scrapes) and legs
    ejected: bool = False   # taken out by outlier ejection (gateway.outliers), probes or not
    last_failure: str | None = None  # what its last failed scrape or leg said
    tokens_since_report: int = 0


class LiveCluster:
    """Instances, requests and the view policies read. ``clock`` returns seconds since
    the gateway started; every mutation refreshes the instance's effective KV usage."""

    def __init__(self, clock: Callable[[], float], default_kv_blocks: int, block_size: int,
                 scrape_interval_s: float = 1.0, link_gbps: float = 100.0) -> None:
        self.clock, self.link_bytes_per_s = clock, link_gbps * 1e9 / 8
        self.default_kv_blocks, self.block_size = default_kv_blocks, block_size
        self.instances: dict[int, InstanceState] = {}
        self.engines: dict[int, LiveEngine] = {}
        self.requests: dict[int, RequestState] = {}
        # what policies see is what the simulator's default gives them: engine metrics as
        # of the last scrape, the gateway's own bookings exact (baton.core.info)
        self.view = ClusterView(self.instances, self.requests, InfoModel(ViewMode.SCRAPED, scrape_interval_s))
        self._next_instance = 0
        self._next_request = 0
        self._admits = 0
        # told of every leg before it is sent (instance, request): the KV-event index
        # accepts an engine's stores only for prompts sent to it (``kv_index.expect``)
        self.on_leg: Callable[[int, RequestState], None] | None = None

    def now(self) -> float:
        """Advance the view's clock to now and return it (call before any policy hook)."""
        self.view.now_s = self.clock()
        return self.view.now_s

    # --- instances ---------------------------------------------------------------------
    def add_engine(self, spec: EngineSpec) -> int:
        iid = self._next_instance
        self._next_instance += 1
        self.instances[iid] = InstanceState(iid, spec.role, spec.kv_blocks or self.default_kv_blocks,
                                            self.block_size, link_bytes_per_s=self.link_bytes_per_s)
        self.engines[iid] = LiveEngine(spec)
        self.view.invalidate_roles()
        return iid

    def find(self, key: str) -> int | None:
        """An instance id from its name or its decimal id."""
        for iid, eng in self.engines.items():
            if not eng.removed and (eng.spec.name == key or str(iid) == key):
                return iid
        return None

    def remove_engine(self, iid: int) -> None:
        """Stop sending new work; requests already there finish where they are."""
        self.engines[iid].removed = True
        self.set_health(iid, False)

    def set_role(self, iid: int, role: Role) -> bool:
        """Change a role; True if it changed."""
        inst = self.instances[iid]
        if inst.role is role:
            return False
        inst.role = role
        self.engines[iid].spec.role = role
        self.view.invalidate_roles()
        return True

    def set_health(self, iid: int, healthy: bool) -> bool:
        """Record whether an instance answers (scrapes and legs); True if that changed
        whether it takes new work (it does when it answers, is not ejected and not removed)."""
        self.engines[iid].probe_ok = healthy
        return self._refresh_health(iid)

    def set_ejected(self, iid: int, ejected: bool) -> bool:
        """Take an instance out (outlier ejection) or bring it back; True if that changed
        whether it takes new work."""
        self.engines[iid].ejected = ejected
        return self._refresh_health(iid)

    def _refresh_health(self, iid: int) -> bool:
        eng, inst = self.engines[iid], self.instances[iid]
        healthy = eng.probe_ok and not eng.ejected and not eng.removed
        if inst.healthy is healthy:
            return False
        inst.healthy = healthy
        self.view.invalidate_roles()
        return True

    def url(self, iid: int) -> str:
        return self.engines[iid].spec.url

    def healthy(self, iid: int) -> bool:
        """Whether ``iid`` takes new work."""
        return self.instances[iid].healthy

    def role(self, iid: int) -> Role:
        return self.instances[iid].role

    def pending_tokens(self, iid: int) -> int:
        """Prefill work booked on ``iid`` before a new leg's: queued prompts and contexts
        heading there (tokens; the leg deadlines of ``gateway.engines`` read it)."""
        inst = self.instances[iid]
        return inst.prefill_queue_tokens + inst.incoming_tokens

    def token_interval_s(self, iid: int) -> float:
        """The recent gap between two relayed tokens of one stream on ``iid`` (seconds)."""
        return self.instances[iid].recent_token_interval_s

    def address(self, iid: int) -> str:
        """The engine's ``host:port``, as a data plane names endpoints (GIE's EPP protocol)."""
        return endpoint_address(self.engines[iid].spec.url)

    def by_address(self, address: str) -> int | None:
        """The engine at ``host:port`` (None if none is)."""
        return next((iid for iid, e in self.engines.items() if not e.removed and self.address(iid) == address), None)

    # --- KV accounting -----------------------------------------------------------------
    def _blocks(self, tokens: int) -> int:
        return math.ceil(tokens / self.block_size)

    def _own(self, iid: int, delta_blocks: int) -> None:
        eng = self.engines[iid]
        eng.own_blocks += delta_blocks
        self._refresh_kv(iid)

    def _refresh_kv(self, iid: int) -> None:
        """Effective blocks in use: the last scrape plus what this gateway changed since,
        never below its own count. A stale scrape therefore cannot hide requests the
        gateway has just placed (no herding onto an instance that only looked empty)."""
        eng, inst = self.engines[iid], self.instances[iid]
        own = eng.own_blocks
        if eng.sample is not None and eng.sample.kv_usage is not None:
            scraped = round(eng.sample.kv_usage * inst.kv_blocks_total)
            own = max(own, scraped + eng.own_blocks - eng.own_blocks_at_scrape)
        inst.kv_blocks_used = min(own, inst.kv_blocks_total)

    def record_scrape(self, iid: int, sample: ScrapeSample) -> None:
        eng, inst = self.engines[iid], self.instances[iid]
        eng.sample, eng.own_blocks_at_scrape = sample, eng.own_blocks
        self._refresh_kv(iid)
        # the policies' copy: the engine's own figures where it reports them, else ours
        kv = sample.kv_usage if sample.kv_usage is not None else inst.kv_usage_at(sample.at_s)
        running = sample.running if sample.running is not None else inst.decodes.n
        waiting = sample.waiting if sample.waiting is not None else len(inst.prefill_queue)
        inst.set_sample(EngineSample(sample.at_s, int(running), int(waiting), float(kv),
                                     inst.recent_token_interval_s))

    # --- requests ----------------------------------------------------------------------
    def new_request(self, prompt_tokens: int, max_tokens: int, req_id: int | None = None,
                    arrival_s: float | None = None, cls: tuple = ()) -> RequestState:
        """A request arriving now (or at ``arrival_s``, under a relay worker's ``req_id``) of
        class ``cls`` (``gateway.classes.RequestClass``: band, tenant, own SLOs; none: the
        defaults). ``output_tokens`` holds the cap (the true length is unknown live)."""
        if req_id is None:
            req_id, self._next_request = self._next_request, self._next_request + 1
        now = self.now()
        priority, tenant, ttft_slo_s, tpot_slo_s = cls or (0, "", None, None)
        state = RequestState(Request(req_id, now if arrival_s is None else arrival_s, prompt_tokens, max_tokens,
                                     priority=priority, tenant=tenant, ttft_slo_s=ttft_slo_s, tpot_slo_s=tpot_slo_s))
        self.requests[req_id] = state
        return state

    def set_prompt_tokens(self, state: RequestState, prompt_tokens: int) -> None:
        """Correct the gateway's prompt-length estimate with the engine's count."""
        if prompt_tokens != state.request.prompt_tokens:
            state.request = replace(state.request, prompt_tokens=prompt_tokens)

    def bind(self, state: RequestState, prefill: int, decode: int | None, chunk_limit: int | None) -> None:
        """Place a new request (``core.bookings.bind``) and queue its prompt on ``prefill``."""
        bookings.bind(self.instances, state, prefill, decode, chunk_limit)
        self._queue_prefill(state, prefill)

    def _queue_prefill(self, state: RequestState, prefill: int) -> None:
        if self.on_leg is not None:
            self.on_leg(prefill, state)
        tokens = state.request.prompt_tokens
        self.instances[prefill].queue_prefill(state.req_id, tokens)
        self._own(prefill, self._blocks(tokens))
        state.visit(prefill)

    def rebind_prefill(self, state: RequestState, prefill: int) -> None:
        """Move a prefill that failed to start onto another instance."""
        self._drop_prefill(state)
        bookings.prefill_on(state, prefill)
        self._queue_prefill(state, prefill)

    def deflect(self, state: RequestState, instance: int, chunk_limit_tokens: int) -> None:
        """A queued prefill re-planned onto ``instance``, which also decodes it
        (``core.bookings.deflect``, as in the simulator)."""
        self._drop_prefill(state)
        bookings.deflect(self.instances, state, instance, chunk_limit_tokens)
        self._queue_prefill(state, instance)

    def _drop_prefill(self, state: RequestState) -> None:
        p = state.prefill_instance
        if p is not None and state.req_id in self.instances[p].prefill_queue:
            booked = self.instances[p].prefill_queue[state.req_id]  # the length it was booked with
            self.instances[p].drop_prefill(state.req_id)
            self._own(p, -self._blocks(booked))

    def in_prefill_queue(self, state: RequestState) -> bool:
        """Whether the request's prompt is still booked on its prefill instance."""
        p = state.prefill_instance
        return p is not None and state.req_id in self.instances[p].prefill_queue

    def begin_prefill(self, state: RequestState) -> None:
        """The prefill leg was sent: the request can no longer be moved or deflected."""
        lifecycle.prefill_started(state, state.prefill_instance, self.now())

    def rebind_decode(self, state: RequestState, decode: int) -> None:
        """An early-bound decode moves to ``decode`` before its KV left (``core.bookings``)."""
        bookings.rebind_decode(self.instances, state, decode)

    def colocate(self, state: RequestState, instance: int) -> None:
        """The request decodes where it prefills (one leg on ``instance``)."""
        bookings.decode_on(state, instance)

    def move_decode(self, state: RequestState, target: int) -> None:
        """The request's decode moves to ``target`` (a migration or a recovery): off its
        instance, its context on the way to ``target``."""
        self.leave_decode(state)
        lifecycle.transferring(state)
        self.expect_decode(state, target)

    def migration_begins(self, state: RequestState) -> None:
        """The policy asked to move the request's decode (the flow moves it between tokens)."""
        lifecycle.migrating(state)

    def migration_over(self, state: RequestState, moved: bool) -> None:
        """A migration the policy asked for ended: moved, or stayed put."""
        lifecycle.migration_over(state, moved)

    def prefill_done(self, state: RequestState) -> None:
        """The prefill leg returned (PD) or the first token arrived (colocated)."""
        now = self.now()
        self._drop_prefill(state)
        lifecycle.token_emitted(state, now)  # the client's first token (PD: the prefill leg's)
        lifecycle.transferring(state)

    def expect_decode(self, state: RequestState, decode: int) -> None:
        """The decode leg is being sent to ``decode``: its KV is on the way there."""
        if self.on_leg is not None:
            self.on_leg(decode, state)
        ctx = state.request.prompt_tokens + state.generated_tokens
        bookings.kv_heading_to(self.instances, state, decode, ctx)
        self._own(decode, self._blocks(ctx))

    def start_decode(self, state: RequestState) -> None:
        """First token from the decode leg: the request is in the running batch."""
        d = state.decode_instance
        assert d is not None
        inst = self.instances[d]
        now = self.now()
        self._drop_incoming(d, state.req_id)
        ctx = state.request.prompt_tokens + state.generated_tokens
        self._admits += 1
        inst.decodes.add(state.req_id, ctx, state.generated_tokens, state.request.output_tokens,
                         self._admits, self._blocks(ctx), joined_s=now)
        self._own(d, self._blocks(ctx))
        lifecycle.decoding(state, d, now)

    def token(self, state: RequestState, count: int = 1) -> None:
        """``count`` output tokens relayed for a decoding request."""
        now = self.now()
        d = state.decode_instance
        inst = self.instances[d]  # type: ignore[index]
        if state.last_token_s is not None and count:
            gap = (now - state.last_token_s) / count
            inst.recent_iteration_s += _RATE_SMOOTHING * (gap - inst.recent_iteration_s)
            inst.recent_token_interval_s = inst.recent_iteration_s
        lifecycle.token_emitted(state, now, state.generated_tokens + count)
        if state.req_id in inst.decodes:
            ctx = state.request.prompt_tokens + state.generated_tokens
            inst.decodes.set(state.req_id, "ctx", ctx)
            inst.decodes.set(state.req_id, "generated", state.generated_tokens)
            grow = self._blocks(ctx) - inst.decodes.get(state.req_id, "blocks")
            if grow > 0:
                inst.decodes.set(state.req_id, "blocks", self._blocks(ctx))
                self._own(d, grow)  # type: ignore[arg-type]
        self.engines[d].tokens_since_report += count  # type: ignore[index]

    def _drop_incoming(self, iid: int, req_id: int) -> None:
        inst = self.instances[iid]
        if req_id in inst.incoming:
            booked = inst.incoming[req_id]
            inst.drop_incoming(req_id)
            self._own(iid, -self._blocks(booked))

    def leave_decode(self, state: RequestState) -> None:
        """Take a request off its decode instance (finish, migration or failure)."""
        d = state.decode_instance
        if d is None:
            return
        inst = self.instances[d]
        self._drop_incoming(d, state.req_id)  # its own blocks first: the booking says how many
        bookings.drop_bookings(self.instances, state)
        if state.req_id in inst.decodes:
            self._own(d, -inst.decodes.remove(state.req_id)["blocks"])

    def end(self, state: RequestState, reason: str | None = None) -> None:
        """Release everything the request holds; ``reason`` marks a rejection or failure.
        The ended request stays readable (``ClusterView.ended_request``) until ``forget``."""
        self._drop_prefill(state)
        self.leave_decode(state)
        lifecycle.ended(state, self.now(), reason)

    def forget(self, state: RequestState) -> None:
        self.requests.pop(state.req_id, None)

    def finish(self, state: RequestState, reason: str | None = None) -> None:
        """``end`` and ``forget`` at once."""
        self.end(state, reason)
        self.forget(state)

    def totals(self) -> dict[str, int]:
        """Sums over instances of everything in flight (all zero when the gateway is idle)."""
        insts = list(self.instances.values())
        return {"requests": len(self.requests),
                "prefill_queue_tokens": sum(i.prefill_queue_tokens for i in insts),
                "shadow_tokens": sum(i.shadow_tokens for i in insts),
                "incoming_tokens": sum(i.incoming_tokens for i in insts),
                "decodes": sum(i.decodes.n for i in insts),
                "own_blocks": sum(e.own_blocks for e in self.engines.values())}

    def describe(self, iid: int) -> dict:
        """Live state of one instance for the admin API."""
        inst, eng = self.instances[iid], self.engines[iid]
        s = eng.sample
        return {"id": iid, "name": eng.spec.name, "url": public_url(eng.spec.url), "role": inst.role.value,
                "type": eng.spec.engine_type, "healthy": inst.healthy, "removed": eng.removed,
                "queued_prefills": len(inst.prefill_queue), "incoming": len(inst.incoming),
                "decoding": inst.decodes.n, "shadow": len(inst.shadow),
                "token_load": inst.token_load(self.view.now_s), "kv_blocks_total": inst.kv_blocks_total,
                "kv_usage": round(inst.kv_usage_at(self.view.now_s), 6),
                "decode_rate_tokens_per_s": round(inst.decode_rate_tokens_per_s(self.view.now_s), 3),
                "scraped": None if s is None else {"age_s": round(self.view.now_s - s.at_s, 3),
                                                   "running": s.running, "waiting": s.waiting,
                                                   "kv_usage": s.kv_usage, "preemptions": s.preemptions}}

    def is_role(self, iid: int, role: Role) -> bool:
        return self.instances[iid].role is role
