"""One HTTP call to an engine (a *leg*): JSON for prefill legs, an SSE stream of
normalised pieces for decode legs. Closing a leg closes its connection, which makes vLLM
(and the emulator) abort the request."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import aiohttp

from baton.protocol.chunks import chunk_text
from baton.protocol.requests import CHAT


class UpstreamError(Exception):
    """A leg failed. ``connect`` is True when the engine could not be reached at all
    (nothing was sent, so retrying elsewhere is always safe); ``status`` is set when the
    engine answered with an HTTP error, whose OpenAI body is in ``body``."""

    def __init__(self, message: str, connect: bool = False, status: int | None = None,
                 body: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.connect, self.status, self.body = connect, status, body

    @property
    def engine_fault(self) -> bool:
        """True when the engine (not the request) is to blame."""
        return self.status is None or self.status >= 500


@dataclass(slots=True)
class Piece:
    """What one stream chunk carried, in either API format."""

    text: str = ""
    token_ids: list[int] | None = None
    finish_reason: str | None = None
    prompt_token_ids: list[int] | None = None
    prompt_tokens: int | None = None

    @property
    def tokens(self) -> int:
        """Output tokens in this piece (1 per non-empty text chunk without ids)."""
        if self.token_ids is not None:
            return len(self.token_ids)
        return 1 if self.text else 0


def piece_of(kind: str, payload: dict[str, Any]) -> Piece:
    """Normalise a completions or chat chunk."""
    usage = payload.get("usage") or {}
    choices = payload.get("choices") or []
    piece = Piece(prompt_tokens=usage.get("prompt_tokens"), prompt_token_ids=payload.get("prompt_token_ids"))
    if choices:
        c = choices[0]
        piece.text = chunk_text(kind, c)
        piece.token_ids = c.get("token_ids")
        piece.finish_reason = c.get("finish_reason")
        piece.prompt_token_ids = piece.prompt_token_ids or c.get("prompt_token_ids")
    return piece


async def _error_of(resp: aiohttp.ClientResponse) -> UpstreamError:
    try:
        body = await resp.json(content_type=None)
    except (ValueError, aiohttp.ClientError):
        body = None
    msg = (body or {}).get("error", {}).get("message") if isinstance(body, dict) else None
    return UpstreamError(f"engine answered {resp.status}: {msg or resp.reason}", status=resp.status,
                         body=body if isinstance(body, dict) and "error" in body else None)


async def post_json(session: aiohttp.ClientSession, url: str, body: dict[str, Any],
                    headers: dict[str, str], timeout: aiohttp.ClientTimeout) -> dict[str, Any]:
    """A non-streamed leg; raises UpstreamError."""
    try:
        async with session.post(url, json=body, headers=headers, timeout=timeout) as resp:
            if resp.status != 200:
                raise await _error_of(resp)
            return await resp.json(content_type=None)
    except aiohttp.ClientConnectorError as exc:
        raise UpstreamError(f"cannot connect to {url}: {exc}", connect=True) from None
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
        raise UpstreamError(f"{url}: {type(exc).__name__}: {exc}") from None


class StreamLeg:
    """A streamed leg to one instance. ``open()`` sends it and checks the status;
    ``next_batch()`` returns the pieces that have arrived; ``close()`` aborts it."""

    def __init__(self, instance_id: int, kind: str, url: str, body: dict[str, Any],
                 headers: dict[str, str]) -> None:
        self.instance_id, self.kind, self.url = instance_id, kind, url
        self.body, self.headers = body, headers
        self._resp: aiohttp.ClientResponse | None = None
        self._buf = b""
        self.done = False

    async def open(self, session: aiohttp.ClientSession, timeout: aiohttp.ClientTimeout) -> None:
        try:
            self._resp = await session.post(self.url, json=self.body, headers=self.headers, timeout=timeout)
        except aiohttp.ClientConnectorError as exc:
            raise UpstreamError(f"cannot connect to {self.url}: {exc}", connect=True) from None
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise UpstreamError(f"{self.url}: {type(exc).__name__}: {exc}") from None
        if self._resp.status != 200:
            err = await _error_of(self._resp)
            self.close()
            raise err

    async def next_batch(self) -> list[Piece]:
        """Every piece that has arrived (waiting for at least one); after ``[DONE]`` sets
        ``done``. Relaying a batch at once saves a write per token when the engine runs ahead."""
        assert self._resp is not None
        pieces: list[Piece] = []
        try:
            while not pieces and not self.done:
                data = await self._resp.content.readany()
                if not data:
                    raise UpstreamError(f"{self.url}: stream ended before [DONE]")
                self._buf += data
                *lines, self._buf = self._buf.split(b"\n")
                for line in lines:
                    self._parse(line, pieces)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
            raise UpstreamError(f"{self.url}: stream broke: {type(exc).__name__}: {exc}") from None
        return pieces

    def _parse(self, line: bytes, pieces: list[Piece]) -> None:
        if not line.startswith(b"data:") or self.done:
            return
        data = line[5:].strip()
        if data == b"[DONE]":
            self.done = True
            return
        payload = json.loads(data)
        if "error" in payload and not payload.get("choices"):
            raise UpstreamError(f"engine error event: {payload['error']}", status=500)
        pieces.append(piece_of(self.kind, payload))

    def close(self) -> None:
        if self._resp is not None:
            self._resp.close()
            self._resp = None


def endpoint(kind: str) -> str:
    return "/v1/chat/completions" if kind == CHAT else "/v1/completions"
