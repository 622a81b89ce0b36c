"""The emulator's HTTP server: vLLM's OpenAI endpoints, ``/health``, ``/metrics`` and the
KV-handoff side channel (``/baton/kv/pull``) that decode instances read from."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiohttp import ClientSession, ClientTimeout, web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from baton.emulator.engine_loop import EngineLoop, LoopConfig, Sequence, SeqState, blocks_for
from baton.emulator.timings import RequestTimings
from baton.emulator.stops import StopPlan, plan_stop, stop_strings
from baton.emulator.tokens import prompt_ids, token_text
from baton.perf.model import PerfModel
from baton.emulator.hidden import HiddenPublisher
from baton.protocol.chunks import DONE, full_response, sse, stream_chunk, usage_chunk
from baton.protocol.errors import ApiError
from baton.protocol.kv_events import KvEventsConfig
from baton.protocol.requests import CHAT, COMPLETIONS, ParsedRequest, parse_json, parse_request

DEFAULT_MAX_TOKENS = 16


@dataclass(slots=True, frozen=True)
class EmulatorConfig:
    """One emulated instance. ``nic_gbps`` times KV pulls; ``disaggregation_mode``
    (``null``, ``prefill`` or ``decode``) says how SGLang bootstrap requests are served;
    held prefill KV is freed after ``kv_hold_timeout_s`` if nobody pulls it."""

    model: str = "baton-emulated"
    host: str = "127.0.0.1"
    port: int = 8100
    max_model_len: int = 32768
    nic_gbps: float = 100.0
    disaggregation_mode: str = "null"
    kv_hold_timeout_s: float = 30.0
    engine_id: str = ""
    hidden_states: str | None = None  # ZMQ address: publish synthetic hidden states (emulator.hidden)
    hidden_every_tokens: int = 16
    hidden_secret_key: str | None = field(default=None, repr=False)  # Z85: publish as a CURVE server
    hidden_client_keys: tuple[str, ...] = ()  # Z85 public keys of the gateways admitted (none: any)
    tokenizer: str | None = None  # a local tokenizer.json: prompts counted in its tokens, not words
    kv_events: str | None = None  # vLLM's --kv-events-config JSON (emulator/kv_publisher.py)


class _EngineMetrics:
    """Collector exposing the engine's state under vLLM's metric names."""

    def __init__(self, engine: EngineLoop, model: str, kv_bytes_per_token: int) -> None:
        self.engine, self.labels = engine, {"model_name": model, "engine": "0"}
        self.kv_bytes_per_token = kv_bytes_per_token

    def _cache_info(self) -> GaugeMetricFamily:
        """vLLM's ``cache_config_info``: the KV cache's shape in labels, value 1."""
        c = self.engine.config
        info = {"block_size": str(c.block_size), "num_gpu_blocks": str(c.kv_blocks),
                "kv_cache_size_tokens": str(c.kv_blocks * c.block_size),
                "kv_cache_memory_bytes": str(c.kv_blocks * c.block_size * self.kv_bytes_per_token),
                "enable_prefix_caching": str(c.engine.enable_prefix_caching), "engine": "0"}
        g = GaugeMetricFamily("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                              labels=list(info))
        g.add_metric(list(info.values()), 1.0)
        return g

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        g = GaugeMetricFamily(name, doc, labels=list(self.labels))
        g.add_metric(list(self.labels.values()), value)
        return g

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        c = CounterMetricFamily(name, doc, labels=list(self.labels))
        c.add_metric(list(self.labels.values()), value)
        return c

    def collect(self):
        b = self.engine
        yield self._gauge("vllm:num_requests_running", "Requests in the running batch", b.running)
        yield self._gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled", b.waiting)
        yield self._gauge("vllm:kv_cache_usage_perc", "KV-cache usage, 1 = 100%", b.kv_usage)
        yield self._counter("vllm:num_preemptions", "Preemptions", b.preemptions)
        yield self._counter("vllm:prompt_tokens", "Prefilled prompt tokens", b.prompt_tokens)
        yield self._counter("vllm:generation_tokens", "Generated tokens", b.generation_tokens)
        yield self._counter("vllm:request_success", "Finished requests", b.finished)
        if b.cache is not None:  # vLLM v1's prefix-cache counters, in tokens
            yield self._counter("vllm:prefix_cache_queries", "Prefix cache queries, in queried tokens",
                                b.cache.stats.queries)
            yield self._counter("vllm:prefix_cache_hits", "Prefix cache hits, in cached tokens", b.cache.stats.hits)
        yield self._cache_info()


class Emulator:
    """The server object: owns the engine (``engine_loop.EngineLoop``), the HTTP app and a
    client for KV pulls."""

    def __init__(self, config: EmulatorConfig, engine_config: LoopConfig, perf: PerfModel) -> None:
        self.config, self.perf = config, perf
        self.engine_id = config.engine_id or uuid.uuid4().hex[:12]
        self.registry = CollectorRegistry()
        self.publisher = None
        if config.kv_events:
            events = KvEventsConfig.from_json(config.kv_events)
            if events.enabled:
                from baton.emulator.kv_publisher import KvEventPublisher
                self.publisher = KvEventPublisher(events, engine_config.block_size)
        self.engine = EngineLoop(engine_config, perf, RequestTimings(self.registry, config.model), self.publisher)
        self.registry.register(_EngineMetrics(self.engine, config.model, perf.kv_bytes_per_token))
        self._rooms: dict[int, asyncio.Future] = {}
        self._session: ClientSession | None = None
        self._tasks: list[asyncio.Task] = []
        self.encode = None
        if config.tokenizer:
            from baton.workload.tokens import HFTokenizer
            self.encode = HFTokenizer(config.tokenizer).ids
        self.hidden = HiddenPublisher(config.hidden_states, config.hidden_every_tokens,
                                      secret_key=config.hidden_secret_key,
                                      client_keys=config.hidden_client_keys) if config.hidden_states else None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_post("/baton/kv/pull", self.kv_pull)
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
        return app

    async def _start(self, _app: web.Application) -> None:
        self._session = ClientSession(timeout=ClientTimeout(total=None, sock_connect=5))
        self._tasks.append(asyncio.create_task(self.engine.run()))

    async def _stop(self, _app: web.Application) -> None:
        for t in self._tasks:
            t.cancel()
        if self.publisher is not None:
            self.publisher.close()
        if self._session is not None:
            await self._session.close()

    # --- small endpoints ---------------------------------------------------------------
    async def health(self, _request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def models(self, _request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": self.config.model, "object": "model", "created": 0, "owned_by": "baton",
             "max_model_len": self.config.max_model_len}]})

    async def metrics(self, _request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.registry),
                            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    # --- generation ----------------------------------------------------------------------
    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, COMPLETIONS)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, CHAT)

    async def _generate(self, request: web.Request, kind: str) -> web.StreamResponse:
        try:
            parsed = parse_request(kind, parse_json(await request.read()))
            model = parsed.body.get("model")
            if model is not None and model != self.config.model:  # as vLLM answers
                raise ApiError(404, f"The model `{model}` does not exist.", err_type="NotFoundError",
                               param="model", code="model_not_found")
            ids = prompt_ids(kind, parsed.body, self.encode)
            stops = stop_strings(parsed.body)
            seq = self._sequence(request, parsed, ids)
            stop = None if seq.prefill_only else plan_stop(stops, len(ids), seq.max_new,
                                                              bool(parsed.body.get("include_stop_str_in_output")))
            if stop is not None:
                seq.max_new, seq.finish_reason = stop.tokens, "stop"
            await self._place(seq, parsed.body)
        except ApiError as exc:
            return web.json_response(exc.body(), status=exc.status)
        try:
            if parsed.stream:
                return await self._stream(request, parsed, seq, ids, stop)
            return await self._collect(parsed, seq, ids, stop)
        finally:
            if seq.state is not SeqState.DONE and seq.state is not SeqState.HELD:
                self.engine.abort(seq)

    def _sequence(self, request: web.Request, parsed: ParsedRequest, ids: list[int]) -> Sequence:
        # vLLM's defaults: 16 for completions (an explicit null too), the rest of the context for chat
        max_new = parsed.max_tokens or (max(self.config.max_model_len - len(ids), 1) if parsed.kind == CHAT
                                        else DEFAULT_MAX_TOKENS)
        if len(ids) + max_new > self.config.max_model_len:
            raise ApiError(400, f"prompt ({len(ids)} tokens) plus max_tokens ({max_new}) exceeds "
                                f"max_model_len {self.config.max_model_len}", param="max_tokens")
        bc = self.engine.config
        if blocks_for(len(ids) + max_new, bc.block_size) > bc.kv_blocks:
            raise ApiError(400, "request needs more KV blocks than this instance has", param="max_tokens")
        kvp = parsed.body.get("kv_transfer_params") or {}
        prefill_only = bool(kvp.get("do_remote_decode")) or self._sglang_role(parsed.body) == "prefill"
        # vLLM names a request (its id inside the engine, in kv_transfer_params and in the
        # response) by the endpoint's prefix and the caller's X-Request-Id
        rid = f"{'chatcmpl' if parsed.kind == CHAT else 'cmpl'}-{request.headers.get('X-Request-Id') or uuid.uuid4().hex}"
        return Sequence(rid, len(ids), 1 if prefill_only else max_new, prefill_only=prefill_only,
                        prompt_ids=tuple(ids))

    def _sglang_role(self, body: dict[str, Any]) -> str | None:
        if body.get("bootstrap_room") is None or self.config.disaggregation_mode == "null":
            return None
        return self.config.disaggregation_mode

    async def _place(self, seq: Sequence, body: dict[str, Any]) -> None:
        """Prefill here, or pull the prompt's KV from the prefill instance and decode."""
        kvp = body.get("kv_transfer_params") or {}
        if kvp.get("do_remote_prefill") and kvp.get("remote_host"):
            source = (kvp["remote_host"], kvp.get("remote_port"), {"request_id": kvp.get("remote_request_id")})
        elif self._sglang_role(body) == "decode":
            source = (body.get("bootstrap_host"), body.get("bootstrap_port"), {"room": body["bootstrap_room"]})
        else:
            if seq.prefill_only and self._sglang_role(body) == "prefill":
                self._rooms.setdefault(int(body["bootstrap_room"]), asyncio.get_running_loop().create_future())
                seq.rid = f"room:{body['bootstrap_room']}"
            self.engine.submit(seq)
            return
        await self._pull_then_decode(seq, *source)

    async def _pull_then_decode(self, seq: Sequence, host: str, port: Any, key: dict[str, Any]) -> None:
        blocks = blocks_for(seq.prompt_len + 1, self.engine.config.block_size)
        if not await self.engine.reserve(blocks, timeout_s=60.0):
            raise ApiError(503, "no KV blocks free for the transfer", err_type="server_error")
        try:
            assert self._session is not None
            url = f"http://{host}:{port}/baton/kv/pull"
            async with self._session.post(url, json={**key, "nic_gbps": self.config.nic_gbps}) as resp:
                ok = resp.status == 200
        except (OSError, asyncio.TimeoutError, ValueError):
            ok = False
        except BaseException:  # the client went away mid-pull (cancelled): the blocks were for it alone
            self.engine.unreserve(blocks)
            raise
        if ok:
            self.engine.join_decode(seq, blocks)
        else:  # like vLLM: a failed pull falls back to prefilling locally
            self.engine.unreserve(blocks)
            self.engine.submit(seq)

    async def kv_pull(self, request: web.Request) -> web.Response:
        """Side channel: a decode instance reads a held prefill's KV (timed transfer)."""
        try:
            key = await request.json()
        except ValueError:
            return web.json_response({"error": "bad pull body"}, status=400)
        rid = key.get("request_id") or f"room:{key.get('room')}"
        if key.get("room") is not None:
            fut = self._rooms.setdefault(int(key["room"]), asyncio.get_running_loop().create_future())
            try:
                await asyncio.wait_for(asyncio.shield(fut), self.config.kv_hold_timeout_s)
            except asyncio.TimeoutError:
                return web.json_response({"error": "unknown room"}, status=404)
        seq = self.engine.held.get(rid)
        if seq is None:
            return web.json_response({"error": f"no held KV for {rid}"}, status=404)
        nbytes = self.perf.kv_bytes(seq.prompt_len)
        gbps = min(self.config.nic_gbps, float(key.get("nic_gbps") or self.config.nic_gbps))
        await asyncio.sleep(self.perf.transfer_time_s(nbytes, gbps * 1e9 / 8) * self.engine.config.time_scale)
        self.engine.release_held(rid)
        if key.get("room") is not None:
            self._rooms.pop(int(key["room"]), None)
        return web.json_response({"tokens": seq.prompt_len, "bytes": nbytes})

    def _hold(self, seq: Sequence) -> None:
        """Keep a finished prefill's KV for a later pull, freed after the timeout."""
        if seq.rid.startswith("room:"):
            fut = self._rooms.setdefault(int(seq.rid[5:]), asyncio.get_running_loop().create_future())
            if not fut.done():
                fut.set_result(True)
        asyncio.get_running_loop().call_later(self.config.kv_hold_timeout_s, self.engine.release_held, seq.rid)

    def _transfer_params(self, seq: Sequence) -> dict[str, Any]:
        return {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": self.engine_id,
                "remote_block_ids": list(range(blocks_for(seq.prompt_len, self.engine.config.block_size))),
                "remote_host": self.config.host, "remote_port": self.config.port,
                "remote_request_id": seq.rid, "tp_size": 1}

    async def _collect(self, parsed: ParsedRequest, seq: Sequence, ids: list[int],
                       stop: StopPlan | None) -> web.Response:
        positions, reason = [], None
        while reason is None:
            kind, value = await seq.events.get()
            if kind == "token":
                positions.append(value)
            else:
                reason = value
        with_ids = bool(parsed.body.get("return_token_ids"))
        text = "".join(token_text(p) for p in positions)
        out = full_response(parsed.kind, seq.rid, self.config.model, int(time.time()),
                            text[:stop.text_chars] if stop else text, reason, len(ids), len(positions),
                            positions if with_ids else None, ids if with_ids else None)
        if stop is not None:
            out["choices"][0]["stop_reason"] = stop.stop_str
        if seq.prefill_only and seq.state is SeqState.HELD:
            self._hold(seq)
            out["kv_transfer_params"] = self._transfer_params(seq)
        return web.json_response(out)

    async def _stream(self, request: web.Request, parsed: ParsedRequest, seq: Sequence,
                      ids: list[int], stop: StopPlan | None) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        with_ids, created, first = bool(parsed.body.get("return_token_ids")), int(time.time()), True
        # a prefill-only leg does not know the answer's length: no synthetic state for it
        tag = (parsed.body.get("vllm_xargs") or {}).get("baton_tag") if self.hidden and not seq.prefill_only else None
        n_gen, sent_chars = 0, 0
        while True:
            kind, value = await seq.events.get()
            if kind == "done":
                break
            n_gen += 1
            if tag is not None and self.hidden.due(n_gen):
                self.hidden.publish(str(tag), n_gen, seq.max_new)
            text = token_text(value)
            if stop is not None:  # the stop string and what follows it are never sent
                text, sent_chars = text[:max(0, stop.text_chars - sent_chars)], sent_chars + len(text)
            chunk = stream_chunk(parsed.kind, seq.rid, self.config.model, created, text,
                                 None, [value] if with_ids else None, first, ids if first and with_ids else None)
            first = False
            await resp.write(sse(chunk))
        last = stream_chunk(parsed.kind, seq.rid, self.config.model, created, "", value)
        if stop is not None:
            last["choices"][0]["stop_reason"] = stop.stop_str
        await resp.write(sse(last))
        if parsed.include_usage:
            await resp.write(sse(usage_chunk(parsed.kind, seq.rid, self.config.model, created,
                                             len(ids), seq.generated)))
        await resp.write(DONE)
        if seq.prefill_only and seq.state is SeqState.HELD:
            self._hold(seq)
        return resp
