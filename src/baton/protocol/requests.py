"""Validation of completion and chat-completion request bodies."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from baton.protocol.errors import ApiError

COMPLETIONS = "completions"
CHAT = "chat"


@dataclass(slots=True)
class ParsedRequest:
    """A validated request body. ``kind`` is ``completions`` or ``chat``; ``max_tokens``
    is the output cap (``max_completion_tokens`` for chat when given), None when unset."""

    kind: str
    body: dict[str, Any]
    stream: bool
    max_tokens: int | None

    @property
    def include_usage(self) -> bool:
        opts = self.body.get("stream_options") or {}
        return bool(opts.get("include_usage")) if isinstance(opts, dict) else False


def parse_json(raw: bytes) -> dict[str, Any]:
    """Decode a JSON object body; ApiError 400 names what is wrong."""
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"request body must be a JSON object, got {type(body).__name__}")
    return body


def _int_field(body: dict[str, Any], name: str, minimum: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ApiError(400, f"'{name}' must be an integer >= {minimum}, got {value!r}", param=name)
    return value


def _check_prompt(body: dict[str, Any]) -> None:
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool)
                                                   for t in prompt):
        return
    raise ApiError(400, "'prompt' must be a string or a non-empty list of token ids "
                        "(batched prompts are not supported)", param="prompt")


def _check_messages(body: dict[str, Any]) -> None:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty list", param="messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(400, f"messages[{i}] must be an object with a string 'role'", param="messages")


def parse_request(kind: str, body: dict[str, Any]) -> ParsedRequest:
    """Validate the fields Baton relies on; everything else passes through untouched."""
    if kind == COMPLETIONS:
        _check_prompt(body)
    else:
        _check_messages(body)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError(400, f"'stream' must be a boolean, got {stream!r}", param="stream")
    if _int_field(body, "n", 1) not in (None, 1):
        raise ApiError(400, "only n=1 is supported", param="n")
    max_tokens = _int_field(body, "max_tokens", 1)
    if kind == CHAT:
        max_tokens = _int_field(body, "max_completion_tokens", 1) or max_tokens
    _int_field(body, "min_tokens", 0)
    return ParsedRequest(kind, body, stream, max_tokens)
