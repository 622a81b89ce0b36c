"""A fixed trace sent to the gateway, and the exact answer each request must get.

Request ``i`` of a trace uses API variant ``i % 4``: streamed completions, completions,
streamed chat, chat. Completions prompts are token ids (as ``baton.gateway.replay``
sends them); a chat prompt is one user message of ``prompt - 5`` words whose characters
make the gateway's estimate (characters / 4 + 4 per message) equal the emulator's count
(2 + words + 1 per message, + 2), so the gateway, the emulator and the simulator all see
the same prompt length. Every request asks for exactly ``output`` tokens
(``max_tokens`` with ``ignore_eos``). The emulator's output token at sequence position p
is ``token_text(p)``, so the whole answer is known in advance: a token lost, repeated or
reordered by a migration shows in the text.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from baton.core.request import Request
from baton.emulator.tokens import token_text
from baton.gateway.replay import class_headers, prompt_for

REQUEST_TIMEOUT_S = 60.0
VARIANTS = (("/v1/completions", True), ("/v1/completions", False), ("/v1/chat/completions", True),
            ("/v1/chat/completions", False))
_CHAT_OVERHEAD_TOKENS = 5  # BOS, role, EOT around the message; BOS, assistant after it


def chat_content(prompt_tokens: int) -> str:
    """A message of ``prompt_tokens - 5`` words, 4 x words + 4 characters long."""
    words = prompt_tokens - _CHAT_OVERHEAD_TOKENS
    assert words >= 1, "chat prompts need at least 6 tokens"
    return " ".join(["prologue"] + ["w%02d" % (k % 100) for k in range(1, words)])


def body_for(r: Request, streamed: bool = False) -> tuple[str, bool, dict[str, Any]]:
    """(endpoint, streamed, JSON body) of trace request ``r`` (``streamed``: every variant
    streamed)."""
    path, stream = VARIANTS[r.req_id % len(VARIANTS)]
    stream = stream or streamed
    if r.prefix_ids:  # token ids, so that both runtimes key the same blocks (chat has a template)
        path = "/v1/completions"
    body: dict[str, Any] = {"max_tokens": r.output_tokens, "ignore_eos": True, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    if path == "/v1/completions":
        body["prompt"] = prompt_for(r)
    else:
        body["messages"] = [{"role": "user", "content": chat_content(r.prompt_tokens)}]
    return path, stream, body


XID_PREFIX = "conformance-"


def headers_for(r: Request) -> dict[str, str]:
    """Its X-Request-Id (the trace id: the gateway's decision log names it) and its class."""
    return {"X-Request-Id": f"{XID_PREFIX}{r.req_id}", **class_headers(r)}


def xid_trace_id(xid: str | None) -> int | None:
    """The trace id an X-Request-Id of ``headers_for`` names (None: not one of ours)."""
    if not xid or not xid.startswith(XID_PREFIX) or not xid[len(XID_PREFIX):].isdigit():
        return None
    return int(xid[len(XID_PREFIX):])


def expected_text(r: Request) -> str:
    return "".join(token_text(r.prompt_tokens + k) for k in range(r.output_tokens))


@dataclass(slots=True)
class Answer:
    """What the client got for one request."""

    req_id: int
    endpoint: str
    stream: bool
    status: int = 0
    text: str = ""
    content_chunks: int = 0  # streamed chunks that carried text
    usage: dict[str, Any] = field(default_factory=dict)
    finish_reason: str | None = None
    done: bool = False  # a stream ended with [DONE]
    error: str = ""

    def problems(self, r: Request) -> list[str]:
        """Every way this answer differs from the exact one."""
        out = []
        if self.status != 200 or self.error:
            return [f"status {self.status} {self.error[:300]}"]
        if self.text != expected_text(r):
            out.append(f"text has {len(self.text.split())} tokens, expected {r.output_tokens} in order")
        if self.usage.get("completion_tokens") != r.output_tokens or self.usage.get("prompt_tokens") != r.prompt_tokens:
            out.append(f"usage {self.usage}, expected {r.prompt_tokens} prompt / {r.output_tokens} completion")
        if self.finish_reason != "length":
            out.append(f"finish_reason {self.finish_reason!r}")
        if self.stream and not (self.done and self.content_chunks >= 1):
            out.append(f"stream: [DONE] {self.done}, {self.content_chunks} content chunks")
        return [f"request {r.req_id} ({self.endpoint}, stream={self.stream}): {p}" for p in out]


def _take(answer: Answer, payload: dict[str, Any]) -> None:
    """Fold one response object (a chunk or the whole body) into ``answer``."""
    if payload.get("usage"):
        answer.usage = payload["usage"]
    for choice in payload.get("choices") or []:
        text = choice.get("text")
        if text is None:
            text = (choice.get("delta") or choice.get("message") or {}).get("content")
        if text:
            answer.text += text
            answer.content_chunks += 1
        answer.finish_reason = choice.get("finish_reason") or answer.finish_reason


async def _read(resp: aiohttp.ClientResponse, answer: Answer) -> None:
    answer.status = resp.status
    if resp.status != 200:
        answer.error = (await resp.text())[:500]
    elif not answer.stream:
        _take(answer, await resp.json())
    else:
        async for line in resp.content:
            data = line.strip()
            if data == b"data: [DONE]":
                answer.done = True
            elif data.startswith(b"data: "):
                _take(answer, json.loads(data[6:]))


async def send(session: aiohttp.ClientSession, url: str, r: Request, t0: float, streamed: bool = False) -> Answer:
    """Send ``r`` at ``t0 + r.arrival_s`` (event-loop time) and read its answer."""
    loop = asyncio.get_running_loop()
    await asyncio.sleep(max(0.0, t0 + r.arrival_s - loop.time()))
    path, stream, body = body_for(r, streamed)
    answer = Answer(r.req_id, path, stream)
    try:
        async with session.post(url + path, json=body, headers=headers_for(r),
                                timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)) as resp:
            await _read(resp, answer)
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
        answer.error = f"{type(exc).__name__}: {exc}"
    return answer


async def send_all(session: aiohttp.ClientSession, url: str, trace: list[Request], t0: float,
                   streamed: bool = False) -> list[Answer]:
    """The whole trace, each request at ``t0`` + its arrival time (event-loop time);
    answers in trace order."""
    return list(await asyncio.gather(*(send(session, url, r, t0, streamed) for r in trace)))
