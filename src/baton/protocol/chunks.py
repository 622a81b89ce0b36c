"""Builders for completion responses and stream chunks, and SSE framing."""

from __future__ import annotations

import re
from typing import Any

import orjson

from baton.protocol.requests import CHAT

DONE = b"data: [DONE]\n\n"


def sse(payload: dict[str, Any]) -> bytes:
    """One server-sent event carrying a JSON payload."""
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def stream_chunk(kind: str, rid: str, model: str, created: int, text: str,
                 finish_reason: str | None, token_ids: list[int] | None = None,
                 first: bool = False, prompt_token_ids: list[int] | None = None) -> dict[str, Any]:
    """One streamed chunk with ``text`` (possibly empty) and an optional finish reason;
    ``prompt_token_ids`` where vLLM puts them (chat: the chunk, completions: the choice)."""
    if kind == CHAT:
        delta: dict[str, Any] = {"role": "assistant", "content": text} if first else {"content": text}
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None,
                                  "finish_reason": finish_reason}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        obj = "text_completion"
    if token_ids is not None:
        choice["token_ids"] = token_ids
    out = {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice]}
    if prompt_token_ids is not None:
        (out if kind == CHAT else choice)["prompt_token_ids"] = prompt_token_ids
    return out


def usage_chunk(kind: str, rid: str, model: str, created: int, prompt_tokens: int,
                completion_tokens: int) -> dict[str, Any]:
    """The final chunk of a stream with ``stream_options.include_usage``."""
    obj = "chat.completion.chunk" if kind == CHAT else "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [],
            "usage": usage(prompt_tokens, completion_tokens)}


def full_response(kind: str, rid: str, model: str, created: int, text: str, finish_reason: str | None,
                  prompt_tokens: int, completion_tokens: int,
                  token_ids: list[int] | None = None,
                  prompt_token_ids: list[int] | None = None,
                  stop_reason: str | int | None = None) -> dict[str, Any]:
    """A non-streamed response; ``stop_reason`` as vLLM gives it (the stop string or token
    id that ended the answer, else null)."""
    if kind == CHAT:
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text},
                                  "logprobs": None, "finish_reason": finish_reason, "stop_reason": stop_reason}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason,
                  "stop_reason": stop_reason}
        obj = "text_completion"
    out: dict[str, Any] = {"id": rid, "object": obj, "created": created, "model": model,
                           "choices": [choice], "usage": usage(prompt_tokens, completion_tokens)}
    if token_ids is not None:
        choice["token_ids"] = token_ids
        if kind == CHAT:
            out["prompt_token_ids"] = prompt_token_ids
        else:
            choice["prompt_token_ids"] = prompt_token_ids
    return out


def chunk_text(kind: str, choice: dict[str, Any]) -> str:
    """The text a streamed or full choice carries, in either format."""
    if kind == CHAT:
        part = choice.get("delta") or choice.get("message") or {}
        return part.get("content") or ""
    return choice.get("text") or ""


# A JSON key is a quote, the name and a quote; inside a JSON string every quote is escaped
# (\"), so these cannot match string content, only a "token_ids" or "prompt_token_ids" key
# whose value is a list of integers (which holds no "]").
_COMPACT_KEYS = (b'"token_ids":[', b'"prompt_token_ids":[')
_TOKEN_ID_LISTS = re.compile(rb'("(?:prompt_)?token_ids"\s*:\s*)\[[-\d,\s]*\]')


def without_token_ids(event: bytes, lists: int = 2) -> bytes:
    """A serialised chunk with its ``token_ids`` and ``prompt_token_ids`` lists replaced
    by ``null``: what vLLM sends a client that did not ask for token ids, made from what
    it sends the gateway (which always asks), without decoding and re-encoding it.
    ``lists`` is how many such lists the chunk holds: when the compact form (vLLM's,
    found with two byte searches each) accounts for fewer, a regular expression that
    allows whitespace does the rest."""
    if lists == 1:  # the common case: one output id list in vLLM's compact form
        i = event.find(b'"token_ids":[')
        if i >= 0:
            return event[:i + 12] + b"null" + event[event.index(b"]", i) + 1:]
    found = 0
    for key in _COMPACT_KEYS:
        i = event.find(key)
        while i >= 0:
            end = event.index(b"]", i) + 1
            event = event[:i + len(key) - 1] + b"null" + event[end:]
            found += 1
            i = event.find(key, i)
    return event if found >= lists else _TOKEN_ID_LISTS.sub(rb"\1null", event)
