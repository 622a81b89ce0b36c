"""One HTTP call to an engine (a *leg*): JSON for prefill legs, an SSE stream of
normalised pieces for decode legs. Closing a leg closes its connection, which makes vLLM
(and the emulator) abort the request."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from baton.gateway.urls import public_url
from baton.gateway.scan import EVENT_END, Run, split
from baton.protocol.chunks import chunk_text
from baton.protocol.errors import ApiError, openai_type
from baton.protocol.requests import CHAT

# The most an engine may send as one stream line (one SSE event) or one JSON answer. The
# largest legitimate ones carry a prompt's token ids (131,072 ids, about 1 MiB) or
# prompt logprobs; past this the answer is malformed, not buffered on and on.
MAX_ANSWER_BYTES = 16 * 1024 * 1024


class UpstreamError(Exception):
    """A leg failed. ``connect`` is True when the engine could not be reached at all
    (nothing was sent, so retrying elsewhere is always safe); ``status`` is set when the
    engine answered with an HTTP error, whose OpenAI body is in ``body``."""

    def __init__(self, message: str, connect: bool = False, status: int | None = None,
                 body: dict[str, Any] | None = None, malformed: bool = False,
                 timed_out: bool = False) -> None:
        super().__init__(message)
        self.connect, self.status, self.body, self.malformed = connect, status, body, malformed
        self.timed_out = timed_out

    @property
    def engine_fault(self) -> bool:
        """True when the engine gave no proper HTTP answer: none at all, a broken stream or
        a malformed answer. An HTTP error answer may be the request's fault as much as the
        engine's (``gateway.faults`` decides which)."""
        return self.malformed or self.status is None

    def client_error(self, what: str) -> ApiError:
        """What the client gets for this failed leg: the engine's own HTTP error, else a 502."""
        if not self.engine_fault and self.status is not None:
            if not self.body:
                return ApiError(self.status, str(self))
            e = self.body["error"]
            code, param = e.get("code"), e.get("param")
            return ApiError(self.status, str(e.get("message")), openai_type(e.get("type"), self.status),
                            param if isinstance(param, str) else None, None if code is None else str(code))
        return ApiError(502, f"{what}: {self}", err_type="server_error", code="backend_error")


@dataclass(slots=True)
class Piece:
    """What one stream chunk carried, in either API format: ``tokens`` output tokens (its
    id count, else 1 for non-empty text); ``raw`` is the chunk's JSON as the engine sent
    it and ``payload`` that JSON decoded (for a verbatim relay)."""

    text: str = ""
    token_ids: list[int] | None = None
    finish_reason: str | None = None
    prompt_token_ids: list[int] | None = None
    prompt_tokens: int | None = None
    tokens: int = 0
    raw: bytes = b""
    payload: dict[str, Any] | None = None
    run: Run | None = None  # a run of ordinary events read by the fast path (gateway.scan)
    opens: bool = False  # the first chunk of a verbatim leg: the response takes its id
    stop_reason: str | int | None = None  # vLLM's: the stop string or token id that ended it


def _malformed(what: str) -> UpstreamError:
    return UpstreamError(f"engine sent a malformed answer: {what}", malformed=True)


def piece_of(kind: str, payload: Any, raw: bytes = b"") -> Piece:
    """Normalise a completions or chat chunk (``raw``: its JSON bytes); UpstreamError
    (malformed) if it is not one."""
    if not isinstance(payload, dict):
        raise _malformed(f"a chunk is a {type(payload).__name__}, not an object")
    usage = payload.get("usage") or {}
    choices = payload.get("choices") or []
    # every choice is checked; the common one-choice case without a generator (per token)
    if not isinstance(usage, dict) or not isinstance(choices, list) or \
            (choices and not isinstance(choices[0], dict)) or \
            (len(choices) > 1 and not all(isinstance(c, dict) for c in choices)):
        raise _malformed("'usage' or 'choices' has the wrong type")
    prompt_ids = payload.get("prompt_token_ids")
    if not choices:
        return Piece("", None, None, prompt_ids, usage.get("prompt_tokens"), 0, raw, payload)
    c = choices[0]
    text, ids = chunk_text(kind, c), c.get("token_ids")
    if ids is None:  # without ids a chunk that carries any output is one token
        tokens = 1 if text or (kind == CHAT and _other_output(c)) else 0
    elif isinstance(ids, list) and all(type(t) is int for t in ids):  # they may become a continuation's prompt
        tokens = len(ids)
    else:
        raise _malformed("'token_ids' is not a list of integers")
    piece = Piece(text, ids, c.get("finish_reason"), prompt_ids if prompt_ids is not None else
                  c.get("prompt_token_ids"), usage.get("prompt_tokens"), tokens, raw, payload)
    if piece.finish_reason is not None:
        stop = c.get("stop_reason")
        piece.stop_reason = stop if isinstance(stop, (str, int)) and not isinstance(stop, bool) else None
    return piece


def _other_output(choice: dict[str, Any]) -> bool:
    """A chat delta carrying output besides ``content`` (reasoning, tool calls)."""
    delta = choice.get("delta")
    return isinstance(delta, dict) and any(delta.get(k) for k in ("reasoning_content", "reasoning", "tool_calls",
                                                                   "function_call"))


async def _read_json(resp: aiohttp.ClientResponse) -> Any:
    """A whole (non-streamed) answer, decoded; UpstreamError (malformed) beyond
    ``MAX_ANSWER_BYTES``, ValueError if it is not JSON."""
    if (resp.content_length or 0) > MAX_ANSWER_BYTES:
        raise _malformed(f"an answer of {resp.content_length} bytes (at most {MAX_ANSWER_BYTES})")
    parts, size = [], 0
    async for part in resp.content.iter_any():
        size += len(part)
        if size > MAX_ANSWER_BYTES:
            raise _malformed(f"an answer longer than {MAX_ANSWER_BYTES} bytes")
        parts.append(part)
    raw = b"".join(parts)
    return orjson.loads(raw) if raw.strip() else None  # an empty answer is None, as aiohttp's json()


async def _error_of(resp: aiohttp.ClientResponse) -> UpstreamError:
    try:
        body = await _read_json(resp)
    except (ValueError, aiohttp.ClientError, UpstreamError):
        body = None
    err = body.get("error") if isinstance(body, dict) else None
    if err is None and isinstance(body, dict) and body.get("object") == "error":  # older vLLM: at the top level
        err = body
    if isinstance(err, str):  # some servers send {"error": "text"}
        err = {"message": err, "type": "server_error" if resp.status >= 500 else "invalid_request_error"}
    if not isinstance(err, dict):
        err = None
    msg = err.get("message") if err else None
    return UpstreamError(f"engine answered {resp.status}: {msg or resp.reason}", status=resp.status,
                         body={"error": err} if err else None)


async def post_json(session: aiohttp.ClientSession, url: str, body: dict[str, Any],
                    headers: dict[str, str], timeout: aiohttp.ClientTimeout) -> dict[str, Any]:
    """A non-streamed leg (``headers`` name the JSON content type); raises UpstreamError."""
    try:
        async with session.post(url, data=orjson.dumps(body), headers=headers, timeout=timeout) as resp:
            if resp.status != 200:
                raise await _error_of(resp)
            answer = await _read_json(resp)
            if not isinstance(answer, dict):
                raise _malformed(f"the answer is a {type(answer).__name__}, not an object")
            if not isinstance(answer.get("kv_transfer_params") or {}, dict):
                raise _malformed("'kv_transfer_params' is not an object")
            return answer
    except aiohttp.ClientConnectorError as exc:
        raise UpstreamError(f"cannot connect to {public_url(url)}: {exc}", connect=True) from None
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
        raise UpstreamError(f"{public_url(url)}: {type(exc).__name__}: {exc}") from None


class StreamLeg:
    """A streamed leg to one instance. ``open()`` sends it and checks the status;
    ``next_batch()`` returns the pieces that have arrived; ``close()`` aborts it."""

    def __init__(self, instance_id: int, kind: str, url: str, body: dict[str, Any],
                 headers: dict[str, str]) -> None:
        self.instance_id, self.kind, self.url = instance_id, kind, url
        self.body, self.headers = body, headers
        self._resp: aiohttp.ClientResponse | None = None
        self._partial: list[bytes] = []  # a line still arriving, in the pieces it came in
        self._partial_bytes = 0
        self.done = False
        self.finished = False  # a choice carried a finish reason
        self.received = False  # a token arrived on this leg
        # chunks go to the client as the engine wrote them: False for legs in another
        # format (continuations), None until the first chunk shows the model name
        # (``client_model``: the leg is verbatim when it names that model)
        self.verbatim: bool | None = False
        self.client_model: str | None = None
        self.null_ids = True  # a verbatim leg's id lists go to the client as null (it did not ask)
        self.fast = False  # read runs of ordinary events by byte searches (set once verbatim)
        self.counting = False  # only count tokens (a reader that relays nothing: scan.count)

    async def open(self, session: aiohttp.ClientSession, timeout: aiohttp.ClientTimeout) -> None:
        try:
            self._resp = await session.post(self.url, data=orjson.dumps(self.body), headers=self.headers,
                                            timeout=timeout)
        except aiohttp.ClientConnectorError as exc:
            raise UpstreamError(f"cannot connect to {public_url(self.url)}: {exc}", connect=True) from None
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise UpstreamError(f"{public_url(self.url)}: {type(exc).__name__}: {exc}") from None
        if self._resp.status != 200:
            err = await _error_of(self._resp)
            self.close()
            raise err

    def ready(self) -> list[Piece]:
        """The pieces already received, without waiting (often the whole answer of a short
        stream, so no read deadline needs arming)."""
        assert self._resp is not None
        pieces: list[Piece] = []
        try:
            data = self._resp.content.read_nowait()
            if data:
                self._feed(data, pieces)
        except (aiohttp.ClientError, ValueError) as exc:
            raise UpstreamError(f"{public_url(self.url)}: stream broke: {type(exc).__name__}: {exc}") from None
        return pieces

    async def next_batch(self) -> list[Piece]:
        """Every piece that has arrived (waiting for at least one); after ``[DONE]`` sets
        ``done``. Relaying a batch at once saves a write per token when the engine runs ahead."""
        assert self._resp is not None
        pieces: list[Piece] = []
        try:
            while not pieces and not self.done:
                data = await self._resp.content.readany()
                if not data and self.finished:
                    self.done = True  # a finished choice is a finished request, [DONE] or not
                    break
                if not data:
                    raise UpstreamError(f"{public_url(self.url)}: stream ended before [DONE]")
                self._feed(data, pieces)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
            raise UpstreamError(f"{public_url(self.url)}: stream broke: {type(exc).__name__}: {exc}") from None
        return pieces

    def feed(self, data: bytes) -> list[Piece]:
        """Parse stream bytes from elsewhere (an endpoint picker's response body): the
        pieces whose lines ``data`` completes; UpstreamError (malformed) as a leg would."""
        pieces: list[Piece] = []
        try:
            self._feed(data, pieces)
        except ValueError as exc:
            raise _malformed(f"{type(exc).__name__}: {exc}") from None
        return pieces

    def _feed(self, data: bytes, pieces: list[Piece]) -> None:
        """Parse the complete lines ``data`` ends; keep the rest for the next read. A line
        is joined once, when its end arrives (re-joining on every read is quadratic), and
        is malformed beyond ``MAX_ANSWER_BYTES``: an engine that never sends a newline
        cannot make the gateway buffer without bound."""
        if b"\n" not in data:
            self._keep(data)
            return
        if self._partial:
            data = b"".join((*self._partial, data))
            self._partial, self._partial_bytes = [], 0
        cut = data.rfind(b"\n") + 1
        self._lines(data[:cut], pieces)
        if cut < len(data):
            self._keep(data[cut:])

    def _lines(self, whole: bytes, pieces: list[Piece]) -> None:
        """Complete lines: on a fast leg, its whole events by byte searches (``gateway.scan``)
        as far as they are ordinary, the rest one line at a time."""
        if self.fast and not self.done:
            if whole.startswith(b"\n"):  # the blank line ending the event before
                whole = whole.lstrip(b"\n")
            k = whole.rfind(EVENT_END) + len(EVENT_END)
            run, tail = split(whole[:k], self.null_ids, self.kind if self.counting else None) \
                if k >= len(EVENT_END) else (None, b"")
            if run is not None:
                pieces.append(Piece(tokens=run.tokens, run=run))
                self.received = self.received or run.tokens > 0
                whole = tail + whole[k:]
        pos = 0
        while pos < len(whole):
            end = whole.find(b"\n", pos)
            end = len(whole) if end < 0 else end
            line, pos = whole[pos:end], end + 1
            if len(line) > MAX_ANSWER_BYTES:
                raise _malformed(f"a stream line longer than {MAX_ANSWER_BYTES} bytes")
            if not line:  # every other line of an SSE stream is the blank separator
                continue
            was_fast = self.fast
            self._parse(line, pieces)
            if self.fast and not was_fast:  # the first chunk made it a fast leg: the rest goes fast
                return self._lines(whole[pos:], pieces)

    def _keep(self, part: bytes) -> None:
        self._partial_bytes += len(part)
        if self._partial_bytes > MAX_ANSWER_BYTES:
            raise _malformed(f"a stream line longer than {MAX_ANSWER_BYTES} bytes")
        self._partial.append(part)

    def _parse(self, line: bytes, pieces: list[Piece]) -> None:
        if not line.startswith(b"data:") or self.done:
            return
        data = line[5:].strip()
        if data == b"[DONE]":
            self.done = True
            return
        payload = orjson.loads(data)  # ValueError on bad JSON, as json.loads
        if isinstance(payload, dict) and "error" in payload and not payload.get("choices"):
            err = payload["error"] if isinstance(payload["error"], dict) else {"message": str(payload["error"])}
            raise UpstreamError(f"engine error event: {err.get('message')}", status=500, body={"error": err})
        piece = piece_of(self.kind, payload, data)
        if self.verbatim is None:  # the first chunk of a leg that may speak the client's format
            self.verbatim = payload.get("model") == self.client_model and isinstance(payload.get("id"), str)
            piece.opens = self.fast = self.verbatim
        if piece.finish_reason is not None:
            self.finished = True
        if piece.tokens:
            self.received = True
        pieces.append(piece)

    def close(self) -> None:
        if self._resp is not None:
            self._resp.close()
            self._resp = None


def endpoint(kind: str) -> str:
    return "/v1/chat/completions" if kind == CHAT else "/v1/completions"


async def within(seconds: float, what: str, call):
    """Await ``call`` for at most ``seconds``; past that the engine counts as hung
    (UpstreamError with ``timed_out``, an engine fault that goes to recovery)."""
    try:
        if _TIMEOUT is None:  # Python 3.10
            return await asyncio.wait_for(call, seconds)
        async with _TIMEOUT(seconds):  # no extra task per call, unlike wait_for (per read)
            return await call
    except asyncio.TimeoutError:
        raise UpstreamError(f"{what}: no answer within {seconds:.1f} s", timed_out=True) from None


_TIMEOUT = getattr(asyncio, "timeout", None)


async def read_within(leg: StreamLeg, deadline_s: Callable[[], float], clock: Callable[[], float],
                      what: str) -> list[Piece]:
    """``leg.next_batch()`` within ``deadline_s()`` seconds, a deadline that may grow while
    waiting (work sent to the engine meanwhile stalls its streams): a timeout is final
    only when the wait has outlasted the deadline as it stands then. Cancelling a read
    loses nothing (the bytes stay in the response's buffer)."""
    start_s = clock()
    while True:
        try:
            return await within(max(0.05, deadline_s() - (clock() - start_s)), what, leg.next_batch())
        except UpstreamError as err:
            if not err.timed_out or clock() - start_s >= deadline_s():
                raise


def plausible_prompt_tokens(counted: object, prompt_ids: list[int] | None, limit: int) -> int | None:
    """An engine's prompt token count, if it can be true: a positive integer; the prompt
    ids' length when they are known; at most ``limit`` (``max_prompt_tokens``: longer
    prompts are refused at the door). An engine's number is never used unbounded."""
    if not isinstance(counted, int) or isinstance(counted, bool) or counted < 1:
        return None
    return len(prompt_ids) if prompt_ids is not None else min(counted, limit)
