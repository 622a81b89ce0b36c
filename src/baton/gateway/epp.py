"""``baton epp``: Baton's policies as a Gateway API Inference Extension endpoint picker.

Envoy (or any data plane that speaks GIE's endpoint picker protocol) relays the tokens;
this server only picks. Per HTTP request Envoy opens one ext_proc stream
(``envoy.service.ext_proc.v3.ExternalProcessor/Process``) and sends the request headers,
the buffered body, the response headers and (``epp_response_bodies``) the streamed
response body. The picker reads the body as ``baton serve`` does (same validation, same
prompt estimate), asks the same ``Control`` for a plan, books it in the same
``LiveCluster``, and answers with the pick in the ``x-gateway-destination-endpoint`` header
and in the ``envoy.lb`` dynamic metadata (``clear_route_cache`` set, so the route is chosen
again with it). Nothing eligible: an immediate 503; an overloaded picker: 429. A subset hint
(``envoy.lb.subset_hint``) limits the pick to those endpoints; the endpoint the data plane
reports as served (``x-gateway-destination-endpoint-served``) corrects the booking. The
request's bookings are released when its stream closes, which Envoy does when the HTTP
response ends (with response bodies) or at the response headers (without).

Prefill/decode placement goes through ``baton sidecar`` (``gateway.sidecar``): the pick is
the decode engine's sidecar, and the prefill engine is named in ``x-prefiller-host-port``
and ``x-gateway-prefill-endpoints``, as llm-d does it. A picker routes at arrival, so a
late-binding policy's decode instance is chosen at arrival here (``choose_decode``), not
when the prefill ends. The sidecar's answer headers mark the prefill done.

What this runtime cannot do is refused at start (``check_policy``): decisions that act on a
live stream (``Migrate``: ARES, llumnix, CascadeInfer), decode engines without a sidecar,
and SGLang's PD protocol.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import orjson

from baton.core.errors import ConfigError
from baton.core.instance import Role
from baton.core.request import Phase, RequestState
from baton.gateway.auth import key_id, presented_token, token_matches
from baton.gateway.urls import endpoint_address
from baton.gateway.metrics import TokenTimes
from baton.gateway.upstream import MAX_ANSWER_BYTES, StreamLeg, UpstreamError
from baton.protocol.errors import ApiError
from baton.protocol.requests import CHAT, COMPLETIONS

log = logging.getLogger("baton.epp")

DEST = "x-gateway-destination-endpoint"
PREFILL_HEADERS = ("x-prefiller-host-port", "x-gateway-prefill-endpoints")  # llm-d's and GIE's
SERVED = "x-gateway-destination-endpoint-served"
LB_NAMESPACE = "envoy.lb"
SUBSET_NAMESPACE, SUBSET_KEY = "envoy.lb.subset_hint", "x-gateway-destination-endpoint-subset"
KINDS = {"/v1/completions": COMPLETIONS, "/v1/chat/completions": CHAT}


def check_policy(gateway) -> None:
    """ConfigError (one line naming ``baton serve``) for what EPP mode cannot carry out."""
    splicing = [s.name for s in gateway.scheduler.stages if getattr(s, "splices_streams", False)]
    if splicing:
        raise ConfigError(f"policy {gateway.scheduler.name!r} moves live streams ({', '.join(splicing)}), "
                          "which an endpoint picker cannot do: run it with `baton serve`")
    bare = [e.name for e in gateway.config.engines if e.role is Role.DECODE and not e.sidecar]
    if bare:
        raise ConfigError(f"decode engines {', '.join(bare)} have no sidecar: prefill/decode placement behind a "
                          "picker needs `baton sidecar` beside each (engines[i].sidecar), or run with `baton serve`")
    if gateway.config.pd_protocol != "nixl" and any(e.role is not Role.MIXED for e in gateway.config.engines):
        raise ConfigError("pd_protocol sglang behind a picker is not supported yet: run it with `baton serve`")


def sidecar_address(cluster, iid: int) -> str:
    """``host:port`` of a decode engine's sidecar (503 when it has none)."""
    url = cluster.engines[iid].spec.sidecar
    if url is None:
        raise ApiError(503, f"the policy chose {cluster.engines[iid].spec.name} to decode, which has no sidecar",
                       err_type="server_error")
    return endpoint_address(url)


@dataclass(slots=True)
class Pick:
    """One request picked by the EPP: what ``Control`` keeps of a request in flight."""

    state: RequestState
    client_xid: str
    kind: str
    path: str = "colocated"
    client: str = ""  # behind Envoy every client has its address: shares are not counted here
    times: TokenTimes = field(default_factory=TokenTimes)
    tokens: int = 0
    status: int | None = None
    finished: bool = False

    def request_migration(self, target: int) -> None:
        """Never asked: policies that move streams are refused at start (``check_policy``)."""


class Exchange:
    """One ext_proc stream: one HTTP request from headers to the end of its response."""

    def __init__(self, gateway, pb) -> None:
        self.gw, self.pb = gateway, pb
        self.headers: dict[str, str] = {}
        self.body = bytearray()
        self.pick: Pick | None = None
        self.reader: StreamLeg | None = None  # a streamed answer's parser (epp_response_bodies)
        self.whole: bytearray | None = None  # a non-streamed answer, read at its end for its usage
        self.prefiller: str | None = None  # a PD request's prefill endpoint (its decode sidecar is the pick)
        self.admitted: int | None = None  # the instance whose prefill hold let this request go
        self.failed = False  # its answer carried an error (or could not be read)

    # --- request ---------------------------------------------------------------------------
    async def answer(self, req) -> Any:
        which = req.WhichOneof("request")
        try:
            if which == "request_headers":
                return self._headers(req)
            if which == "request_body":
                return await self._body(req)
            if which == "response_headers":
                return self._response_headers(req)
            if which == "response_body":
                return self._response_body(req)
        except ApiError as err:
            return self._immediate(err)
        return self.pb.ProcessingResponse()

    def _headers(self, req) -> Any:
        for h in req.request_headers.headers.headers:
            self.headers[h.key.lower()] = h.raw_value.decode("utf-8", "replace") if h.raw_value else h.value
        path = self.headers.get(":path", "").split("?", 1)[0]
        if path not in KINDS:
            raise ApiError(404, f"no endpoint picking for {path or 'this path'}: /v1/completions and "
                                "/v1/chat/completions are served")
        keys = self.gw.config.api_keys
        if keys and not token_matches(self.headers.get("authorization"), keys):
            raise ApiError(401, "a valid API key is required (Authorization: Bearer <key>)",
                           err_type="invalid_request_error", code="invalid_api_key")
        if req.request_headers.end_of_stream:
            raise ApiError(400, "a request body is required")
        return self.pb.ProcessingResponse(request_headers=self.pb.HeadersResponse())

    async def _body(self, req) -> Any:
        self.body += req.request_body.body
        if len(self.body) > self.gw.config.max_body_bytes:
            raise ApiError(413, f"request body exceeds {self.gw.config.max_body_bytes} bytes (max_body_bytes)",
                           code="request_too_large")
        if not req.request_body.end_of_stream:
            return self.pb.ProcessingResponse(request_body=self.pb.BodyResponse())
        subset = self._subset(req)
        state = self._admit(KINDS[self.headers[":path"].split("?", 1)[0]], bytes(self.body))
        addr = await self.gw.control.admission.place(state, lambda st: self._route(st, subset))
        if self.prefiller is not None and self.gw.control.hold.enabled:
            addr = await self._held(addr)
        sets = [(DEST, addr)] + [(h, self.prefiller) for h in PREFILL_HEADERS if self.prefiller]
        mutation = self.pb.HeaderMutation(set_headers=[self.pb.HeaderValueOption(
            header=self.pb.HeaderValue(key=key, raw_value=value.encode()),
            append_action=self.pb.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD) for key, value in sets])
        meta = self.pb.Struct()
        meta.update({LB_NAMESPACE: {DEST: addr}})
        return self.pb.ProcessingResponse(
            request_body=self.pb.BodyResponse(response=self.pb.CommonResponse(header_mutation=mutation,
                                                                              clear_route_cache=True)),
            dynamic_metadata=meta)

    def _admit(self, kind: str, raw: bytes) -> RequestState:
        """Parse and check the request, and track it (its stream's end releases it)."""
        gw = self.gw
        if len(gw.control.flows) >= gw.config.max_inflight:
            raise gw.overload()
        parsed = gw.parse(kind, raw)
        token = presented_token(self.headers.get("authorization")) if gw.config.api_keys else None
        state, ids = gw.new_state(kind, parsed, self.headers, key_id(token) if token else "")
        pick = Pick(state, self.headers.get("x-request-id") or gw.engines.ids.next(), kind)
        gw.control.admit(pick)
        self.pick = pick  # from here on the stream's end releases it
        if gw.config.epp_response_bodies:
            self.reader = StreamLeg(None, kind, "", {}, {})
            self.reader.fast = self.reader.counting = True  # byte counts, each event parsed only when needed
        return state

    def _route(self, state: RequestState, subset: set[str] | None) -> str:
        """Place the request (once flow control lets it go); its endpoint as ``host:port``."""
        gw = self.gw
        plan = gw.control.plan(state)
        p, d = plan.prefill_instance, plan.decode_instance
        cluster = gw.cluster
        if d is None and not cluster.instances[p].role.decodes:  # the picker routes now: decode chosen now
            d = gw.control.choose_decode(state)
        if d is not None and d != p:  # PD: to the decode engine's sidecar, naming the prefill engine
            cluster.bind(state, p, d, plan.prefill_chunk_limit_tokens)
            self.prefiller, self.pick.path = cluster.address(p), "pd"
            addr = ",".join([sidecar_address(cluster, d), *self._sidecar_fallbacks(d, subset)])
        else:
            if subset is not None and cluster.address(p) not in subset:
                p = self._within(subset)
            cluster.bind(state, p, None, plan.prefill_chunk_limit_tokens)
            cluster.colocate(state, p)  # a colocated leg, booked as baton serve books one
            if plan.prefill_chunk_limit_tokens is not None:
                self._deflected()
            addr = ",".join([cluster.address(p), *self._fallbacks(p, subset)])
        if self.reader is not None:
            self.reader.instance_id = state.decode_instance
        return addr

    async def _held(self, addr: str) -> str:
        """Kairos-style policies re-plan queued prefills: the answer to Envoy waits while the
        prefill engine is busy (``gateway.holding``), and a re-plan sends the request whole
        to the decode-capable instance instead (deflection, no sidecar leg)."""
        gw, st = self.gw, self.pick.state
        p, self.admitted, replan = await gw.control.admit_prefill(st, st.prefill_instance)
        if replan is None:
            if p != self.admitted:  # held on an instance that left the prefill side: another prefills
                self.prefiller = gw.cluster.address(p)
            return addr
        self.admitted = None  # a re-plan is no leg of the hold's
        self._deflected()
        self.prefiller = None
        if self.reader is not None:
            self.reader.instance_id = replan.instance
        return gw.cluster.address(replan.instance)

    def _deflected(self) -> None:
        self.pick.path = "deflected"
        self.gw.control.metrics.deflections.inc()

    def _fallbacks(self, picked: int, subset: set[str] | None) -> list[str]:
        """Up to ``epp_fallbacks`` other healthy instances that take whole requests, least
        token-loaded first: where the data plane retries when the pick cannot be reached
        (the served endpoint it reports then moves the booking)."""
        gw = self.gw
        n = 0 if gw.config.discovery is not None else gw.config.epp_fallbacks
        if not n:
            return []
        view, cluster = gw.cluster.view, gw.cluster
        ids = [i for i in view.decode_ids if i != picked and cluster.instances[i].role.prefills
               and (subset is None or cluster.address(i) in subset)]
        return [cluster.address(i) for i in sorted(ids, key=view.token_load)[:n]]

    def _sidecar_fallbacks(self, picked: int, subset: set[str] | None) -> list[str]:
        """A PD pick's fallbacks: up to ``epp_fallbacks`` other healthy decode instances'
        sidecars, least token-loaded first, with the same prefill engine named (the
        sidecar that serves is reported back, and the decode booking follows it)."""
        n = 0 if self.gw.config.discovery is not None else self.gw.config.epp_fallbacks
        view = self.gw.cluster.view
        address = {iid: addr for addr, iid in self._sidecars().items()}
        ids = [i for i in view.decode_ids if i != picked and i in address
               and (subset is None or address[i] in subset)]
        return [address[i] for i in sorted(ids, key=view.token_load)[:n]]

    def _sidecars(self) -> dict[str, int]:
        """``host:port`` of each decode instance's sidecar -> its instance id."""
        cluster = self.gw.cluster
        return {endpoint_address(e.spec.sidecar): iid for iid, e in cluster.engines.items() if e.spec.sidecar}

    def _within(self, subset: set[str]) -> int:
        """The policy's pick was outside the data plane's subset: the least-loaded healthy
        instance inside it (503 when none)."""
        cluster = self.gw.cluster
        ids = [i for i in cluster.view.decode_ids if cluster.address(i) in subset]
        if not ids:
            raise ApiError(503, "no healthy instance in the endpoint subset", err_type="server_error")
        return min(ids, key=cluster.view.token_load)

    @staticmethod
    def _subset(req) -> set[str] | None:
        meta = req.metadata_context.filter_metadata
        if SUBSET_NAMESPACE not in meta or SUBSET_KEY not in meta[SUBSET_NAMESPACE].fields:
            return None
        value = meta[SUBSET_NAMESPACE].fields[SUBSET_KEY]
        items = [v.string_value for v in value.list_value.values] if value.HasField("list_value") \
            else value.string_value.split(",")
        return {s.strip() for s in items if s.strip()}

    # --- response --------------------------------------------------------------------------
    def _response_headers(self, req) -> Any:
        pick = self.pick
        if pick is not None:
            for h in req.response_headers.headers.headers:
                value = (h.raw_value or h.value.encode()).decode("utf-8", "replace")
                if h.key == ":status":
                    pick.status = int(value) if value.isdigit() else 0
                elif h.key == "content-type" and self.reader is not None and "event-stream" not in value:
                    self.reader, self.whole = None, bytearray()  # not streamed: whole, at its end
            served = self._served(req)
            if self.prefiller is not None:
                side = self._sidecars().get(served) if served else None
                if side is not None and side != pick.state.decode_instance:  # a retry reached another sidecar
                    self.gw.cluster.rebind_decode(pick.state, side)
                    if self.reader is not None:
                        self.reader.instance_id = side
                if pick.status == 200:  # the sidecar's prefill leg is over
                    self._prefilled()
                served = None
            iid = self.gw.cluster.by_address(served) if served else None
            if iid is not None and iid != pick.state.prefill_instance:  # a retry landed elsewhere
                self.gw.cluster.rebind_prefill(pick.state, iid)
                self.gw.cluster.colocate(pick.state, iid)
                if self.reader is not None:
                    self.reader.instance_id = iid
            if self.reader is None and pick.status == 200:  # no bodies: it counts as decoding now
                self._joined()
        return self.pb.ProcessingResponse(response_headers=self.pb.HeadersResponse())

    @staticmethod
    def _served(req) -> str | None:
        meta = req.metadata_context.filter_metadata
        if LB_NAMESPACE in meta and SERVED in meta[LB_NAMESPACE].fields:
            return meta[LB_NAMESPACE].fields[SERVED].string_value or None
        return None

    def _response_body(self, req) -> Any:
        if self.whole is not None:
            return self._whole_body(req)
        pick, reader = self.pick, self.reader
        if pick is not None and reader is not None and pick.status == 200:
            try:
                pieces = reader.feed(req.response_body.body)
            except UpstreamError as err:  # an error event, or not a stream we can read: it failed
                log.debug("request %s: response not counted: %s", pick.client_xid, err)
                self.reader, self.failed = None, True
                pieces = []
            tokens = sum(p.tokens for p in pieces)
            pick.finished = pick.finished or reader.finished or any(p.finish_reason for p in pieces)
            if tokens:
                self._relayed(tokens)
        return self.pb.ProcessingResponse(response_body=self.pb.BodyResponse())

    def _whole_body(self, req) -> Any:
        """A non-streamed answer: its tokens (``usage.completion_tokens``) when it ends;
        until then the request stays booked as a queued prefill (nothing shows progress)."""
        whole, pick = self.whole, self.pick
        whole += req.response_body.body
        if len(whole) > MAX_ANSWER_BYTES:
            self.whole = None
        elif req.response_body.end_of_stream and pick is not None and pick.status == 200:
            try:
                tokens = orjson.loads(bytes(whole)).get("usage", {}).get("completion_tokens")
            except (ValueError, AttributeError):
                tokens = None
            if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens > 0:
                pick.finished = True
                self._relayed(tokens)
        return self.pb.ProcessingResponse(response_body=self.pb.BodyResponse())

    def _prefilled(self) -> None:
        self._sent_done()
        st, cluster = self.pick.state, self.gw.cluster
        p = st.prefill_instance
        if cluster.in_prefill_queue(st):
            self.gw.control.prefill_done(st, p)
            cluster.expect_decode(st, st.decode_instance)

    def _sent_done(self) -> None:
        """The held prefill's leg is over (or never will be): the next may go."""
        if self.admitted is not None:
            self.gw.control.prefill_sent(self.admitted)
            self.admitted = None

    def _joined(self) -> None:
        st, control = self.pick.state, self.gw.control
        if st.phase is Phase.DECODE:
            return
        if self.gw.cluster.in_prefill_queue(st):
            control.prefill_done(st, st.prefill_instance)
        self.gw.cluster.start_decode(st)

    def _relayed(self, tokens: int) -> None:
        pick, control = self.pick, self.gw.control
        self._joined()
        pick.tokens += tokens
        control.metrics.tokens_relayed(pick.times, self.gw.cluster.clock(), pick.path,
                                       self.gw.engines.name(pick.state.decode_instance), pick.state.request.arrival_s)
        self.gw.cluster.token(pick.state, tokens)
        control.check_watch(pick.state)

    def _immediate(self, err: ApiError) -> Any:
        self.gw.metrics.responses.labels(str(err.status), err.err_type).inc()
        return self.pb.ProcessingResponse(immediate_response=self.pb.ImmediateResponse(
            status=self.pb.HttpStatus(code=err.status), body=orjson.dumps(err.body()),
            headers=self.pb.HeaderMutation(set_headers=[self.pb.HeaderValueOption(
                header=self.pb.HeaderValue(key=k, raw_value=v.encode()))
                for k, v in {"content-type": "application/json", **err.headers()}.items()]),
            details=err.message[:200]))

    def close(self) -> None:
        """The stream closed: release whatever the request holds."""
        self._sent_done()
        pick = self.pick
        if pick is None:
            return
        self.pick = None
        seen = self.gw.config.epp_response_bodies  # the picker reads answers: their ends and lengths
        if pick.status != 200 or self.failed:
            outcome = "error" if pick.status is not None else "client_abort"
        elif seen and not pick.finished:
            outcome = "client_abort"  # the stream closed before the answer's end
        else:
            outcome = "ok"
        self.gw.control.end(pick, outcome, pick.tokens, length_known=seen)
