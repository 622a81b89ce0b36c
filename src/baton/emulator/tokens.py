"""The emulator's deterministic tokenizer and token text.

Prompt words map to ids by CRC32; output token ids are their absolute position in the
sequence, and their text is a common English word chosen by the position (`` the``,
`` of``, ...), one that GPT-2, Llama and SmolLM2 tokenizers each count as one token, so
client-side token counts (inference-perf, genai-perf, guidellm) match the emulator's. A
continuation (prompt ids + the tokens generated so far, as a token-id prompt) therefore
produces exactly the tokens an uninterrupted request would have, which lets tests check
migrations token by token.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

from baton.protocol.requests import CHAT

_WORD_ID_BASE = 1000
_WORD_ID_RANGE = 50_000
BOS, EOT, ASSISTANT = 1, 2, 3
_ROLE_IDS = {"system": 4, "user": 5, "assistant": 3, "tool": 6}


def word_ids(text: str) -> list[int]:
    return [_WORD_ID_BASE + zlib.crc32(w.encode()) % _WORD_ID_RANGE for w in text.split()]


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def prompt_ids(kind: str, body: dict[str, Any], encode: Callable[[str], list[int]] | None = None) -> list[int]:
    """Token ids of a validated request's prompt (chat: a simple template); text is split
    by ``encode`` (a real tokenizer's) when given, else into whitespace words."""
    encode = encode or word_ids
    if kind == CHAT:
        ids: list[int] = []
        for m in body["messages"]:
            ids += [BOS, _ROLE_IDS.get(m["role"], 7)] + encode(_content_text(m.get("content"))) + [EOT]
        return ids + [BOS, ASSISTANT]
    prompt = body["prompt"]
    return list(prompt) if isinstance(prompt, list) else (encode(prompt) or [BOS])


# frequent words, each a single token (with its leading space) in the common BPE vocabularies
WORDS = tuple(f" {w}" for w in (
    "the of and to in is that for it as was with be by on not he this are or his from at which but have "
    "an had they you were their one all we can her has there been if more when will would who so no she "
    "other its may these about them than some only like what into time could first new two any").split())


def token_text(position: int) -> str:
    """Text of the output token at an absolute sequence position."""
    return WORDS[position % len(WORDS)]
