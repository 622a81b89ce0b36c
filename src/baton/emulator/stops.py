"""Stop strings, as vLLM applies them, on the emulator's known output.

The emulator's output text is fixed by token position (``tokens.token_text``), so where a
stop string first appears is known when the request arrives: generation ends with the
token that completes it, the finish reason is ``stop`` (``stop_reason`` names the string),
and the text ends where the string begins (vLLM leaves the stop string out unless
``include_stop_str_in_output``). A continuation (prompt + generated tokens as token ids)
searches only its own new text, as a fresh vLLM request would.
"""

from __future__ import annotations

from bisect import bisect_left
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
    ``max_new`` tokens; None when none appears. The text is built once and each string
    searched once (linear in the text: a token-by-token search cost tokens x the longest
    stop, 3 s on the event loop for four 100,000-character stops and a chat's default
    max_tokens); the token that completes a string's first occurrence is found from the
    tokens' cumulative ends."""
    if not stops:
        return None
    ends, text, total = [], [], 0
    for k in range(max_new):
        piece = token_text(first_position + k)
        text.append(piece)
        total += len(piece)
        ends.append(total)
    whole = "".join(text)
    best: tuple[int, int, str] | None = None  # (completing token, start, string): the earliest wins
    for s in stops:
        at = whole.find(s)
        if at >= 0:
            cand = (bisect_left(ends, at + len(s)), at, s)
            best = cand if best is None or cand < best else best
    if best is None:
        return None
    k, at, s = best
    return StopPlan(k + 1, at + (len(s) if keep_stop else 0), s)
