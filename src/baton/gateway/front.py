"""The client side of a gateway process: the OpenAI endpoints, reading, parsing and
validating bodies, a request's state before placement, and refusals. ``baton serve``'s one
process (``server.Gateway``) and its relay workers (``relay.Relay``) are both a ``Front``
over a control: the one in the process, or one reached over IPC (``relay_control``).
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from baton.core.errors import BatonError, ConfigError
from baton.core.prefix import token_block_keys
from baton.core.request import RequestState
from baton.gateway.bodies import BodyLimits, BodyReads, decode_body
from baton.gateway.classes import Classes
from baton.gateway.client import ClientOut
from baton.gateway.config import GatewayConfig
from baton.gateway.engines import Engines
from baton.gateway.flow import Flow
from baton.gateway.flow_parts import FlowParts
from baton.gateway.live import LiveCluster
from baton.gateway.metrics import GatewayMetrics
from baton.gateway.guards import json_bodies_only
from baton.gateway.listener import head_middleware
from baton.gateway.middleware import client_keys, client_of, counted, json_errors, mark_error
from baton.gateway.ratelog import RateLimitedLog
from baton.protocol.errors import ApiError
from baton.protocol.requests import CHAT, COMPLETIONS, RESPONSE_ID_PREFIX, TRANSPORT_FIELDS, ParsedRequest

# Decoding and validating a token-id body costs 40-80 ns per byte here (a 1.9 MB body
# 75-150 ms). Up to 64 KiB (a few ms) it runs inline; larger bodies go to one parse
# thread, so the event loop runs between them instead of behind every body that arrived
# at once. The validation is Python code, which yields the GIL to the loop every 5 ms;
# orjson's decode holds it (about half the time), so each decode still pauses the loop
# for up to 20 ns per byte: max_body_bytes bounds that pause (about 40 ms at 2 MiB).
INLINE_PARSE_BYTES = 64 * 1024
PARSE_THREADS = 1  # the GIL serialises the work anyway; more threads only contend with the loop


def estimate_prompt_tokens(kind: str, body: dict[str, Any]) -> tuple[int, list[int] | None]:
    """Prompt length before any engine has tokenised it: exact for token-id prompts,
    else about four characters per token (corrected when the engine reports usage)."""
    if kind == COMPLETIONS and isinstance(body["prompt"], list):
        return len(body["prompt"]), list(body["prompt"])
    if kind == COMPLETIONS:
        return max(1, len(body["prompt"]) // 4), None
    chars = sum(content_chars(m.get("content")) for m in body["messages"])
    return max(1, chars // 4 + 4 * len(body["messages"])), None


# A media part's token cost is the model's processor's, not known here; these are sized on
# common open models (in tokens; the estimate counts four characters a token):
MEDIA_PART_TOKENS = 1024  # an image by URL or embedding, or any other part: Qwen2-VL at 1024x1024 is about
#                           1,340, LLaVA-1.5 576, one Llama 3.2 vision tile about 1,600
AUDIO_BYTES_PER_TOKEN = 640  # inline audio: 16 kHz 16-bit mono is 32,000 bytes a second, and audio encoders
#                              (Whisper's) give 50 frames a second
VIDEO_BYTES_PER_TOKEN = 2048  # inline video: no better rule without decoding it
MEDIA_PART_CHARS = 4 * MEDIA_PART_TOKENS


MEDIA_MIN_TOKENS = 64  # the least an inline clip counts (its container and prompt tokens)
_BYTES_PER_TOKEN = {"input_audio": AUDIO_BYTES_PER_TOKEN, "audio_url": AUDIO_BYTES_PER_TOKEN,
                    "video_url": VIDEO_BYTES_PER_TOKEN}


def _media_chars(part: dict[str, Any]) -> int:
    """Characters to count for a media part: inline audio or video (base64 audio, or a data
    URL) by its decoded size, anything else ``MEDIA_PART_TOKENS``."""
    kind = part.get("type")
    per_token, value = _BYTES_PER_TOKEN.get(kind), part.get(kind)
    if per_token is None or not isinstance(value, dict):
        return MEDIA_PART_CHARS
    inline = value.get("data") if kind == "input_audio" else value.get("url")
    if not isinstance(inline, str) or (kind != "input_audio" and not inline.startswith("data:")):
        return MEDIA_PART_CHARS
    encoded = len(inline) - inline.find(",") - 1 if inline.startswith("data:") else len(inline)
    return 4 * max(MEDIA_MIN_TOKENS, encoded * 3 // 4 // per_token)


def content_chars(content: Any) -> int:
    """Characters of a chat message's content: a string, or every text (and refusal) part
    of the parts form the OpenAI SDKs send (validated before: ``protocol.requests``); a
    media part counts by ``_media_chars``. (Counting 64 for any parts list booked a
    200k-word prompt as about 20 tokens: deadlines of seconds, and no max_prompt_tokens; a
    flat 64 for a media part booked a 2 MB audio clip as 16 tokens.)"""
    if isinstance(content, str):
        return len(content)
    if not isinstance(content, list):
        return 0
    return sum(len(part.get("text") or part.get("refusal") or "") if part.get("type") in ("text", "refusal")
               else _media_chars(part) for part in content)


class Front:
    """Client requests into flows over ``control`` (``control.Control`` or a relay's
    ``relay_control.RemoteControl``): they share every rule about what a request is."""

    def __init__(self, config: GatewayConfig, cluster: LiveCluster, engines: Engines, control,
                 needs_prefix_keys: bool) -> None:
        self.config, self.cluster, self.engines, self.control = config, cluster, engines, control
        self.needs_prefix_keys = needs_prefix_keys
        self.flow_parts = FlowParts(control, engines, cluster, config, control.metrics)
        c = config
        self.bodies = BodyReads(BodyLimits(c.max_body_bytes, c.body_timeout_s, c.max_body_reads,
                                           c.max_body_reads_per_client, c.slow_body_after_s, c.min_body_bytes_per_s),
                                lambda reason: self.metrics.rejected.labels(reason).inc())
        self.tokenizer = self._tokenizer()
        self.chat_template = self._chat_template()
        self.classes = Classes(config.classes)
        self._parsers = ThreadPoolExecutor(PARSE_THREADS, thread_name_prefix="baton-parse")  # large bodies

    @property
    def metrics(self) -> GatewayMetrics:
        return self.control.metrics

    def close_parsers(self) -> None:
        self._parsers.shutdown(wait=False, cancel_futures=True)

    def base_app(self, log) -> web.Application:
        """The app with the gateway's middlewares (counted responses, JSON errors, JSON
        bodies only, client keys), the two OpenAI endpoints and ``_start``/``_stop``."""
        app = web.Application(client_max_size=self.config.max_body_bytes,
                              middlewares=[head_middleware,
                                           counted(self.metrics, RateLimitedLog(log, "refused requests")),
                                           json_errors, json_bodies_only, client_keys(self.config.api_keys)])
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
        return app

    def _tokenizer(self):
        """The tokenizer text prompts are keyed with (``tokenizer``), for prefix-aware policies."""
        if self.config.tokenizer is None:
            return None
        from baton.workload.tokens import HFTokenizer
        try:
            return HFTokenizer(self.config.tokenizer)
        except BatonError as err:
            raise ConfigError(f"tokenizer: {err}") from None

    def _chat_template(self):
        """The model's chat template beside the tokenizer (or ``chat_template``), when a
        prefix-aware policy keys prompts: chat requests are then keyed as the engine renders
        them (``gateway.chat_template``)."""
        if self.tokenizer is None or not self.needs_prefix_keys:
            return None
        from baton.gateway.chat_template import ChatTemplate
        return ChatTemplate.beside(self.config.tokenizer, self.config.chat_template)

    def key_prompts(self, needed: bool) -> None:
        """Whether the policy keys prompts by their blocks: a relay worker learns it from
        control's snapshot, after it started, and loads the chat template then (chat
        requests would otherwise go unkeyed, and their KV events unverified)."""
        was, self.needs_prefix_keys = self.needs_prefix_keys, needed
        if needed and not was:
            self.chat_template = self._chat_template()

    def keying_warning(self, policy: str) -> str | None:
        """What a prefix-aware policy cannot see at start-up: a line naming the requests it
        routes without their prefixes, or None."""
        if not self.needs_prefix_keys:
            return None
        if self.tokenizer is None:
            return (f"policy {policy} routes by prompt prefixes, but no tokenizer is configured: only requests "
                    "that send token ids are keyed; text and chat prompts are routed by load alone (set "
                    "tokenizer: to the model's folder)")
        if self.chat_template is None:
            return (f"policy {policy}: the tokenizer at {self.config.tokenizer} has no chat template beside it "
                    "(chat_template.jinja or tokenizer_config.json): chat requests are routed by load alone "
                    "(set chat_template: to the engine's template file)")
        return None

    def prompt_keys(self, kind: str, body: dict[str, Any], ids: list[int] | None) -> tuple[int, ...]:
        """The prompt's block keys for prefix-aware policies: from its token ids, or from a
        text prompt with the configured tokenizer, or from a chat rendered with the model's
        template as the engine renders it (none where it cannot be known)."""
        if ids is None and self.tokenizer is not None:
            if kind == COMPLETIONS:
                ids = self.tokenizer.ids(body["prompt"], special=True)
            elif self.chat_template is not None:
                text = self.chat_template.render(body)
                ids = None if text is None else self.tokenizer.ids(text, special=bool(body.get("add_special_tokens")))
        return tuple(token_block_keys(ids, self.config.block_size)) if ids else ()

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, COMPLETIONS)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, CHAT)

    async def _read(self, request: web.Request, kind: str):
        """Read, parse and validate a body. Only requests whose body has arrived count
        towards ``max_inflight``; bodies still arriving are judged by their rate
        (``gateway.bodies``)."""
        if len(self.control.flows) >= self.config.max_inflight:
            raise self.overload()
        raw = await self.bodies.read(request, request.remote or "")
        if len(raw) <= INLINE_PARSE_BYTES:
            return self.parse(kind, raw)
        return await asyncio.get_running_loop().run_in_executor(self._parsers, self.parse, kind, raw)

    def parse(self, kind: str, raw: bytes) -> ParsedRequest:
        """A body as a validated request (ApiError otherwise); the fields not forwarded are
        counted. ``baton serve`` and ``baton epp`` read bodies with it."""
        parsed, dropped = decode_body(kind, raw)
        for name in dropped:
            self.metrics.dropped_fields.labels(name if name in TRANSPORT_FIELDS else "other").inc()
        model = parsed.body.get("model")
        if not self.engines.names.accepts(model):
            raise ApiError(404, f"The model `{model}` does not exist.", err_type="invalid_request_error",
                           param="model", code="model_not_found")
        return parsed

    def new_state(self, kind: str, parsed: ParsedRequest, headers: Mapping[str, str],
                  client: str) -> tuple[RequestState, list[int] | None]:
        """A parsed request's state in the cluster (its prompt estimated, its class from
        its ``headers`` and ``client``, its block keys when the policy reads them) and its
        prompt ids when it sent ids; ApiError 400 when the prompt is longer than
        ``max_prompt_tokens`` or a class header is bad or not allowed (``gateway.classes``)."""
        tokens, ids = estimate_prompt_tokens(kind, parsed.body)
        if tokens > self.config.max_prompt_tokens:
            raise ApiError(400, f"prompt of about {tokens} tokens exceeds max_prompt_tokens "
                                f"({self.config.max_prompt_tokens})", param="prompt")
        cls = self.classes.of(headers, client, parsed.body.get("model"))
        state = self.cluster.new_request(tokens, parsed.max_tokens or 0, cls=cls)
        if self.needs_prefix_keys:
            state.block_keys = self.prompt_keys(kind, parsed.body, ids)
        return state, ids

    async def _serve(self, request: web.Request, kind: str) -> web.StreamResponse:
        xid = request.headers.get("X-Request-Id") or self.engines.ids.next()
        try:
            parsed = await self._read(request, kind)
            if len(self.control.flows) >= self.config.max_inflight:
                raise self.overload()
            state, ids = self.new_state(kind, parsed, request.headers, client_of(request))
        except ApiError as err:
            return await self._refuse(request, err, xid)
        oid = self.engines.ids.next()  # our own id: the client's X-Request-Id never reaches an engine
        model = parsed.body.get("model") or self.engines.names.default()
        out = ClientOut(request, parsed, model, RESPONSE_ID_PREFIX[kind] + oid,
                        self.config.client_write_timeout_s)
        out.headers["X-Request-Id"] = xid
        flow = Flow(self.flow_parts, parsed, out, state, xid, ids, client_of(request))
        try:
            self.control.admit(flow)
        except ApiError as err:  # its client holds its share of the slots
            self.cluster.forget(state)
            return await self._refuse(request, err, xid)
        return await flow.run()

    @staticmethod
    async def _refuse(request: web.Request, err: ApiError, xid: str) -> web.StreamResponse:
        resp = mark_error(web.json_response(err.body(), status=err.status,
                                             headers={"X-Request-Id": xid, **err.headers()}), err)
        if err.status == 408:  # answer, then drop the connection: the rest of the body is not awaited
            resp.force_close()
            await resp.prepare(request)
            await resp.write_eof()
            if request.transport is not None:
                request.transport.close()
        return resp

    def overload(self) -> ApiError:
        """The 429 for a request over ``max_inflight`` (counted as a refusal)."""
        self.metrics.rejected.labels("overload").inc()
        return ApiError(429, f"gateway at capacity ({self.config.max_inflight} requests in flight); "
                             "retry later", err_type="rate_limit_exceeded", code="429")
