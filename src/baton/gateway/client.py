"""The client side of a request: one response in the client's format (completions or
chat, streamed or not), whichever legs and instances its tokens come from."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from baton.gateway.middleware import mark_error
from baton.protocol.chunks import DONE, full_response, sse, stream_chunk, usage_chunk, without_token_ids
from baton.protocol.errors import ApiError
from baton.protocol.requests import RESPONSE_ID_PREFIX, ParsedRequest

if TYPE_CHECKING:
    from baton.gateway.scan import Run
    from baton.gateway.upstream import Piece


WRITE_MAY_WAIT_BYTES = 64 * 1024  # asyncio's high-water mark: past it, a write waits for the client


class ClientOut:
    """Writes tokens as they are relayed; remembers what was sent so that a continuation
    picks up exactly after it. A streamed response is started at the first token, so
    errors before that are plain JSON error responses with their HTTP status.

    Chunks are either built here (``add``) or, from a leg in the client's own format,
    forwarded as the engine wrote them (``add_verbatim``); the response then carries that
    leg's id and creation time, and the engine's finish and usage chunks stand for the
    gateway's own."""

    def __init__(self, request: web.Request, parsed: ParsedRequest, model: str, response_id: str,
                 write_timeout_s: float = 30.0) -> None:
        self.request, self.parsed, self.model, self.rid = request, parsed, model, response_id
        self.write_timeout_s = write_timeout_s
        self.headers: dict[str, str] = {"X-Request-Id": response_id}  # the server sets the client's id
        self.created = int(time.time())
        self.with_ids = bool(parsed.body.get("return_token_ids"))
        self.texts: list[str] = []
        self.token_ids: list[int] = []
        self.prompt_token_ids: list[int] | None = None
        self.prompt_tokens = 0
        self.tokens = 0
        self._pending: list[bytes] = []
        self.response: web.StreamResponse | None = None
        self._own_id = (response_id, self.created)
        self.finish_sent = False  # an engine's finish chunk went out verbatim
        self._usage: bytes | None = None  # a verbatim leg's usage chunk, written at the end
        self.stop_reason: str | int | None = None  # the engine's, passed on in a non-streamed answer
        self._id_swap: tuple[bytes, bytes] | None = None  # a verbatim leg's id -> the one in our style

    @property
    def started(self) -> bool:
        return self.response is not None

    async def _start(self) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                           **self.headers})
        await resp.prepare(self.request)
        self.response = resp
        return resp

    def add(self, text: str, token_ids: list[int] | None, count: int) -> None:
        """Queue ``count`` relayed tokens (their text and ids) for the next ``flush``."""
        first = self.tokens == 0
        self.tokens += count
        self.texts.append(text)
        if token_ids:
            self.token_ids.extend(token_ids)
        if self.parsed.stream:
            prompt_ids = self.prompt_token_ids if first and self.with_ids else None
            self._pending.append(sse(stream_chunk(self.parsed.kind, self.rid, self.model, self.created, text,
                                                  None, token_ids if self.with_ids else None, first, prompt_ids)))

    def adopt(self, payload: dict[str, Any]) -> None:
        """Take the response id and creation time of a verbatim leg's first chunk. An id not
        in the endpoint's style (``cmpl-``/``chatcmpl-``, as vLLM's are) gets its prefix, in
        the relayed bytes too: every chunk of a response carries one id of one style."""
        created = payload.get("created")
        rid, prefix = payload["id"], RESPONSE_ID_PREFIX[self.parsed.kind]
        self.rid, self.created = rid, created if isinstance(created, int) else self.created
        self._id_swap = None
        if not rid.startswith(prefix):
            self.rid = prefix + rid
            # a quoted string equal to the id can only be a JSON value (a quote inside a
            # string is escaped): the id itself, or a field that repeats it
            self._id_swap = (orjson.dumps(rid), orjson.dumps(self.rid))

    def add_verbatim(self, piece: Piece, count: int) -> None:
        """Queue an engine chunk (``count`` tokens) as the engine wrote it; token id lists
        the client did not ask for become ``null``. A usage chunk is kept for the end of
        the response (the client gets it only if it asked, and only if no other leg
        follows, which would make its counts stale)."""
        usage_only = not piece.payload.get("choices") and piece.payload.get("usage") is not None
        if piece.finish_reason is not None:
            self.finish_sent = True
        self.tokens += count
        raw = piece.raw if self._id_swap is None else piece.raw.replace(*self._id_swap)
        if not self.with_ids:
            lists = (piece.token_ids is not None) + (piece.prompt_token_ids is not None)
            if lists:
                raw = without_token_ids(raw, lists)
        if usage_only:
            self._usage = b"data: " + raw + b"\n\n" if self.parsed.include_usage else None
        else:
            self._pending.append(b"data: " + raw + b"\n\n")

    def add_run(self, run: Run, count: int) -> None:
        """Queue a run of a verbatim leg's ordinary events (``count`` tokens), as they came
        (id lists already nulled when the client did not ask for them)."""
        self.tokens += count
        self._pending.append(run.client if self._id_swap is None else run.client.replace(*self._id_swap))

    def leg_changed(self) -> None:
        """The response continues on another leg: a verbatim usage chunk no longer counts
        everything, so the gateway writes its own at the end."""
        self._usage = None

    def discard_unsent(self) -> None:
        """Before the response started: forget a failed leg's queued chunks (a chat role
        chunk) and its adopted id, so the next leg starts the response afresh."""
        if self.response is None:
            self._pending.clear()
            self.rid, self.created = self._own_id
            self._id_swap = None
            self.finish_sent, self._usage = False, None

    async def flush(self) -> None:
        """Write what was queued, in one write; a stream starts only with its first token."""
        if self._pending and (self.response is not None or self.tokens):
            resp = self.response or await self._start()
            data, self._pending = b"".join(self._pending), []
            await self._write(resp.write(data), len(data))

    async def _write(self, write, size: int) -> None:
        """Await ``write`` (of ``size`` bytes); a write that may wait for the client (its
        socket's buffer is full: it reads nothing) gets ``write_timeout_s``, then the
        connection is dropped as a client that went away."""
        transport = self.request.transport
        if transport is None or transport.get_write_buffer_size() + size < WRITE_MAY_WAIT_BYTES:
            return await write  # the usual case: the bytes go to the socket at once
        try:
            await asyncio.wait_for(write, self.write_timeout_s)
        except asyncio.TimeoutError:
            transport.abort()
            raise ConnectionResetError(f"the client read nothing for {self.write_timeout_s:.0f} s") from None

    async def finish(self, reason: str | None) -> web.StreamResponse:
        """End the response normally."""
        if not self.parsed.stream:
            body = full_response(self.parsed.kind, self.rid, self.model, self.created, "".join(self.texts),
                                 reason, self.prompt_tokens, self.tokens,
                                 self.token_ids if self.with_ids else None,
                                 self.prompt_token_ids if self.with_ids else None, self.stop_reason)
            return web.json_response(body, headers=self.headers)
        resp = self.response or await self._start()
        tail, self._pending = self._pending, []
        if not self.finish_sent:
            tail.append(sse(stream_chunk(self.parsed.kind, self.rid, self.model, self.created, "", reason)))
        if self._usage is not None:
            tail.append(self._usage)
        elif self.parsed.include_usage:
            tail.append(sse(usage_chunk(self.parsed.kind, self.rid, self.model, self.created,
                                        self.prompt_tokens, self.tokens)))
        data = b"".join(tail) + DONE
        await self._write(resp.write_eof(data), len(data))  # the last chunks and the stream's end in one write
        return resp

    async def fail(self, err: ApiError) -> web.StreamResponse:
        """End with an error: an HTTP error before the stream started, else an error event."""
        if self.response is None:
            return mark_error(web.json_response(err.body(), status=err.status,
                                                headers={**self.headers, **err.headers()}), err)
        try:
            await self.response.write_eof(b"".join(self._pending) + sse(err.body()) + DONE)
        except (ConnectionError, RuntimeError):
            pass
        return mark_error(self.response, err)
