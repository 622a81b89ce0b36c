"""Control's side of ``baton serve --workers N``: one ROUTER socket that every relay worker
talks to (``gateway.ipc``). It applies the relays' request steps to control's cluster,
answers their calls with ``control.Control``'s verbs, sends them control's view every
``ipc.SNAPSHOT_S`` and the migrations a policy orders for their streams, and releases
every request of a relay that exits (the supervisor says so) or goes silent.

A control that starts again (new ``epoch``) books the requests the relays still carry from
their hellos (``adopt``); the policy has not seen those requests placed, so they end
without telling it their length."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from baton.core import lifecycle
from baton.core.request import Phase, RequestState
from baton.gateway import ipc
from baton.gateway.control import Control
from baton.gateway.metrics import TokenTimes
from baton.gateway.models import ModelNames
from baton.gateway.relay_control import snapshot_specs
from baton.protocol.errors import ApiError

log = logging.getLogger("baton.gateway")


@dataclass(slots=True)
class RelayFlow:
    """A request a relay carries, as control's ``InFlight`` (admin reads it; migrations
    go through it to the relay)."""

    state: RequestState
    client_xid: str
    relay: bytes
    hub: "ControlHub"
    path: str = "pd"
    adopted: bool = False  # booked from a relay's hello after control restarted
    client: str = ""  # whose in-flight share it takes (gateway.admission)
    times: TokenTimes = field(default_factory=TokenTimes)

    def request_migration(self, target: int) -> None:
        self.hub.send(self.relay, ["migrate", self.state.req_id, target])


@dataclass(slots=True)
class RelayInfo:
    last_seen_s: float
    introduced: bool = False  # said hello in this epoch: its steps and calls count
    flows: set[int] = field(default_factory=set)
    slot: int = -1
    pid: int = 0
    asked_s: float = float("-inf")  # when control last asked it for a hello
    specs_sent: int = 0  # engines whose specs it was sent (a snapshot repeats them only when engines join)


class ControlHub:
    """See the module docstring. ``address``: the ROUTER's ZMQ endpoint."""

    def __init__(self, control: Control, address: str, names: ModelNames | None = None,
                 rediscover: Callable[[int], None] | None = None) -> None:
        self.control, self.cluster, self.address = control, control.cluster, address
        self.names = names if names is not None else ModelNames(None)  # what the engines said of themselves
        # a relay's leg got 404: control asks the engine its name again (its snapshots carry the names)
        self.rediscover = rediscover if rediscover is not None else self.names.forget
        self.epoch = secrets.randbits(62)
        self.relays: dict[bytes, RelayInfo] = {}
        self.pulls: dict[int, tuple[asyncio.Future, set[bytes], list]] = {}
        self.last_counts: dict[bytes, list] = {}  # each relay's counts at the last /metrics
        self.retired: dict[tuple, list] = {}  # counts of relays that exited: (family, sample, labels) -> sample
        self._next_pull = 0
        self.waiting: dict[int, asyncio.Task] = {}  # held prefills (admit_prefill) by request id
        self.outbox: dict[bytes, list] = {}
        self._drain_handle: asyncio.Handle | None = None
        self._tasks: list[asyncio.Task] = []
        self.sock: Any = None

    async def start(self) -> None:
        import zmq
        import zmq.asyncio
        self.context = zmq.asyncio.Context()
        self.sock = self.context.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 0)  # a relay that is gone: its messages are dropped
        self.sock.bind(self.address)
        self._tasks = [asyncio.create_task(self._read()), asyncio.create_task(self._snapshots())]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.sock is not None:
            self.sock.close(0)
            self.context.term()

    def send(self, relay: bytes, message: list) -> None:
        """Queue ``message`` for ``relay``: what control has for a relay goes out together
        at the end of the event loop's turn (a ZMQ send costs tens of microseconds)."""
        self.outbox.setdefault(relay, []).append(message)
        if self._drain_handle is None:
            self._drain_handle = asyncio.get_running_loop().call_soon(self._drain)

    def _drain(self) -> None:
        self._drain_handle = None
        outbox, self.outbox = self.outbox, {}
        for relay, messages in outbox.items():
            frame = messages[0] if len(messages) == 1 else ["many", messages]
            self.sock.send_multipart([relay, ipc.pack(frame)])

    # --- reading ---------------------------------------------------------------------------
    async def _read(self) -> None:
        while True:
            relay, frame = await self.sock.recv_multipart()
            try:
                self._handle(relay, ipc.unpack(frame))
            except Exception:  # noqa: BLE001 - one bad message must not stop control's reader
                log.exception("control: a message from %s could not be handled", relay)

    def _handle(self, relay: bytes, message: list) -> None:
        kind = message[0]
        if kind == "dead":  # from the supervisor: message[1] exited
            return self.relay_gone(message[1].encode(), "exited")
        info = self.relays.get(relay)
        if info is None:  # its hello follows the snapshot; one it does not send is asked for later
            now = time.monotonic()
            info = self.relays[relay] = RelayInfo(now, asked_s=now)
            self._snapshot_to(relay)
        info.last_seen_s = time.monotonic()
        if kind == "hi":
            self._hello(relay, info, message)
        elif not info.introduced:
            for call in (m for m in message[1] if m[0] == "call") if kind == "ops" else ():
                # sent before this control's epoch reached it: not acted on
                self.send(relay, ["ret", call[1], False, ipc.error_fields(_unavailable())])
            if info.last_seen_s - info.asked_s > ipc.HEARTBEAT_S:  # one taken for gone: it says hello again
                info.asked_s = info.last_seen_s
                self.send(relay, ["hello?"])
        elif kind == "ops":
            self._ops(relay, info, message[1])
        elif kind == "metrics":
            self._metrics(relay, message)

    def _hello(self, relay: bytes, info: RelayInfo, message: list) -> None:
        _, slot, generation, pid, records = message
        info.introduced, info.slot, info.pid = True, slot, pid
        for record in records:
            if record[0] not in self.cluster.requests:
                self._adopt(relay, info, record)
        log.info("control: relay %s (slot %s, start %s) joined with %d requests in flight", relay.decode(), slot,
                 generation, len(records))

    def _adopt(self, relay: bytes, info: RelayInfo, record: list) -> None:
        """Book a request a relay carried while control was away (``relay_control.records``)."""
        rid, xid, path, arrival_s, prompt, max_tokens, p, d, phase, generated, queued, *cls = record
        st = self.cluster.new_request(prompt, max_tokens, rid, arrival_s, tuple(cls[0]) if cls else ())
        flow = RelayFlow(st, xid, relay, self, path, adopted=True)
        self.control.admit(flow)
        info.flows.add(rid)
        if p is None:
            return
        self.cluster.bind(st, p, d if d != p else None, None)
        if d is not None and d == p:
            self.cluster.colocate(st, p)
        if queued:
            return
        self.cluster.prefill_done(st)
        lifecycle.relayed(st, generated)  # adopted: what the relay reports it relayed
        if d is not None:
            self.cluster.expect_decode(st, d)
            if phase == Phase.DECODE.value:
                self.cluster.start_decode(st)

    # --- steps -------------------------------------------------------------------------------
    def _ops(self, relay: bytes, info: RelayInfo, ops: list) -> None:
        for op in ops:
            try:
                self._op(relay, info, op)
            except Exception:  # noqa: BLE001 - a step that cannot be applied is logged, the rest go on
                log.exception("control: step %r from %s could not be applied", op[:2], relay.decode())

    def _op(self, relay: bytes, info: RelayInfo, op: list) -> None:
        kind, key, args = op[0], op[1], op[2:]
        if kind == "call":
            return self._call(relay, info, op)
        c, cluster = self.control, self.cluster
        engine_steps = {"ps": c.prefill_sent, "ok": c.leg_ok, "bl": c.blame, "rd": self.rediscover}
        if kind in engine_steps:
            return engine_steps[kind](key)
        if kind == "be":
            return c.backend_error(key, ipc.upstream_error(args[0]), args[1])
        flow = c.flows.get(key)
        if not isinstance(flow, RelayFlow) or flow.relay != relay:
            return  # a request control released already (its relay was taken for gone)
        st = flow.state
        if kind == "end":
            info.flows.discard(key)
            self._stop_waiting(key)
            outcome, tokens, length_known = args
            return c.release(st, outcome, tokens, length_known and not flow.adopted)
        if kind == "path":
            flow.path = args[0]
            return None
        steps = {"tk": c.tokens, "pd": c.prefill_done, "ed": cluster.expect_decode, "sd": cluster.start_decode,
                 "pt": cluster.set_prompt_tokens, "bp": cluster.begin_prefill, "co": cluster.colocate,
                 "md": cluster.move_decode, "mo": cluster.migration_over}
        return steps[kind](st, *args)

    def _call(self, relay: bytes, info: RelayInfo, message: list) -> None:
        """A relay's call, answered in order with its steps; only a prefill held by the
        policy (``admit_prefill``) waits, in a task that the request's end cancels."""
        _, call_id, verb, *args = message
        held = verb == "place" and self.control.admission.gate.enabled  # flow control may hold it
        if verb == "admit_prefill" or held:
            work = self._admit_prefill(relay, call_id, *args) if not held else self._held_place(relay, info, call_id, args)
            task = asyncio.get_running_loop().create_task(work)
            self.waiting[args[0]] = task
            task.add_done_callback(lambda _t: self.waiting.pop(args[0], None))
            return
        try:
            answer = ["ret", call_id, True, self._answer(relay, info, verb, args)]
        except ApiError as err:
            answer = ["ret", call_id, False, ipc.error_fields(err)]
        self.send(relay, answer)

    def _answer(self, relay: bytes, info: RelayInfo, verb: str, args: list) -> Any:
        c = self.control
        if verb == "place":
            return self._place(relay, info, *args)
        if verb == "pick_decode":
            return c.choose_decode(self._state(relay, args[0]), frozenset(args[1]))
        if verb == "pick_prefill":
            return c.fallback_prefill(self._state(relay, args[0]), frozenset(args[1]))
        if verb == "at_fault":
            return c.request_at_fault(args[1])
        raise ApiError(500, f"unknown call {verb!r} from a relay worker", err_type="server_error")

    def _place(self, relay: bytes, info: RelayInfo, *args) -> list:
        st = self._track(relay, info, *args)
        with self._rejecting(info, st):
            return _plan_fields(self.control.place_now(st))

    async def _held_place(self, relay: bytes, info: RelayInfo, call_id: int, args: list) -> None:
        """``_place`` through flow control: answered when the request leaves its queue."""
        try:
            st = self._track(relay, info, *args)
            with self._rejecting(info, st):
                answer = ["ret", call_id, True, _plan_fields(await self.control.place(st))]
        except ApiError as err:
            answer = ["ret", call_id, False, ipc.error_fields(err)]
        self.send(relay, answer)

    @contextlib.contextmanager
    def _rejecting(self, info: RelayInfo, st: RequestState):
        """A placement refused (503, or 429 from flow control): the request is released."""
        try:
            yield
        except ApiError:
            info.flows.discard(st.req_id)
            self.control.release(st, "rejected", 0)
            raise

    def _track(self, relay: bytes, info: RelayInfo, rid: int, xid: str, arrival_s: float, prompt: int,
               max_tokens: int, block_keys: list, client: str = "", cls: list = ()) -> RequestState:
        """A relay's new request booked in control (429 when the gateway or its client is full)."""
        c = self.control
        if len(c.flows) >= c.config.max_inflight:
            c.metrics.rejected.labels("overload").inc()
            raise ApiError(429, f"gateway at capacity ({c.config.max_inflight} requests in flight); retry later",
                           err_type="rate_limit_exceeded", code="429")
        st = self.cluster.new_request(prompt, max_tokens, rid, arrival_s, tuple(cls))
        st.block_keys = tuple(block_keys)
        try:
            c.admit(RelayFlow(st, xid, relay, self, client=client))
        except ApiError:  # its client holds its share of the slots
            self.cluster.forget(st)
            raise
        info.flows.add(rid)
        return st

    def _state(self, relay: bytes, rid: int) -> RequestState:
        flow = self.control.flows.get(rid)
        if not isinstance(flow, RelayFlow) or flow.relay != relay:
            raise ApiError(503, "request no longer tracked by control", err_type="server_error")
        return flow.state

    async def _admit_prefill(self, relay: bytes, call_id: int, rid: int, p: int) -> None:
        try:
            go, admitted, replan = await self.control.admit_prefill(self._state(relay, rid), p)
            answer = ["ret", call_id, True, [go, admitted, None if replan is None else
                                             [replan.instance, replan.chunk_limit_tokens]]]
        except ApiError as err:
            answer = ["ret", call_id, False, ipc.error_fields(err)]
        self.send(relay, answer)

    def _stop_waiting(self, rid: int) -> None:
        """A request that ended while its prefill was held: the hold lets it go."""
        task = self.waiting.pop(rid, None)
        if task is not None:
            task.cancel()

    # --- relays coming and going ---------------------------------------------------------------
    def relay_gone(self, relay: bytes, why: str) -> None:
        """Release every request ``relay`` carried: its client connections and engine legs
        closed with its process (an engine aborts a request whose connection closes)."""
        info = self.relays.pop(relay, None)
        if info is None:
            return
        for rid in list(info.flows):
            flow = self.control.flows.get(rid)
            if isinstance(flow, RelayFlow) and flow.relay == relay:
                self._stop_waiting(rid)
                self.control.end(flow, "relay_lost", flow.state.generated_tokens, length_known=False)
        for pull in self.pulls.values():
            pull[1].discard(relay)
        for family, name, labels, value in self.last_counts.pop(relay, ()):  # what it counted up to then
            key = (family, name, tuple(sorted(labels.items())))
            self.retired.setdefault(key, [family, name, labels, 0.0])[3] += value
        log.warning("control: relay %s %s; %d requests it carried released", relay.decode(), why, len(info.flows))

    async def _snapshots(self) -> None:
        last_s = time.monotonic()
        while True:
            await asyncio.sleep(ipc.SNAPSHOT_S)
            now = time.monotonic()
            if now - last_s > ipc.CONTROL_SILENT_S:  # control itself stood still: the relays were not silent
                for info in self.relays.values():
                    info.last_seen_s = max(info.last_seen_s, now)
            last_s = now
            for relay, info in list(self.relays.items()):
                if now - info.last_seen_s > ipc.RELAY_SILENT_S:
                    self.relay_gone(relay, f"silent for {now - info.last_seen_s:.1f} s")
                else:
                    self._snapshot_to(relay)

    def _snapshot_to(self, relay: bytes) -> None:
        c = self.cluster
        instances = [[iid, inst.healthy, inst.role.value, c.engines[iid].removed, c.pending_tokens(iid),
                      c.token_interval_s(iid)] for iid, inst in c.instances.items()]
        info = self.relays.get(relay)
        specs = []  # the relay keeps the specs it was sent; only engines that joined since make it send them
        if info is None or info.specs_sent < len(c.engines):
            specs = snapshot_specs([e.spec for e in c.engines.values()])
            if info is not None:
                info.specs_sent = len(specs)
        names = [[iid, self.names.by_engine.get(iid), self.names.context_tokens.get(iid)] for iid in c.engines]
        self.send(relay, ["snap", self.epoch, time.monotonic() - c.clock(), self.control.hold.enabled,
                          self.control.scheduler.needs_prefix_keys, instances, specs, names])

    def describe(self) -> dict:
        """The relays as ``/admin/workers`` shows them."""
        now = time.monotonic()
        return {"control_pid": os.getpid(), "relays": [
            {"identity": r.decode(), "slot": i.slot, "pid": i.pid, "requests": len(i.flows),
             "last_seen_s": round(now - i.last_seen_s, 3)} for r, i in self.relays.items() if i.introduced]}

    # --- metrics -------------------------------------------------------------------------------
    async def relay_samples(self, timeout_s: float = 1.0) -> list:
        """Every live relay's counters and histograms (``[family, sample, labels, value]``),
        plus those of relays that exited since control started."""
        relays = {r for r, info in self.relays.items() if info.introduced}
        pull_id, self._next_pull = self._next_pull, self._next_pull + 1
        future = asyncio.get_running_loop().create_future()
        self.pulls[pull_id] = (future, set(relays), [])
        for relay in relays:
            self.send(relay, ["pull", pull_id])
        try:
            if relays:
                await asyncio.wait_for(asyncio.shield(future), timeout_s)
        except asyncio.TimeoutError:
            log.warning("control: %d relays did not report metrics within %.1f s", len(self.pulls[pull_id][1]),
                        timeout_s)
        finally:
            _, _, samples = self.pulls.pop(pull_id)
        return samples + list(self.retired.values())

    def _metrics(self, relay: bytes, message: list) -> None:
        if message[1] == -1:  # sent unasked
            self.last_counts[relay] = message[2]
            return
        pull = self.pulls.get(message[1])
        if pull is None or relay not in pull[1]:
            return
        future, waiting, samples = pull
        samples.extend(message[2])
        self.last_counts[relay] = message[2]
        waiting.discard(relay)
        if not waiting and not future.done():
            future.set_result(None)


def _unavailable() -> ApiError:
    return ApiError(503, "the gateway's control process restarted; retry", err_type="server_error",
                    code="control_unavailable")


def _plan_fields(plan) -> list:
    return [plan.prefill_instance, plan.decode_instance, plan.prefill_chunk_limit_tokens]
