"""How the gateway's legs reach engines: the HTTP session and its timeouts, each leg's
headers and body (the engine's own model name and credential), and the deadlines a leg
is held to. No scheduling here: ``control.Control`` decides, this module addresses."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp
import numpy as np

from baton.gateway.config import EngineSpec, GatewayConfig
from baton.gateway.framing import upstream_connector
from baton.gateway.hidden import LegTags, tag_body
from baton.gateway.ids import IdSource
from baton.gateway.live import LiveCluster
from baton.gateway.models import ModelNames
from baton.perf.model import PerfModel

log = logging.getLogger("baton.gateway")


class Engines:
    """The engines behind the gateway as HTTP peers. ``session`` exists between the
    server's start and stop."""

    def __init__(self, config: GatewayConfig, cluster: LiveCluster, perf: PerfModel) -> None:
        self.config, self.cluster, self.perf = config, cluster, perf
        self.names = ModelNames(config.model)
        self.ids = IdSource()
        self.tags = LegTags()  # hidden-state tags of the legs in flight (Control.end drops a request's)
        self.session: aiohttp.ClientSession | None = None
        self.upstream_timeout = aiohttp.ClientTimeout(total=config.upstream_timeout_s,
                                                      sock_connect=config.connect_timeout_s)
        self._first_token_s: dict[int, float] = {}  # by context bucket; at most max_prompt_tokens / 64
        self._rng = np.random.default_rng(config.seed)
        self._asking: dict[int, asyncio.Task] = {}  # model-name re-asks in progress, by instance

    def reseed(self, salt: int) -> None:
        """Draw bootstrap rooms from a stream of their own (each relay worker: two relays
        on one seed would pair two requests' SGLang legs in one room)."""
        self._rng = np.random.default_rng([self.config.seed, salt])

    def bootstrap_room(self) -> int:
        """A random SGLang bootstrap room (pairs a request's prefill and decode legs)."""
        return int(self._rng.integers(0, 2**63 - 1))

    def add(self, spec: EngineSpec) -> int:
        """Register an engine (config or admin API); its model name, if configured, is served."""
        iid = self.cluster.add_engine(spec)
        if spec.model:
            self.names.by_engine[iid] = spec.model
        return iid

    def open_session(self) -> None:
        # keep-alive, but a connection whose engine wrote past a response is never reused
        connector = upstream_connector(limit=0, ttl_dns_cache=300)
        self.session = aiohttp.ClientSession(connector=connector, auto_decompress=False)

    async def close_session(self) -> None:
        for task in self._asking.values():
            task.cancel()
        if self.session is not None:
            await self.session.close()

    def rediscover(self, iid: int) -> None:
        """An engine answered a leg 404: forget its model name and ask its ``/v1/models``
        again now (once at a time per engine; the scrape loop asks too until it answers)."""
        if self.session is None or iid in self._asking:
            return
        old = self.names.forget(iid)
        self._asking[iid] = asyncio.get_running_loop().create_task(self._ask(iid, old))

    async def _ask(self, iid: int, old: str | None) -> None:
        try:
            timeout = aiohttp.ClientTimeout(total=self.config.scrape_timeout_s, sock_connect=self.config.connect_timeout_s)
            name = await self.names.discover(self.session, iid, self.url(iid), self.credential(iid), timeout)
            if name != old:
                log.warning("engine %s now serves model %r (was %r)", self.name(iid), name, old)
        finally:
            self._asking.pop(iid, None)

    # --- one leg's request -----------------------------------------------------------------
    def name(self, iid: int) -> str:
        return self.cluster.engines[iid].spec.name

    def url(self, iid: int) -> str:
        return self.cluster.engines[iid].spec.url

    def headers(self, iid: int) -> dict[str, str]:
        """Headers for one leg: a fresh internal request id (engines key KV handoffs and
        aborts by it, so two clients' ids must never meet there), and the engine's own
        credential from the config, never the client's."""
        out = {"X-Request-Id": f"baton-{self.ids.next()}", "Content-Type": "application/json"}
        key = self.cluster.engines[iid].spec.api_key
        if key:
            out["Authorization"] = f"Bearer {key}"
        return out

    def credential(self, iid: int) -> dict[str, str]:
        """Only the engine's credential (for the gateway's own calls: model discovery)."""
        key = self.cluster.engines[iid].spec.api_key
        return {"Authorization": f"Bearer {key}"} if key else {}

    def body(self, iid: int, body: dict[str, Any], req_id: int, tokens_relayed: int) -> dict[str, Any]:
        """A leg's body carries the engine's own model name (see ``gateway.models``) and,
        for engines with a hidden-state feed, a fresh random tag that ties their states to
        this leg (request, tokens before it, instance: ``gateway.hidden.LegTags``)."""
        body = self.names.for_engine(iid, body)
        if self.cluster.engines[iid].spec.hidden_states:
            return tag_body(body, self.tags.issue(req_id, tokens_relayed, iid))
        return body

    def wants_ids(self, iid: int) -> bool:
        """vLLM returns token ids on request (needed for continuation); SGLang does not."""
        return self.cluster.engines[iid].spec.engine_type == "vllm"

    # --- deadlines ---------------------------------------------------------------------------
    def first_token_deadline_s(self, iid: int, context_tokens: int) -> float:
        """A leg's first-token deadline on instance ``iid``: its own prefill and the
        prefill work queued there before it and the contexts heading there (continuations
        re-prefill theirs; the gateway's own bookings), so a burst is not taken for a hang."""
        return self.first_token_timeout_s(context_tokens + self.cluster.pending_tokens(iid))

    def first_token_timeout_s(self, context_tokens: int) -> float:
        """How long a leg may take to its first token when a prefill of ``context_tokens``
        comes first. Costed for the context rounded up to a multiple of 64 tokens and
        remembered (the perf model is too slow to call per request)."""
        cap = 4 * self.config.max_prompt_tokens  # beyond it, linear: O(1) whatever an engine claims
        if context_tokens > cap:
            return self.first_token_timeout_s(cap) * context_tokens / cap
        bucket = -(-max(context_tokens, 1) // 64) * 64
        found = self._first_token_s.get(bucket)
        if found is None:
            c = self.config
            found = self._first_token_s[bucket] = c.first_token_timeout_factor * self.perf.prefill_time_s(bucket) \
                + c.first_token_timeout_base_s
        return found

    def token_timeout_s(self, iid: int) -> float:
        """How long a streaming leg may go without a token before its engine counts as hung:
        the engine's pace, plus the prefill work the gateway has just sent it (continuations
        arriving after another engine failed stall its running streams while it prefills
        their contexts; a burst of them is not a hang)."""
        c = self.config
        pace_s = max(c.token_timeout_min_s, c.token_timeout_factor * self.cluster.token_interval_s(iid))
        queued = self.cluster.pending_tokens(iid)
        if not queued:
            return pace_s
        return pace_s + self.first_token_timeout_s(queued) - c.first_token_timeout_base_s
