"""One client request through the gateway: placement, the prefill and decode legs, the
token relay, continuation migration, recovery from engine faults, and cleanup.

Whatever happens, ``run`` releases everything the request holds in the gateway's
accounting before it returns (or is cancelled by a client disconnect).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from baton.core.decisions import Deflect
from baton.core.instance import Role
from baton.core.request import Phase, RequestState
from baton.gateway import handoff
from baton.gateway.client import ClientOut
from baton.gateway.faults import LegFaults
from baton.gateway.flow_parts import FlowParts
from baton.gateway.metrics import TokenTimes
from baton.gateway.scan import IdLog, Run
from baton.gateway.upstream import (Piece, StreamLeg, UpstreamError, endpoint, plausible_prompt_tokens,
                                    post_json, read_within, within)
from baton.protocol.errors import ApiError
from baton.protocol.requests import COMPLETIONS, ParsedRequest


log = logging.getLogger("baton.gateway")


class Flow:
    """Drives one request. ``request_migration`` may be called by a policy tick at any
    time; the relay acts on it between two tokens."""

    def __init__(self, parts: FlowParts, parsed: ParsedRequest, out: ClientOut,
                 state: RequestState, xid: str, prompt_ids: list[int] | None, client: str = "") -> None:
        control, engines = parts.control, parts.engines
        self.control, self.engines, self.cluster = control, engines, parts.cluster
        self.config, self.metrics = parts.config, parts.metrics
        self.parsed, self.out, self.state = parsed, out, state
        self.client_xid = xid  # echoed to the client and shown in admin; never sent to engines
        self.client = client  # whose in-flight share it takes (gateway.admission)
        self.prompt_ids = prompt_ids
        self.faults = LegFaults(parts, engines.rediscover)
        self.output_ids = IdLog()  # every relayed token's id, while ids_complete
        self.ids_complete = True
        self.leg: StreamLeg | None = None
        self.migrate_to: int | None = None
        self.path = "pd"
        self.leg_sent_s = 0.0  # when the current leg was sent (gateway clock)
        self.reason: str | None = None
        self.times = TokenTimes()  # as the client saw them
        self._prefill_task: asyncio.Task | None = None

    def _body(self, iid: int, body: dict[str, Any]) -> dict[str, Any]:
        return self.engines.body(iid, body, self.state.req_id, self.out.tokens)

    def _name(self, iid: int) -> str:
        return self.engines.name(iid)

    async def _open(self, leg: StreamLeg) -> None:
        """Send a streamed leg; no headers by the first-token deadline: a hung engine."""
        self.leg_sent_s = self.cluster.clock()
        try:
            await within(self.engines.first_token_deadline_s(leg.instance_id,
                                                              self.state.request.prompt_tokens + self.out.tokens),
                         f"opening a stream on {self._name(leg.instance_id)}",
                         leg.open(self.engines.session, self.engines.upstream_timeout))
        except UpstreamError:
            leg.close()
            raise
        self.faults.succeeded(leg.instance_id)

    @property
    def can_continue(self) -> bool:
        """A continuation needs the prompt ids and the id of every token relayed."""
        return self.prompt_ids is not None and self.ids_complete

    def request_migration(self, target: int) -> None:
        self.migrate_to = target

    # --- the whole request ---------------------------------------------------------------
    async def run(self):
        outcome = "error"
        try:
            await self._place()
            response = await self._relay()
            outcome = "ok"
            return response
        except ApiError as err:
            outcome = "rejected" if err.status in (429, 503) and not self.out.started else "error"
            return await self.out.fail(err)
        except (ConnectionResetError, asyncio.CancelledError):
            outcome = "client_abort"
            raise
        except Exception as exc:  # noqa: BLE001 - a bug or an answer nobody foresaw: never a lost stream
            log.exception("request %s failed unexpectedly", self.client_xid)
            return await self.out.fail(ApiError(502, f"gateway error while relaying: {type(exc).__name__}",
                                                err_type="server_error", code="backend_error"))
        finally:
            self._cleanup(outcome)

    def _cleanup(self, outcome: str) -> None:
        self.faults.settle()
        if self.leg is not None:
            self.leg.close()
        if self._prefill_task is not None and not self._prefill_task.done():
            self._prefill_task.cancel()
        self.control.end(self, outcome, self.out.tokens)
        log.debug("request %s: %s via %s, %d tokens", self.client_xid, outcome, self.path, self.out.tokens)

    # --- placement and first legs --------------------------------------------------------
    async def _place(self) -> None:
        plan = await self.control.place(self.state)
        p, d = plan.prefill_instance, plan.decode_instance
        if plan.prefill_chunk_limit_tokens is not None:
            self._count_deflection()
        elif d is not None:
            self._set_path("pd-early")
        if d == p or (d is None and self.cluster.role(p) is Role.MIXED):
            await self._colocated(p)
        elif self.config.pd_protocol == "sglang":
            await self._sglang(p, d)
        else:
            await self._nixl(p, d)

    async def _colocated(self, iid: int) -> None:
        if self.path != "deflected":
            self._set_path("colocated")
        self.cluster.colocate(self.state, iid)
        await self._open_decode(iid, handoff.colocated_body(self.parsed, self.engines.wants_ids(iid)), self.parsed.kind)

    async def _nixl(self, p: int, d: int | None) -> None:
        p, admitted, replan = await self.control.admit_prefill(self.state, p)
        if replan is not None:
            return await self._deflected(replan)
        self.cluster.begin_prefill(self.state)  # sent: no longer movable
        try:
            p, params = await self._prefill_leg(p)
        finally:
            self.control.prefill_sent(admitted)
        self.control.prefill_done(self.state, p)
        target = d if d is not None and self.cluster.healthy(d) else await self.control.pick_decode(self.state)
        self.cluster.expect_decode(self.state, target)
        await self._open_decode(target, handoff.decode_body(self.parsed, params, self.engines.wants_ids(target)),
                                self.parsed.kind)

    async def _deflected(self, replan: Deflect) -> None:
        """A held prefill re-planned onto a decode instance (booked by ``admit_prefill``):
        one colocated leg there (its engine's own chunk budget applies; vLLM has no
        per-request limit)."""
        self._count_deflection()
        await self._colocated(replan.instance)

    def _count_deflection(self) -> None:
        self._set_path("deflected")
        self.metrics.deflections.inc()

    def _set_path(self, path: str) -> None:
        self.path = path
        self.control.path_changed(self)

    async def _prefill_leg(self, p: int) -> tuple[int, dict[str, Any] | None]:
        """Run the prefill leg, moving to another prefill instance on engine faults."""
        body = handoff.prefill_body(self.parsed)
        for _ in range(self.config.max_recoveries + 1):
            self.leg_sent_s = self.cluster.clock()
            try:
                resp = await within(
                    self.engines.first_token_deadline_s(p, self.state.request.prompt_tokens), f"prefill on {self._name(p)}",
                    post_json(self.engines.session, self.engines.url(p) + endpoint(self.parsed.kind),
                              self._body(p, body), self.engines.headers(p), self.engines.upstream_timeout))
            except UpstreamError as err:
                await self.faults.failed(p, err, "prefill", self.cluster.clock() - self.leg_sent_s)
                self.metrics.child(self.metrics.retries, "prefill").inc()
                p = await self.faults.elsewhere(err, "prefill", lambda ex: self.control.pick_prefill(self.state, ex))
                continue
            self.faults.succeeded(p)
            counted = plausible_prompt_tokens((resp.get("usage") or {}).get("prompt_tokens"), self.prompt_ids,
                                              self.config.max_prompt_tokens)
            if counted is not None:
                self.cluster.set_prompt_tokens(self.state, counted)
                self.out.prompt_tokens = counted
            return p, resp.get("kv_transfer_params")
        raise ApiError(502, "prefill failed on every instance tried", err_type="server_error", code="backend_error")

    async def _sglang(self, p: int, d: int | None) -> None:
        target = d if d is not None else await self.control.pick_decode(self.state)
        spec = self.cluster.engines[p].spec
        room = self.engines.bootstrap_room()
        pre, dec = handoff.sglang_bodies(self.parsed, spec.host, spec.bootstrap_port, room,
                                         self.engines.wants_ids(target))
        url = self.engines.url(p) + endpoint(self.parsed.kind)
        self._prefill_task = asyncio.create_task(
            post_json(self.engines.session, url, self._body(p, pre), self.engines.headers(p), self.engines.upstream_timeout))
        self._prefill_task.add_done_callback(lambda t: self._sglang_prefill_done(p, t))
        self.cluster.expect_decode(self.state, target)
        await self._open_decode(target, dec, self.parsed.kind)

    def _sglang_prefill_done(self, p: int, task: asyncio.Task) -> None:
        if task.cancelled() or self.state.done:
            return
        if task.exception() is not None:
            self.control.backend_error(p, task.exception())  # the decode leg then fails or times out
            return
        self.control.prefill_done(self.state, p)

    def _first_leg(self, iid: int, kind: str, body: dict[str, Any]) -> StreamLeg:
        """A leg that starts the client's response: relayed verbatim when it turns out to
        speak the client's format (decided at its first chunk)."""
        leg = StreamLeg(iid, kind, self.engines.url(iid) + endpoint(kind), self._body(iid, body), self.engines.headers(iid))
        if self.config.verbatim_relay and self.parsed.stream and kind == self.parsed.kind and not self.out.started:
            leg.verbatim, leg.client_model, leg.null_ids = None, self.out.model, not self.out.with_ids
        return leg

    async def _open_decode(self, iid: int, body: dict[str, Any], kind: str) -> None:
        leg = self._first_leg(iid, kind, body)
        try:
            await self._open(leg)
        except UpstreamError as err:
            self.leg = leg
            await self._recover(iid, err)
            return
        self.leg = leg

    # --- relay -------------------------------------------------------------------------------
    async def _relay(self):
        while True:
            assert self.leg is not None
            leg = self.leg
            try:
                pieces = leg.ready()
                if not pieces and not leg.done:
                    pieces = await read_within(leg, lambda: self._read_deadline_s(leg), self.cluster.clock,
                                               f"stream from {self._name(leg.instance_id)}")
            except UpstreamError as err:
                if self._complete():  # the engine failed after the answer was whole: nothing to recover
                    self.control.backend_error(leg.instance_id, err)
                    return await self.out.finish(self.reason)
                await self._recover(self.leg.instance_id, err)
                continue
            tokens = sum(self._on_piece(piece) for piece in pieces)
            if tokens:  # the accounting once per read: one gap, not a burst of zero gaps
                self.metrics.tokens_relayed(self.times, self.cluster.clock(), self.path,
                                                    self._name(leg.instance_id), self.state.request.arrival_s)
                self.control.tokens(self.state, tokens)
            if self.leg.done:  # what this read brought goes out with the response's end
                return await self.out.finish(self.reason)
            await self.out.flush()
            if self.migrate_to is not None:
                if self._complete():  # nothing left to move: the finish chunk is on its way
                    self.migrate_to = None
                    self.cluster.migration_over(self.state, moved=False)
                else:
                    await self._migrate()

    def _read_deadline_s(self, leg: StreamLeg) -> float:
        """Before a leg's first token a whole prefill may come first; then the engine's pace."""
        if leg.received:
            return self.engines.token_timeout_s(leg.instance_id)
        return self.engines.first_token_deadline_s(leg.instance_id, self.state.request.prompt_tokens + self.out.tokens)

    def _complete(self) -> bool:
        """The client has the whole answer: a finish reason was relayed, or as many tokens as
        it asked for (a completions request without ``max_tokens``: the default; ``length``)."""
        cap = self.parsed.max_tokens
        if cap is None and self.parsed.kind == COMPLETIONS:
            cap = self.config.default_max_tokens
        if self.reason is None and cap is not None and self.out.tokens >= cap:
            self.reason = "length"
        return self.reason is not None

    def _on_piece(self, piece: Piece) -> int:
        """Relay one chunk to the client; returns its tokens (accounted per read)."""
        if piece.run is not None:
            return self._on_run(piece.run)
        if piece.prompt_token_ids and self.prompt_ids is None:
            self.prompt_ids = list(piece.prompt_token_ids)
            self.out.prompt_token_ids = self.prompt_ids
            self.cluster.set_prompt_tokens(self.state, len(self.prompt_ids))
        if piece.prompt_tokens and not self.out.prompt_tokens:
            # (a continuation's prompt holds the output too: _continuation sets it first)
            self.out.prompt_tokens = plausible_prompt_tokens(piece.prompt_tokens, self.prompt_ids,
                                                             self.config.max_prompt_tokens) or 0
        if piece.finish_reason:
            self.reason, self.out.stop_reason = piece.finish_reason, piece.stop_reason
        n = piece.tokens
        if n:
            if self.state.phase is not Phase.DECODE:
                self._joined()
            if piece.token_ids is not None:
                self.output_ids.add(piece.token_ids)
            else:
                self.ids_complete = False
        if piece.opens:  # the first chunk of a leg that speaks the client's format
            self.out.adopt(piece.payload)
        if self.leg.verbatim:
            self.out.add_verbatim(piece, n)
        elif n:
            self.out.add(piece.text, piece.token_ids, n)
        return n

    def _on_run(self, run: Run) -> int:
        """Relay a verbatim leg's ordinary events (``gateway.scan``: every token's id known)."""
        if run.tokens and self.state.phase is not Phase.DECODE:
            self._joined()
        self.output_ids.add_raw(run.ids)
        self.out.add_run(run, run.tokens)
        return run.tokens

    def _joined(self) -> None:
        """First token from the current decode leg."""
        if self.cluster.in_prefill_queue(self.state):
            self.control.prefill_done(self.state, self.state.prefill_instance)
        self.cluster.start_decode(self.state)

    # --- migration and recovery ---------------------------------------------------------------
    def _continuation(self, target: int) -> StreamLeg:
        body = handoff.continuation_body(self.parsed, self.prompt_ids or [], self.output_ids.all(),
                                         default_max_tokens=self.config.default_max_tokens,
                                         context_tokens=self.engines.names.context_tokens.get(target))
        if not self.out.prompt_tokens and self.prompt_ids:
            self.out.prompt_tokens = len(self.prompt_ids)
        return StreamLeg(target, COMPLETIONS, self.engines.url(target) + endpoint(COMPLETIONS),
                         self._body(target, body), self.engines.headers(target))

    def _move_to(self, target: int, leg: StreamLeg) -> None:
        if self.leg is not None:
            self.leg.close()
        self.out.leg_changed()
        self.cluster.move_decode(self.state, target)
        self.leg = leg

    async def _migrate(self) -> None:
        """Make before break: open the continuation on the target while the source keeps
        its place; only a target that answers 200 replaces the source."""
        target, self.migrate_to = self.migrate_to, None
        moved = False
        try:  # the request counts as migrating until it moved or stayed put
            moved = await self._migrate_to(target)
        finally:
            self.cluster.migration_over(self.state, moved)

    async def _migrate_to(self, target: int | None) -> bool:
        source = self.leg.instance_id if self.leg else None
        if target is None or target == source or not self.can_continue or not self.cluster.healthy(target):
            self.metrics.migrations.labels("refused").inc()
            log.info("request %s: migration to %s refused", self.client_xid,
                     "nowhere" if target is None else self._name(target))
            return False
        leg, sent_s = self._continuation(target), self.leg_sent_s
        try:
            await self._open(leg)
        except UpstreamError as err:
            self.leg_sent_s = sent_s  # the source leg goes on
            self.control.backend_error(target, err)
            self.metrics.migrations.labels("failed").inc()
            log.info("request %s: migration to %s failed; it stays put", self.client_xid, self._name(target))
            return False
        self._move_to(target, leg)
        self.leg_sent_s = float("-inf")  # a move the policy chose: its engine dying is no sign of a poison request
        self.metrics.migrations.labels("ok").inc()
        log.info("request %s: migrated from %s to %s after %d tokens", self.client_xid,
                 "?" if source is None else self._name(source), self._name(target), self.out.tokens)
        return True

    async def _recover(self, iid: int, err: UpstreamError) -> None:
        """The decode leg on ``iid`` failed: continue elsewhere when that is safe, else
        fail the request."""
        await self.faults.failed(iid, err, "decode", self.cluster.clock() - self.leg_sent_s)
        for _ in range(self.config.max_recoveries):  # attempts for this one failure
            target = await self.faults.elsewhere(err, "decode", lambda ex: self.control.pick_decode(self.state, ex))
            self.out.discard_unsent()  # a failed leg's chunks not yet sent go with it
            if self.can_continue:
                leg = self._continuation(target)
            elif self.out.tokens == 0:  # nothing sent yet: the original request can start over
                leg = self._first_leg(target, self.parsed.kind,
                                      handoff.colocated_body(self.parsed, self.engines.wants_ids(target)))
            else:
                break
            self._move_to(target, leg)
            try:
                await self._open(leg)
            except UpstreamError as err2:
                await self.faults.failed(target, err2, "decode", self.cluster.clock() - self.leg_sent_s)
                err = err2
                continue
            self.metrics.recoveries.inc()
            log.info("request %s: decode on %s failed (%s); recovered on %s after %d tokens", self.client_xid,
                     self._name(iid), err, self._name(target), self.out.tokens)
            return
        raise ApiError(502, f"engine failed mid-request and the request cannot be continued: {err}",
                       err_type="server_error", code="backend_error")
