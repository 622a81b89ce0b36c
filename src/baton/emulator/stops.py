"""Stop strings, as vLLM applies them, on the emulator's known output.

The emulator's output text is fixed by token position (``tokens.token_text``), so where a
stop string first appears is known when the request arrives: generation ends with the
token that completes it, the finish reason is ``stop`` (``stop_reason`` names the string),
and the text ends where the string begins (vLLM leaves the stop string out unless
``include_stop_str_in_output``). A continuation (prompt + generated tokens as token ids)
searches only its own new text, as a fresh vLLM request would.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from baton.emulator.tokens import token_text


@dataclass(frozen=True, slots=True)
class StopPlan:
    """Where a stop string ends generation: after ``tokens`` tokens, text cut at
    ``text_chars`` characters, because of ``stop_str``."""

    tokens: int
    text_chars: int
    stop_str: str


def stop_strings(body: dict[str, Any]) -> list[str]:
    """The request's non-empty stop strings (``stop`` was validated by
    ``protocol.requests.parse_request``: a string or at most four strings)."""
    stop = body.get("stop")
    if stop is None:
        return []
    return [s for s in ([stop] if isinstance(stop, str) else stop) if s]


def plan_stop(stops: list[str], first_position: int, max_new: int, keep_stop: bool = False) -> StopPlan | None:
    """The first stop string in the text of positions ``first_position`` onwards, within
    ``max_new`` tokens; None when none appears."""
    if not stops:
        return None
    # only the text a new match can span is kept: the last longest-1 characters before the
    # new token's (a chat's max_new runs to the context length; the whole text is not built)
    before, tail, longest = 0, "", max(len(s) for s in stops)
    for k in range(max_new):
        keep = tail[max(0, len(tail) - longest + 1):] if longest > 1 else ""
        before += len(tail) - len(keep)
        tail = keep + token_text(first_position + k)
        hits = [(i, s) for i, s in ((tail.find(s), s) for s in stops) if i >= 0]
        if hits:
            at, s = min(hits)
            return StopPlan(k + 1, before + at + (len(s) if keep_stop else 0), s)
    return None
