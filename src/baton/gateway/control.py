"""The gateway's control state: policy calls, decision execution, health and per-request
bookkeeping. No HTTP here (no aiohttp): the server, the flows, the scrape loops and the
admin API call into ``Control``; it calls back into a request in flight only through the
small ``InFlight`` protocol. ``Control`` is the gateway's ``core.decisions.Executor``:
decisions go through the simulator's ``dispatch``, so an unknown decision fails and a stale
one (about a request that ended between a tick and its decisions) is dropped and counted
(``baton_stale_decisions_total{kind}``) in both runtimes alike."""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Protocol

from baton.core.decisions import (ArrivalPlan, ChangeRole, Decision, DecisionError, Deflect, Migrate, Watch,
                                  apply_decode_choice, apply_plan, dispatch)
from baton.core.events import Completed, DecodeProgress, HiddenState, Observation, PrefillDone
from baton.core.instance import Role
from baton.core.request import RequestState
from baton.gateway.admission import ClientShares
from baton.gateway.config import GatewayConfig
from baton.gateway.engine_health import EngineHealth
from baton.gateway.gate import Admission
from baton.gateway.hidden import LegTags, serves
from baton.gateway.holding import PrefillHold
from baton.gateway.live import LiveCluster
from baton.gateway.metrics import GatewayMetrics, TokenTimes
from baton.gateway.outliers import OutlierDetector
from baton.gateway.ratelog import RateLimitedLog
from baton.policies.base import Scheduler
from baton.protocol.errors import ApiError

log = logging.getLogger("baton.gateway")


class InFlight(Protocol):
    """What control needs of a request in flight (``gateway.flow.Flow`` provides it)."""

    state: RequestState
    client_xid: str
    client: str  # whose in-flight share it takes ("": none; gateway.admission)
    path: str
    times: TokenTimes

    def request_migration(self, target: int) -> None:
        """Move the request's decode to ``target`` between two relayed tokens."""


class Control(EngineHealth):
    """Policy calls and their consequences for one gateway. Synchronous: every method runs
    to its end on the event loop, so a policy always reads a consistent view."""

    def __init__(self, config: GatewayConfig, cluster: LiveCluster, scheduler: Scheduler,
                 metrics: GatewayMetrics, tags: LegTags | None = None) -> None:
        self.config, self.cluster, self.scheduler, self.metrics = config, cluster, scheduler, metrics
        self.tags = tags if tags is not None else LegTags()  # the hidden-state tags of legs in flight
        self.hold = PrefillHold(cluster, scheduler.replans_prefills, config.prefill_inflight_limit)
        self.admission = Admission(config, metrics, self._view_now, self.place_now)  # classes, flow control
        self.flows: dict[int, InFlight] = {}
        self.clients = ClientShares(config.max_inflight_per_client or max(1, config.max_inflight // 2),
                                    lambda: metrics.rejected.labels("client_cap").inc())
        self.watches: dict[int, tuple[int, int]] = {}  # req id -> (stage index, context tokens)
        self.decisions: deque[tuple] = deque(maxlen=config.decisions_log_size)  # admin API, see note_decision
        self.outliers = OutlierDetector(config.outliers, self._may_eject)
        self.leg_errors = RateLimitedLog(log, "failed legs", logging.WARNING)
        for iid in cluster.engines:
            self.outliers.add(iid)
        metrics.watch(cluster, self.hold)
        metrics.inflight.set_function(lambda: len(self.flows))
        metrics.watch_policy(scheduler)

    @property
    def view(self):
        return self.cluster.view

    def _view_now(self):
        self.cluster.now()
        return self.cluster.view

    def note_decision(self, kind: str, req_id: int, iid: int) -> None:
        """One entry of ``/admin/decisions``: when (seconds on the gateway's clock and Unix
        time), what (prefill, decode, deflect), which request and which instance."""
        # kept as a tuple, made a record only when read: one or two per request on the hot path
        flow = self.flows.get(req_id)
        self.decisions.append((self.cluster.clock(), time.time(), kind, req_id, self.cluster.engines[iid].spec.name,
                               iid, flow.client_xid if flow is not None else None))

    def decision_log(self) -> list[dict]:
        """The decision log as ``/admin/decisions`` shows it (see ``note_decision``; with the
        request's X-Request-Id)."""
        return [{"time_s": round(t, 6), "unix_time_s": round(u, 6), "kind": kind, "req_id": rid,
                 "x_request_id": xid, "instance": name, "instance_id": iid}
                for t, u, kind, rid, name, iid, xid in self.decisions]

    # --- placement -------------------------------------------------------------------------
    def plan(self, state: RequestState) -> ArrivalPlan:
        """The scheduler's placement; ApiError 503 when nothing can take the request."""
        self.cluster.now()
        plan = self.scheduler.plan_arrival(self.view, state)
        try:
            reason = apply_plan(plan, self, self.view)
        except DecisionError as err:
            log.error("policy %s: %s", self.scheduler.name, err)
            reason = "policy_error"
        if reason is not None:
            self.metrics.rejected.labels(reason).inc()
            raise ApiError(503, f"request rejected: {reason}", err_type="server_error")
        self.note_decision("prefill", state.req_id, plan.prefill_instance)
        if plan.watch_context_tokens is not None and plan.watch_stage is not None:
            self.watches[state.req_id] = (plan.watch_stage, plan.watch_context_tokens)
        if plan.decode_instance is not None:
            self.note_decision("decode", state.req_id, plan.decode_instance)
        return plan

    def choose_decode(self, state: RequestState, exclude: frozenset[int] = frozenset()) -> int:
        """The policy's decode instance; if it is unhealthy or one this request already
        saw fail (``exclude``), the least-loaded other healthy one."""
        self.cluster.now()
        try:
            choice = apply_decode_choice(self.scheduler.decode_choice(self.view, state), self, self.view)
        except DecisionError as err:
            log.warning("policy %s: %s; the least-loaded instance decodes instead", self.scheduler.name, err)
            choice = None
        if choice is None or choice in exclude:
            ids = [i for i in self.view.decode_ids if i not in exclude] or self._answering_ejected(exclude, True)
            if not ids:
                raise ApiError(503, "no healthy decode instance", err_type="server_error")
            choice = min(ids, key=self.view.token_load)
        self.note_decision("decode", state.req_id, choice)
        return choice

    def fallback_prefill(self, state: RequestState, exclude: frozenset[int] = frozenset()) -> int:
        """Another prefill instance after a failed prefill leg (least queued prefill work)."""
        ids = [i for i in self.view.prefill_ids if i not in exclude] or self._answering_ejected(exclude, False)
        if not ids:
            raise ApiError(503, "no healthy prefill instance", err_type="server_error")
        choice = min(ids, key=lambda i: self.cluster.instances[i].prefill_queue_tokens)
        self.cluster.rebind_prefill(state, choice)
        return choice

    # --- a request's steps (gateway.flow calls these; so does a relay worker's hub) --------------
    async def place(self, state: RequestState) -> ArrivalPlan:
        """``plan`` and the placement booked (its prompt queued on the prefill instance),
        once flow control lets the request go (ApiError 429 if it sheds it)."""
        return await self.admission.place(state)

    def place_now(self, state: RequestState) -> ArrivalPlan:
        """``place`` at once (a relay's placement is answered in order with its steps)."""
        plan = self.plan(state)
        self.cluster.bind(state, plan.prefill_instance, plan.decode_instance, plan.prefill_chunk_limit_tokens)
        return plan

    async def admit_prefill(self, state: RequestState, p: int) -> tuple[int, int, Deflect | None]:
        """Wait until a PD prefill may go to ``p`` (``gateway.holding``): the instance it
        goes to, the one whose hold admitted it (``prefill_sent`` tells that one), or a
        re-plan onto a decode instance (``Deflect``, booked here) instead."""
        replan = await self.hold.admit(p, state.req_id)
        if replan is not None:
            self.cluster.deflect(state, replan.instance, replan.chunk_limit_tokens)
            return p, p, replan
        if self.hold.enabled and not (self.cluster.healthy(p) and self.cluster.role(p).prefills):
            return self.fallback_prefill(state), p, None  # held on an instance that left the prefill side
        return p, p, None

    def prefill_sent(self, admitted: int) -> None:
        """The prefill leg admitted on ``admitted`` was answered or failed."""
        self.hold.sent_done(admitted)

    def prefill_done(self, state: RequestState, p: int) -> None:
        """The prompt is prefilled on ``p`` (its leg returned, or the first token came)."""
        self.cluster.prefill_done(state)
        self.observe(PrefillDone(state.req_id, p, self.cluster.now()))
        self.admission.room_changed()

    async def pick_decode(self, state: RequestState, exclude: frozenset[int] = frozenset()) -> int:
        """``choose_decode`` as a step of a request."""
        return self.choose_decode(state, exclude)

    async def pick_prefill(self, state: RequestState, exclude: frozenset[int] = frozenset()) -> int:
        """``fallback_prefill`` as a step of a request."""
        return self.fallback_prefill(state, exclude)

    async def at_fault(self, failed_on: list[int]) -> bool:
        """``request_at_fault`` as a step of a request."""
        return self.request_at_fault(failed_on)

    def tokens(self, state: RequestState, count: int) -> None:
        """``count`` tokens relayed for a decoding request (one upstream read)."""
        self.cluster.token(state, count)
        self.check_watch(state)

    def path_changed(self, flow: InFlight) -> None:
        """A request's decision path changed (the flow itself is what admin reads here)."""

    def observe(self, observation: Observation) -> None:
        if self.scheduler.observes:
            self.cluster.now()
            self.scheduler.observe(self.view, observation)

    # --- decisions (core.decisions.Executor) -------------------------------------------------
    def execute(self, decision: Decision, stage_index: int) -> bool:
        """Carry out one decision (``core.decisions.dispatch``); False if it was stale."""
        self.cluster.now()
        return dispatch(decision, self, self.view, stage_index)

    def change_role(self, decision: ChangeRole, stage_index: int) -> None:
        self.set_role(decision.instance_id, decision.role, "policy")

    def migrate(self, decision: Migrate, stage_index: int) -> None:
        flow = self.flows.get(decision.req_id)
        if flow is None:  # tracked but not served here (an admin call raced its end)
            return self.note_stale("migrate")
        self.cluster.migration_begins(flow.state)
        flow.request_migration(decision.target_instance)

    def watch(self, decision: Watch, stage_index: int) -> None:
        self.watches[decision.req_id] = (stage_index, decision.context_tokens)

    def deflect(self, decision: Deflect, stage_index: int) -> None:
        if self.hold.deflect(decision):
            self.note_decision("deflect", decision.req_id, decision.instance)

    def note_stale(self, kind: str) -> None:
        self.metrics.stale.labels(kind).inc()

    def set_role(self, iid: int, role: Role, by: str) -> None:
        """Flip an instance's role (a policy's ``ChangeRole`` or the admin API)."""
        before = self.cluster.instances[iid].role
        if self.cluster.set_role(iid, role):
            self.metrics.flips.labels(role.value).inc()
            log.info("instance %s: role %s -> %s (by %s)", self.cluster.engines[iid].spec.name,
                     before.value, role.value, by)

    def check_watch(self, state: RequestState) -> None:
        """Tell the stage that asked when a request's context reaches its watch."""
        watch = self.watches.get(state.req_id)
        if watch is None or state.request.prompt_tokens + state.generated_tokens < watch[1]:
            return
        del self.watches[state.req_id]
        self.cluster.now()
        ctx = state.request.prompt_tokens + state.generated_tokens
        self._run_all(self.scheduler.on_threshold(watch[0], self.view, state.req_id, ctx), watch[0])

    def start(self) -> None:
        """The scheduler's decisions at time 0."""
        self.cluster.now()
        for stage_index, decision in self.scheduler.start(self.view):
            self.execute(decision, stage_index)

    def tick(self, stage_index: int) -> None:
        """One periodic tick of a stage. A policy bug is logged and counted, never fatal:
        the next tick runs as usual."""
        self.report_progress()
        self.cluster.now()
        stage = str(stage_index)
        try:
            decisions = self.scheduler.tick(stage_index, self.view)
        except Exception:  # noqa: BLE001 - a policy bug must not stop its ticks for good
            log.exception("policy %s: tick of stage %d failed", self.scheduler.name, stage_index)
            self.metrics.tick_errors.labels(stage).inc()
            return
        self.metrics.ticks.labels(stage).inc()
        self._run_all(decisions, stage_index)

    def _run_all(self, decisions: list[Decision], stage_index: int) -> None:
        for d in decisions:
            try:
                self.execute(d, stage_index)
            except DecisionError as err:
                log.error("policy %s, stage %d: %s", self.scheduler.name, stage_index, err)

    def report_progress(self) -> None:
        """Decode progress per instance since the last report (tokens relayed / requests)."""
        now = self.cluster.now()
        for iid, eng in self.cluster.engines.items():
            inst = self.cluster.instances[iid]
            if eng.tokens_since_report and inst.decodes.n:
                iterations = max(1, eng.tokens_since_report // inst.decodes.n)
                self.observe(DecodeProgress(iid, iterations, inst.recent_iteration_s, now))
            eng.tokens_since_report = 0

    def hidden_state(self, source: int, tag: str, n_gen: int, vector) -> str | None:
        """A hidden state that arrived on instance ``source``'s feed, the ``n_gen``-th of
        the leg tagged ``tag``: to the policy if that leg was sent to ``source`` and is
        still its request's current leg there; else the drop reason (``gateway.hidden``)."""
        leg = self.tags.get(tag)
        if leg is None:
            return "unknown_tag"
        if leg.instance != source:  # an engine reporting on a leg another engine serves
            return "wrong_engine"
        flow = self.flows.get(leg.req_id)
        if flow is None or not serves(flow.state, source):
            return "stale"
        generated = leg.base_tokens + n_gen - 1
        budget = flow.state.request.output_tokens  # the request's max_tokens; 0 if none
        if budget and generated >= budget:  # the state of token N exists only for N <= max_tokens
            return "malformed"
        self.observe(HiddenState(leg.req_id, generated, tuple(vector.tolist()), self.cluster.clock()))
        self.metrics.hidden_states.inc()
        log.debug("hidden state: request %d after %d generated tokens", leg.req_id, generated)
        return None

    # --- request lifecycle ---------------------------------------------------------------------
    def admit(self, flow: InFlight) -> None:
        """Track a request; ApiError 429 when its client holds its share of the slots."""
        self.clients.take(flow.client)
        self.flows[flow.state.req_id] = flow

    def end(self, flow: InFlight, outcome: str, output_tokens: int, length_known: bool = True) -> None:
        """Release everything a request holds (bookings first), tell the policy a finished
        request's true length while its placement is still readable (unless it is not
        known: an endpoint picker that does not see answers), then forget it."""
        self.metrics.child(self.metrics.requests, flow.path, outcome).inc()
        self.admission.by_class.ended(flow.state, flow.times, outcome, output_tokens)
        if outcome == "ok" and length_known:
            self.metrics.finished(flow.times, flow.path, output_tokens)
        self.release(flow.state, outcome, output_tokens, length_known)

    def release(self, st: RequestState, outcome: str, output_tokens: int, length_known: bool = True) -> None:
        """``end`` without the request's metrics (a relay worker counts its own)."""
        # what admits new requests goes first, so a failure below cannot leak a slot
        flow = self.flows.pop(st.req_id, None)
        if flow is not None:
            self.clients.give(flow.client)
        self.watches.pop(st.req_id, None)
        self.tags.drop(st.req_id)
        try:
            self.cluster.end(st, None if outcome == "ok" else outcome)
            if outcome == "ok" and length_known:
                self.observe(Completed(st.req_id, output_tokens, self.cluster.clock()))
        finally:
            self.cluster.forget(st)
            self.admission.ended(st)
