"""A relay worker's side of control (``baton serve --workers N``): the same verbs a flow
calls on ``control.Control``, carried to the control process over ``gateway.ipc``.

A relay keeps its own ``LiveCluster`` copy of the requests it carries, so a flow reads
and steps them exactly as in one process; each step that books something is applied here
and sent to control (``RelayCluster``), which applies the same method to its own copy.
Steps that need the policy (placement, a decode or prefill instance chosen again, a
prefill held, whether a request is at fault) are calls that wait for control's answer.

What a policy sees differently with workers: decode progress arrives in batches, at most
``report_interval_s`` late (the token gaps an instance's pace is estimated from are
averaged over a batch), and the relay's deadlines and health checks read control's view
as of its last snapshot (``ipc.SNAPSHOT_S``)."""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import time
from dataclasses import asdict
from typing import Any, Callable

from baton.core import lifecycle
from baton.core.decisions import ArrivalPlan, Deflect
from baton.core.instance import Role
from baton.core.request import RequestState
from baton.gateway import ipc
from baton.gateway.class_metrics import ClassMetrics
from baton.gateway.classes import Classes
from baton.gateway.config import EngineSpec, GatewayConfig
from baton.gateway.live import LiveCluster
from baton.gateway.metrics import GatewayMetrics, SloEdges
from baton.protocol.errors import ApiError

log = logging.getLogger("baton.gateway")


class Link:
    """A relay's DEALER socket to control: batched steps, calls, heartbeats and what
    control sends (``on_message``). ``up`` while control answers (see ``ipc``)."""

    def __init__(self, address: str, identity: bytes, report_interval_s: float,
                 on_message: Callable[[list], None], hello: Callable[[], list]) -> None:
        self.address, self.identity, self.report_interval_s = address, identity, report_interval_s
        self.on_message, self.hello = on_message, hello
        self.up, self.epoch, self.last_seen_s, self.last_sent_s = False, None, 0.0, 0.0
        self.ops: list[list] = []
        self.pending_tokens: dict[int, int] = {}
        self.calls: dict[int, asyncio.Future] = {}
        self._ids = itertools.count()
        self._flush_handle: asyncio.Handle | None = None
        self.sock: Any = None
        self._tasks: list[asyncio.Task] = []
        self.answered: asyncio.Event | None = None  # set once control has answered (made on start)

    async def start(self) -> None:
        import zmq
        import zmq.asyncio
        self.context = zmq.asyncio.Context()
        self.sock = self.context.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.IDENTITY, self.identity)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(self.address)
        self.answered = asyncio.Event()
        self._send(["hb"])
        self._tasks = [asyncio.create_task(self._read()), asyncio.create_task(self._watch())]

    async def until_answered(self, note_every_s: float = 5.0) -> None:
        """Wait for control's first snapshot (a relay listens only once it can place)."""
        assert self.answered is not None
        while True:
            try:
                return await asyncio.wait_for(self.answered.wait(), note_every_s)
            except asyncio.TimeoutError:
                log.warning("relay %s: control has not answered for %.0f s; not accepting requests yet",
                            self.identity.decode(), note_every_s)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._fail_calls()
        if self.sock is not None:
            self.sock.close(0)
            self.context.term()

    # --- steps and calls ----------------------------------------------------------------
    def op(self, op: str, key: int, *args: Any) -> None:
        """One step (``key``: a request id, or an instance id for engine-wide ones); a
        request's decode progress so far goes first, so control sees its steps in order.
        Steps go out together at the end of the event loop's turn: one message for all."""
        tokens = self.pending_tokens.pop(key, 0)
        if tokens:
            self.ops.append(["tk", key, tokens])
        self.ops.append([op, key, *args])
        self._schedule(0.0)

    def tokens(self, req_id: int, count: int) -> None:
        """Decode progress: summed per request, sent at most every ``report_interval_s``."""
        self.pending_tokens[req_id] = self.pending_tokens.get(req_id, 0) + count
        self._schedule(self.report_interval_s)

    def _schedule(self, delay_s: float) -> None:
        if self._flush_handle is None:
            loop = asyncio.get_running_loop()
            self._flush_handle = loop.call_soon(self.flush) if delay_s <= 0 else loop.call_later(delay_s, self.flush)
        elif delay_s <= 0 and isinstance(self._flush_handle, asyncio.TimerHandle):
            self._flush_handle.cancel()  # a step waits for no timer
            self._flush_handle = asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        if self.pending_tokens:
            self.ops.extend(["tk", rid, n] for rid, n in self.pending_tokens.items())
            self.pending_tokens.clear()
        if self.ops and self.up:  # kept while control is silent: a control that was only hung needs them
            self._send(["ops", self.ops])
            self.ops = []

    async def call(self, verb: str, req_id: int, *args: Any) -> Any:
        """A step of request ``req_id`` that needs control's answer (sent in order with the
        steps, ``["call", call_id, verb, req_id, *args]``); ApiError 503 while control is away."""
        if not self.up:
            raise ApiError(503, "the gateway's control process is restarting; retry", err_type="server_error",
                           code="control_unavailable")
        call_id = next(self._ids)
        future = self.calls[call_id] = asyncio.get_running_loop().create_future()
        tokens = self.pending_tokens.pop(req_id, 0)
        if tokens:
            self.ops.append(["tk", req_id, tokens])
        self.ops.append(["call", call_id, verb, req_id, *args])
        self._schedule(0.0)
        try:
            ok, value = await future
        finally:
            self.calls.pop(call_id, None)
        if not ok:
            raise ipc.api_error(value)
        return value

    def answer(self, message: list) -> None:
        """A ``ret`` from control."""
        future = self.calls.get(message[1])
        if future is not None and not future.done():
            future.set_result((message[2], message[3]))

    def _send(self, message: list) -> None:
        self.sock.send(ipc.pack(message))
        self.last_sent_s = time.monotonic()

    def send(self, message: list) -> None:
        self._send(message)

    # --- control's messages and liveness ---------------------------------------------------
    async def _read(self) -> None:
        while True:
            frame = await self.sock.recv()
            try:
                message = ipc.unpack(frame)
                for one in message[1] if message[0] == "many" else (message,):
                    self._handle(one)
            except Exception:  # noqa: BLE001 - one bad message must not stop the relay's reader
                log.exception("relay: a message from control could not be handled")

    def _handle(self, message: list) -> None:
        if message[0] == "snap":
            self._snapshot(message)
        elif message[0] == "ret":
            self.answer(message)
        elif message[0] == "hello?":  # control took this relay for gone and released its requests
            self._hello_again()
        self.on_message(message)

    def _snapshot(self, message: list) -> None:
        self.last_seen_s = time.monotonic()
        if message[1] != self.epoch:  # a control (re)started: it learns this relay's requests first
            if self.epoch is not None:
                self._fail_calls()  # asked of the control that is gone: nobody will answer them
            self.epoch = message[1]
            self._hello_again()  # the hello tells a new control where the requests got to
        if not self.up:
            log.info("relay %s: control is up", self.identity.decode())
            self.up = True
            if self.answered is not None:
                self.answered.set()
            self.flush()  # what waited while control was silent

    def _hello_again(self) -> None:
        self.ops, self.pending_tokens = [], {}
        self._send(["hi", *self.hello()])

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(ipc.HEARTBEAT_S)
            now = time.monotonic()
            if self.up and now - self.last_seen_s > ipc.CONTROL_SILENT_S:
                self.up = False
                log.warning("relay %s: control silent for %.1f s; new requests get 503 until it is back",
                            self.identity.decode(), now - self.last_seen_s)
                self._fail_calls()
            if now - self.last_sent_s >= ipc.HEARTBEAT_S:
                self._send(["hb"])

    def _fail_calls(self) -> None:
        for future in self.calls.values():
            if not future.done():
                future.set_result((False, ipc.error_fields(ApiError(
                    503, "the gateway's control process went away; retry", err_type="server_error",
                    code="control_unavailable"))))


def _forwarded(op: str):
    """A ``LiveCluster`` step applied here and sent to control (once: steps made of other
    forwarded steps send only themselves)."""
    def wrap(method):
        @functools.wraps(method)
        def forwarding(self: RelayCluster, state: RequestState, *args: Any) -> None:
            if self.depth:
                return method(self, state, *args)
            self.depth += 1
            try:
                method(self, state, *args)
            finally:
                self.depth -= 1
            self.link.op(op, state.req_id, *args)
        return forwarding
    return wrap


class RelayCluster(LiveCluster):
    """The relay's copy: its own requests, booked as control books them; instance health,
    roles and load as control last said (``apply_snapshot``)."""

    def __init__(self, link: Link, id_base: int, default_kv_blocks: int, block_size: int,
                 scrape_interval_s: float) -> None:
        super().__init__(self._clock, default_kv_blocks, block_size, scrape_interval_s)
        self.link, self.depth, self.t0 = link, 0, time.monotonic()
        self._next_request = id_base  # request ids unique across relays and their restarts
        self.remote_load: dict[int, tuple[int, float]] = {}  # iid -> (pending tokens, token interval s)
        self.hold_enabled = False

    def _clock(self) -> float:
        return time.monotonic() - self.t0

    @_forwarded("ed")
    def expect_decode(self, state: RequestState, decode: int) -> None:
        super().expect_decode(state, decode)

    @_forwarded("sd")
    def start_decode(self, state: RequestState) -> None:
        super().start_decode(state)

    @_forwarded("pt")
    def set_prompt_tokens(self, state: RequestState, prompt_tokens: int) -> None:
        super().set_prompt_tokens(state, prompt_tokens)

    @_forwarded("bp")
    def begin_prefill(self, state: RequestState) -> None:
        super().begin_prefill(state)

    @_forwarded("co")
    def colocate(self, state: RequestState, instance: int) -> None:
        super().colocate(state, instance)

    @_forwarded("md")
    def move_decode(self, state: RequestState, target: int) -> None:
        super().move_decode(state, target)

    @_forwarded("mo")
    def migration_over(self, state: RequestState, moved: bool) -> None:
        super().migration_over(state, moved)

    def pending_tokens(self, iid: int) -> int:
        load = self.remote_load.get(iid)
        return super().pending_tokens(iid) if load is None else load[0]

    def token_interval_s(self, iid: int) -> float:
        load = self.remote_load.get(iid)
        return super().token_interval_s(iid) if load is None else load[1]

    def apply_snapshot(self, message: list, add_engine: Callable[[EngineSpec], int]) -> None:
        """``["snap", epoch, t0, hold_enabled, instances, specs]`` from control."""
        _, _, t0, self.hold_enabled, instances, specs = message
        self.t0 = t0  # CLOCK_MONOTONIC is one clock for every process on the machine
        for spec in specs[len(self.engines):]:  # engines added through control's admin API
            add_engine(EngineSpec(**{**spec, "role": Role(spec["role"])}))
        for iid, healthy, role, removed, pending, interval_s in instances:
            if iid not in self.instances:
                continue
            self.engines[iid].removed = removed
            if self.instances[iid].healthy is not healthy:
                self.instances[iid].healthy = healthy
                self.view.invalidate_roles()
            self.set_role(iid, Role(role))
            self.remote_load[iid] = (pending, interval_s)


def snapshot_specs(specs: list[EngineSpec]) -> list[dict]:
    return [{**asdict(s), "role": s.role.value} for s in specs]


class RemoteControl:
    """``control.Control``'s verbs for a relay's flows (see the module docstring)."""

    def __init__(self, config: GatewayConfig, cluster: RelayCluster, link: Link) -> None:
        self.config, self.cluster, self.link = config, cluster, link
        self.metrics = GatewayMetrics(SloEdges.of(config))  # its own counts; control's /metrics adds them up
        self.by_class = ClassMetrics(self.metrics.registry, Classes(config.classes), config.ttft_slo_s,
                                     config.tpot_slo_s, self.metrics.slo.ttft_s)
        self.flows: dict[int, Any] = {}

    def admit(self, flow) -> None:
        self.flows[flow.state.req_id] = flow

    async def place(self, state: RequestState) -> ArrivalPlan:
        r = state.request
        flow = self.flows.get(state.req_id)
        p, d, chunk = await self.link.call("place", state.req_id, flow.client_xid if flow else "", r.arrival_s,
                                           r.prompt_tokens, r.output_tokens, list(state.block_keys),
                                           flow.client if flow else "", _class_of(r))
        self.cluster.bind(state, p, d, chunk)
        return ArrivalPlan(p, d, chunk)

    async def admit_prefill(self, state: RequestState, p: int) -> tuple[int, int, Deflect | None]:
        go, admitted, replan = await self.link.call("admit_prefill", state.req_id, p)
        if replan is not None:
            self.cluster.deflect(state, replan[0], replan[1])
            return p, admitted, Deflect(state.req_id, replan[0], replan[1])
        if go != p:
            self.cluster.rebind_prefill(state, go)
        return go, admitted, None

    def prefill_sent(self, admitted: int) -> None:
        self.link.op("ps", admitted)

    def prefill_done(self, state: RequestState, p: int) -> None:
        self.cluster.prefill_done(state)
        self.link.op("pd", state.req_id, p)

    async def pick_decode(self, state: RequestState, exclude: frozenset[int] = frozenset()) -> int:
        return await self.link.call("pick_decode", state.req_id, sorted(exclude))

    async def pick_prefill(self, state: RequestState, exclude: frozenset[int] = frozenset()) -> int:
        p = await self.link.call("pick_prefill", state.req_id, sorted(exclude))
        self.cluster.rebind_prefill(state, p)
        return p

    async def at_fault(self, failed_on: list[int]) -> bool:
        return await self.link.call("at_fault", -1, list(failed_on))

    def tokens(self, state: RequestState, count: int) -> None:
        self.cluster.token(state, count)
        self.link.tokens(state.req_id, count)

    def path_changed(self, flow) -> None:
        self.link.op("path", flow.state.req_id, flow.path)

    def backend_error(self, iid: int, err: BaseException, blame: bool = True) -> None:
        self.link.op("be", iid, ipc.upstream_fields(err), blame)

    def leg_ok(self, iid: int) -> None:
        self.link.op("ok", iid)

    def blame(self, iid: int) -> None:
        self.link.op("bl", iid)

    def end(self, flow, outcome: str, output_tokens: int, length_known: bool = True) -> None:
        """As ``Control.end``: the request's metrics here, its bookings here and in control."""
        st = flow.state
        self.flows.pop(st.req_id, None)
        self.metrics.child(self.metrics.requests, flow.path, outcome).inc()
        self.by_class.ended(st, flow.times, outcome, output_tokens)
        if outcome == "ok" and length_known:
            self.metrics.finished(flow.times, flow.path, output_tokens)
        self.cluster.finish(st, None if outcome == "ok" else outcome)
        self.link.op("end", st.req_id, outcome, output_tokens, length_known)

    def migrate(self, req_id: int, target: int) -> None:
        """Control's ``Migrate`` for a request this relay carries."""
        flow = self.flows.get(req_id)
        if flow is not None:
            lifecycle.migrating(flow.state)
            flow.request_migration(target)

    def records(self) -> list[list]:
        """The requests in flight here, as a new control books them (``hub.adopt``)."""
        out = []
        for flow in self.flows.values():
            st, r = flow.state, flow.state.request
            out.append([st.req_id, flow.client_xid, flow.path, r.arrival_s, r.prompt_tokens, r.output_tokens,
                        st.prefill_instance, st.decode_instance, st.phase.value, st.generated_tokens,
                        self.cluster.in_prefill_queue(st), _class_of(r)])
        return out


def _class_of(r) -> list:
    """A request's class as it crosses to control (``gateway.classes.RequestClass``)."""
    return [r.priority, r.tenant, r.ttft_slo_s, r.tpot_slo_s]
