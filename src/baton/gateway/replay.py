"""Replay a trace against a live OpenAI endpoint (the gateway, or an engine directly).

Each request is sent at its arrival time with a token-id prompt of its prompt length and
``max_tokens`` = its output length with ``ignore_eos``, streamed, and timed from the
moment it was sent: TTFT at the first content chunk, end-to-end at ``[DONE]``. A request
with a class (priority, tenant, own SLOs) sends it as ``x-baton-*`` headers.
"""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import dataclass

import aiohttp

from baton.core.request import Request

_FILLER_ID_BASE = 1000


@dataclass(slots=True, frozen=True)
class ReplayRecord:
    """One replayed request. Times in seconds from its send time; NaN when it failed."""

    req_id: int
    arrival_s: float
    status: int
    output_tokens: int
    ttft_s: float
    e2e_s: float
    error: str = ""


def prompt_for(request: Request) -> list[int]:
    """A token-id prompt of the request's length. With prefix identity (``prefix_ids``),
    each id's block of tokens is made from the id, so equal ids give equal tokens and an
    engine caches what the simulator does; without, it shares no 16-token block with
    another request's: the ids run from a start that is unique per request modulo 5,000,
    and the first id tells the 5,000s apart."""
    if request.prefix_ids and request.prefix_block_tokens > 0:
        g = request.prefix_block_tokens
        ids = [_FILLER_ID_BASE + hash((block, j)) % 20000 for block in request.prefix_ids for j in range(g)]
        return ids[:request.prompt_tokens]
    ids = [_FILLER_ID_BASE + (request.req_id * 7 + i) % 5000 for i in range(request.prompt_tokens)]
    if ids:
        ids[0] = _FILLER_ID_BASE + 5000 + (request.req_id // 5000) % 20000
    return ids


def class_headers(request: Request) -> dict[str, str]:
    """The request's class as headers (``gateway.classes``; the gateway must allow them:
    ``classes.client_headers: all``); none for a request of the default class."""
    out = {}
    if request.priority:
        out["x-baton-priority"] = str(request.priority)
    if request.tenant:
        out["x-baton-tenant"] = request.tenant
    for header, slo_s in (("x-baton-ttft-slo-ms", request.ttft_slo_s), ("x-baton-tpot-slo-ms", request.tpot_slo_s)):
        if slo_s is not None:
            out[header] = f"{slo_s * 1000:g}"
    return out


async def _one(session: aiohttp.ClientSession, url: str, r: Request, t0: float, model: str | None,
               timeout_s: float) -> ReplayRecord:
    loop = asyncio.get_running_loop()
    await asyncio.sleep(max(0.0, t0 + r.arrival_s - loop.time()))
    body = {"prompt": prompt_for(r), "max_tokens": r.output_tokens, "ignore_eos": True, "stream": True}
    if model:
        body["model"] = model
    sent = loop.time()
    first, tokens, nan = math.nan, 0, math.nan
    try:
        async with session.post(url + "/v1/completions", json=body, headers=class_headers(r),
                                timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            if resp.status != 200:
                return ReplayRecord(r.req_id, r.arrival_s, resp.status, 0, nan, nan, (await resp.text())[:200])
            async for line in resp.content:
                if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                    continue
                choices = json.loads(line[6:]).get("choices") or []
                if choices and choices[0].get("text"):
                    tokens += 1
                    if tokens == 1:
                        first = loop.time() - sent
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        return ReplayRecord(r.req_id, r.arrival_s, 0, tokens, first, nan, f"{type(exc).__name__}: {exc}")
    return ReplayRecord(r.req_id, r.arrival_s, 200, tokens, first, loop.time() - sent)


async def replay(url: str, requests: list[Request], model: str | None = None,
                 timeout_s: float = 120.0) -> list[ReplayRecord]:
    """Send every request at its arrival time; records in the order given."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        t0 = asyncio.get_running_loop().time() + 0.05
        return list(await asyncio.gather(*(_one(session, url, r, t0, model, timeout_s) for r in requests)))
