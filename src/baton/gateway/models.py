"""Which model names the gateway serves, and which name each engine is sent.

As vllm-router does, the gateway serves the engines' own model names: a load tool that
ties its tokenizer to the model name (guidellm, inference-perf, genai-perf) can use the
real name. An engine's name comes from its ``model`` in the config, or else from its
``/v1/models``, asked at start-up and on each scrape until it answers. The config's
top-level ``model`` is an optional alias served as well. Every leg sent to an engine
carries that engine's own name, whichever name the client used; responses echo the
client's name. With no name known at all, the gateway serves ``baton``.
"""

from __future__ import annotations

import asyncio

import aiohttp

FALLBACK = "baton"


class ModelNames:
    """Served names: the alias (if any) and each engine's model name."""

    def __init__(self, alias: str | None) -> None:
        self.alias = alias
        self.by_engine: dict[int, str] = {}
        self.context_tokens: dict[int, int] = {}  # each engine's max_model_len, as its /v1/models says
        self.asked: set[int] = set()  # engines whose /v1/models answered

    def forget(self, iid: int) -> str | None:
        """Drop what one engine said of itself (it answered 404: it may have restarted
        under another model name); the next ``discover`` asks again. Returns the old name."""
        self.asked.discard(iid)
        self.context_tokens.pop(iid, None)
        return self.by_engine.pop(iid, None)

    def served(self) -> list[str]:
        """Every name the gateway answers to, the alias first."""
        return self._names(list(self.by_engine))

    def listed(self, healthy: list[int]) -> list[str]:
        """What ``/v1/models`` lists: the names of the engines that take work now (the
        alias first), nothing when none does: no phantom model while every engine is down."""
        return self._names(healthy) if healthy else []

    def _names(self, engines: list[int]) -> list[str]:
        names = [self.alias] if self.alias else []
        for iid in engines:
            name = self.by_engine.get(iid)
            if name is not None and name not in names:
                names.append(name)
        return names or [FALLBACK]

    def accepts(self, name: str | None) -> bool:
        return name is None or name in self.served()

    def default(self) -> str:
        """The name a response carries when the client named none."""
        return self.served()[0]

    def for_engine(self, iid: int, body: dict) -> dict:
        """``body`` with the engine's own model name, when the gateway knows it."""
        name = self.by_engine.get(iid)
        if name is None or body.get("model") == name:
            return body
        return {**body, "model": name}

    async def discover(self, session: aiohttp.ClientSession, iid: int, url: str, headers: dict[str, str],
                       timeout: aiohttp.ClientTimeout) -> str | None:
        """Ask one engine's ``/v1/models`` for its first model (and its ``max_model_len``,
        which vLLM and the emulator report); None if it does not answer. A configured
        name is kept. An engine that answered at all, even with an error, is ``asked``."""
        try:
            async with session.get(url + "/v1/models", headers=headers, timeout=timeout) as resp:
                self.asked.add(iid)
                if resp.status != 200:
                    return None
                answer = await resp.json(content_type=None)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, OSError):
            return None
        data = answer.get("data") if isinstance(answer, dict) else None
        first = data[0] if isinstance(data, list) and data else None
        if not isinstance(first, dict):
            return None
        context = first.get("max_model_len")
        if isinstance(context, int) and not isinstance(context, bool) and context > 0:
            self.context_tokens[iid] = context
        name = first.get("id")
        if isinstance(name, str) and name:
            self.by_engine.setdefault(iid, name)
            return self.by_engine[iid]
        return None
