"""Multi-turn sessions with shared system prompts: a synthetic workload with prefix reuse.

Each session picks one of ``system_prompts`` system prompts with Zipf popularity
(exponent ``zipf_s``: prompt k is chosen with weight 1 / k^s), then runs a number of turns
(geometric, mean ``turns_mean``). A turn's prompt is the system prompt, every earlier turn's
user message and answer, and its new user message; the next turn arrives an exponential
think time (mean ``think_s``) after the answer would end, estimated at ``tpot_s`` per output
token after the request's arrival (the generator does not know the served latency; traces
replayed open-loop have the same property). A share ``agent_share`` of sessions are agent
loops: more turns (``agent_turns_mean``), short tool results instead of user messages and
short think times (``agent_think_s``). New sessions arrive as a Poisson process at
``session_rate`` per second.

Every request carries ``prefix_ids``: one id per 16-token block of its whole sequence
(prompt and answer), made from the content segments the block holds, so equal ids mean
equal tokens and an answer's blocks are the ones the next turn's prompt repeats.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from baton.core.errors import WorkloadError
import baton.core.settings as settings
from baton.core.settings import setting
from baton.core.request import Request
from baton.workload.tokens import ID_BLOCK_TOKENS



@dataclass(frozen=True, slots=True)
class SessionsSpec:
    """The sessions workload's parameters (lengths in tokens, times in seconds)."""

    sessions: int = setting(200, flag=True, ge=1, doc="sessions to draw")
    session_rate: float = setting(1.0, flag=True, gt=0, unit="1/s", doc="sessions started per second (Poisson)")
    system_prompts: int = setting(8, flag=True, ge=1, doc="distinct system prompts sessions share")
    zipf_s: float = setting(1.1, flag=True, ge=0, doc="Zipf exponent of the system prompts' popularity")
    system_tokens: int = setting(1500, flag=True, ge=1, unit="tokens", doc="a system prompt's length")
    turns_mean: float = setting(5.0, flag=True, ge=1, doc="mean turns of a chat session")
    user_median: float = setting(120.0, flag=True, gt=0, unit="tokens", doc="median user message")
    user_sigma: float = setting(0.8, flag=True, ge=0, doc="user message lognormal sigma")
    output_median: float = setting(200.0, flag=True, gt=0, unit="tokens", doc="median answer")
    output_sigma: float = setting(0.8, flag=True, ge=0, doc="answer lognormal sigma")
    think_s: float = setting(20.0, flag=True, ge=0, unit="s", doc="mean user think time between turns")
    tpot_s: float = setting(0.03, flag=True, gt=0, unit="s", doc="assumed time per output token (when the next turn comes)")
    agent_share: float = setting(0.2, flag=True, ge=0, le=1, doc="share of sessions that are agents (tool loops)")
    agent_turns_mean: float = setting(12.0, flag=True, ge=1, doc="mean turns of an agent session")
    agent_tool_median: float = setting(300.0, flag=True, gt=0, unit="tokens", doc="median tool result added per turn")
    agent_output_median: float = setting(80.0, flag=True, gt=0, unit="tokens", doc="median agent output")
    agent_think_s: float = setting(1.0, flag=True, ge=0, unit="s", doc="mean gap between agent turns")
    max_context: int = setting(32768, flag=True, ge=1, unit="tokens", doc="a session ends before its context passes this")

    def check(self) -> None:
        """ConfigError naming the first parameter out of range."""
        settings.validate(self, "workload")


def _block_ids(segments: list[tuple[int, int]]) -> tuple[int, ...]:
    """One id per ``ID_BLOCK_TOKENS`` block of a sequence of (segment id, tokens) pieces:
    the hash of the (segment, start, end) slices the block holds."""
    ids, block, room = [], [], ID_BLOCK_TOKENS
    for seg, length in segments:
        at = 0
        while at < length:
            take = min(room, length - at)
            block.append((seg, at, at + take))
            at, room = at + take, room - take
            if room == 0:
                ids.append(hash(tuple(block)))
                block, room = [], ID_BLOCK_TOKENS
    if block:
        ids.append(hash(tuple(block)))
    return tuple(ids)


def _lognormal(rng: np.random.Generator, median: float, sigma: float) -> int:
    return max(1, int(round(median * np.exp(sigma * rng.standard_normal()))))


def generate_sessions(spec: SessionsSpec, rng: np.random.Generator) -> list[Request]:
    """The requests of ``spec``'s sessions, sorted by arrival, ids 0..n-1."""
    spec.check()
    weights = 1.0 / np.arange(1, spec.system_prompts + 1) ** spec.zipf_s
    weights /= weights.sum()
    next_seg = spec.system_prompts  # segment ids 0..system_prompts-1 are the system prompts
    rows: list[tuple[float, int, int, tuple[int, ...]]] = []
    start = 0.0
    for _ in range(spec.sessions):
        start += rng.exponential(1.0 / spec.session_rate)
        agent = rng.random() < spec.agent_share
        turns = int(rng.geometric(1.0 / (spec.agent_turns_mean if agent else spec.turns_mean)))
        history: list[tuple[int, int]] = [(int(rng.choice(spec.system_prompts, p=weights)), spec.system_tokens)]
        t = start
        for _ in range(turns):
            new = _lognormal(rng, spec.agent_tool_median if agent else spec.user_median, spec.user_sigma)
            out = _lognormal(rng, spec.agent_output_median if agent else spec.output_median, spec.output_sigma)
            prompt = history + [(next_seg, new)]
            prompt_tokens = sum(n for _, n in prompt)
            if prompt_tokens + out > spec.max_context:
                break  # the session outgrew the context: it ends, as a client would start over
            answer = (next_seg + 1, out)
            next_seg += 2
            rows.append((t, prompt_tokens, out, _block_ids(prompt + [answer])))
            history = prompt + [answer]
            t += out * spec.tpot_s + rng.exponential(spec.agent_think_s if agent else spec.think_s)
    if not rows:
        raise WorkloadError(f"workload.max_context: {spec.max_context} tokens hold no turn (a system prompt of "
                            f"{spec.system_tokens} tokens plus a message and its answer); no requests")
    rows.sort(key=lambda r: r[0])
    t0 = rows[0][0] if rows else 0.0
    return [Request(i, a - t0, p, o, ids, ID_BLOCK_TOKENS) for i, (a, p, o, ids) in enumerate(rows)]
