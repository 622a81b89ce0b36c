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

from baton.core.errors import ConfigError, WorkloadError
from baton.core.request import Request
from baton.workload.tokens import ID_BLOCK_TOKENS



@dataclass(frozen=True, slots=True)
class SessionsSpec:
    """The sessions workload's parameters (lengths in tokens, times in seconds)."""

    sessions: int = 200
    session_rate: float = 1.0
    system_prompts: int = 8
    zipf_s: float = 1.1
    system_tokens: int = 1500
    turns_mean: float = 5.0
    user_median: float = 120.0
    user_sigma: float = 0.8
    output_median: float = 200.0
    output_sigma: float = 0.8
    think_s: float = 20.0
    tpot_s: float = 0.03
    agent_share: float = 0.2
    agent_turns_mean: float = 12.0
    agent_tool_median: float = 300.0
    agent_output_median: float = 80.0
    agent_think_s: float = 1.0
    max_context: int = 32768

    def check(self) -> None:
        """ConfigError naming the first parameter out of range."""
        for name in ("sessions", "system_prompts", "system_tokens", "max_context"):
            if getattr(self, name) < 1:
                raise ConfigError(f"workload.{name}: expected a positive integer, got {getattr(self, name)}")
        for name in ("session_rate", "turns_mean", "user_median", "output_median", "tpot_s",
                     "agent_turns_mean", "agent_tool_median", "agent_output_median"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"workload.{name}: expected a positive number, got {getattr(self, name)}")
        for name in ("zipf_s", "user_sigma", "output_sigma", "think_s", "agent_think_s"):
            if getattr(self, name) < 0:
                raise ConfigError(f"workload.{name}: expected a non-negative number, got {getattr(self, name)}")
        if not 0 <= self.agent_share <= 1:
            raise ConfigError(f"workload.agent_share: expected a share in [0, 1], got {self.agent_share}")
        if self.turns_mean < 1 or self.agent_turns_mean < 1:
            raise ConfigError("workload.turns_mean and agent_turns_mean: expected at least 1")


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
