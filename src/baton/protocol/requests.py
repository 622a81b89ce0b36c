"""Validation of completion and chat-completion request bodies."""

from __future__ import annotations

import orjson
from dataclasses import dataclass
from typing import Any

from baton.protocol.errors import ApiError

COMPLETIONS = "completions"
CHAT = "chat"
# a response id starts with its endpoint's prefix, as OpenAI and vLLM write them
RESPONSE_ID_PREFIX = {COMPLETIONS: "cmpl-", CHAT: "chatcmpl-"}


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


# Fields a client may send: the OpenAI ones, the vLLM/SGLang sampling and structured-output
# extensions load tools send, and nothing that steers an engine's KV transport
# (kv_transfer_params, bootstrap_*): the gateway sets those itself.
ALLOWED_FIELDS = frozenset({
    # OpenAI completions / chat completions
    "model", "prompt", "messages", "stream", "stream_options", "max_tokens",
    "max_completion_tokens", "temperature", "top_p", "n", "stop", "presence_penalty",
    "frequency_penalty", "logit_bias", "logprobs", "top_logprobs", "echo", "suffix", "best_of",
    "seed", "user", "tools", "tool_choice", "parallel_tool_calls", "response_format",
    "functions", "function_call",
    # vLLM / SGLang sampling extensions
    "top_k", "min_p", "min_tokens", "ignore_eos", "repetition_penalty", "length_penalty",
    "stop_token_ids", "skip_special_tokens", "spaces_between_special_tokens",
    "include_stop_str_in_output", "bad_words", "allowed_token_ids", "priority",
    "prompt_logprobs", "truncate_prompt_tokens", "return_token_ids", "no_stop_trim",
    # structured output and chat templating
    "guided_json", "guided_regex", "guided_choice", "guided_grammar", "guided_decoding_backend",
    "guided_whitespace_pattern", "structured_outputs", "regex", "ebnf", "json_schema",
    "add_generation_prompt", "continue_final_message", "add_special_tokens", "chat_template_kwargs",
})
TRANSPORT_FIELDS = ("kv_transfer_params", "bootstrap_host", "bootstrap_port", "bootstrap_room")


def split_fields(body: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """(the allowed part of a client body, the names of the fields dropped)."""
    kept = {k: v for k, v in body.items() if k in ALLOWED_FIELDS}
    return kept, [k for k in body if k not in ALLOWED_FIELDS]


def parse_json(raw: bytes) -> dict[str, Any]:
    """Decode a JSON object body; ApiError 400 names what is wrong. orjson refuses what
    engines choke on (invalid UTF-8, lone surrogates, nesting deeper than 1,024) and is
    several times faster than the standard parser on large token-id bodies."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
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
        _check_content(m.get("content"), i)


# chat content part types vLLM's OpenAI server accepts, and what each must carry: a
# string field, or an object with these string fields ("|": either may stand alone)
_PART_SHAPES: dict[str, tuple[str, tuple[str, ...] | None]] = {
    "text": ("text", None),
    "refusal": ("refusal", None),
    "image_url": ("image_url", ("url",)),
    "audio_url": ("audio_url", ("url",)),
    "video_url": ("video_url", ("url",)),
    "input_audio": ("input_audio", ("data", "format")),
    "image_embeds": ("image_embeds", ()),
    "file": ("file", ()),
}


def _check_content(content: Any, i: int) -> None:
    """String, null, or a list of parts of the types vLLM accepts, each with its field
    of the right shape (an engine may answer a part it cannot read with a 500)."""
    if content is None or isinstance(content, str):
        return
    if not isinstance(content, list):
        raise ApiError(400, f"messages[{i}].content must be a string, null or a list of parts",
                       param="messages")
    for j, part in enumerate(content):
        where = f"messages[{i}].content[{j}]"
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise ApiError(400, f"{where} must be an object with a string 'type'", param="messages")
        shape = _PART_SHAPES.get(part["type"])
        if shape is None:
            raise ApiError(400, f"{where}.type {part['type'][:40]!r} is not one of "
                                f"{', '.join(_PART_SHAPES)}", param="messages")
        _check_part(part, shape, where)


def _check_part(part: dict[str, Any], shape: tuple[str, tuple[str, ...] | None], where: str) -> None:
    field, members = shape
    value = part.get(field)
    if members is None:
        if not isinstance(value, str):
            raise ApiError(400, f"{where}.{field} must be a string", param="messages")
        return
    if field in ("image_url", "image_embeds") and isinstance(value, str):
        return  # vLLM takes a bare URL or embedding string here too
    if not isinstance(value, dict):
        raise ApiError(400, f"{where}.{field} must be an object", param="messages")
    for member in members:
        if not isinstance(value.get(member), str):
            raise ApiError(400, f"{where}.{field}.{member} must be a string", param="messages")


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
    _check_stop(body.get("stop"))
    return ParsedRequest(kind, body, stream, max_tokens)


MAX_STOP_STRINGS = 4  # vLLM's (and OpenAI's) limit: it answers 400 beyond


def _check_stop(stop: Any) -> None:
    """``stop``: absent, a string or at most ``MAX_STOP_STRINGS`` strings, as vLLM
    validates it (a request with 2,000 stop strings froze the engines it reached)."""
    if stop is None or isinstance(stop, str):
        return
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise ApiError(400, "'stop' must be a string or a list of strings", param="stop")
    if len(stop) > MAX_STOP_STRINGS:
        raise ApiError(400, f"'stop' has at most {MAX_STOP_STRINGS} strings, got {len(stop)}", param="stop")
