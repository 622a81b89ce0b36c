"""Hidden states from the engines, for learned length predictors (ARES section 4).

An engine with ``hidden_states: tcp://host:port`` in the config runs Baton's vLLM plugin
(``plugins/vllm_hidden_states``), which publishes the last-layer hidden state of each
tagged request every k generated tokens on that ZMQ address. The gateway tags every leg
it sends such an engine (``vllm_xargs.baton_tag``), subscribes to each address at start,
and hands each state to the policy as a ``HiddenState`` observation (``generated_tokens``
= the tokens before the leg + the plugin's N - 1: the state that produced token N has seen
N - 1 of the leg's tokens; the plugin publishes at N - 1 = 0, k, 2k, ..., the positions
the predictor was trained on).

Trust (hardening finding N8). A state steers scheduling, so the feed believes one only if:

* it came from the engine: each engine's PUB socket is a ZMQ CURVE server, and the gateway
  pins that engine's public key (``hidden_states_key``) on the socket it connects to it.
  CURVE, not an HMAC per message, because (1) the key is asymmetric: the gateway holds only
  public keys, so its config cannot be used to impersonate an engine; (2) the states are
  encrypted: a hidden state is a summary of the user's prompt and answer, and must not be
  readable on the wire; (3) the check runs in libzmq's I/O thread, not per message on the
  event loop; (4) pyzmq's wheels ship it (``zmq.has("curve")``), the plugin needs only a
  socket option. A peer that fails the handshake never delivers a message; it is counted
  (``baton_hidden_states_dropped_total{reason="auth"}``). Without a key the feed works
  unauthenticated, as before, with one warning at start.
* its tag is one the gateway issued: a random 128-bit token per leg (``LegTags``), not the
  request id, so nobody can tag a request of their own as someone else's.
* it came on the socket of the engine the tagged leg was sent to, and that leg is still
  the request's current one (``Control.hidden_state``).
* it is small and sane (``parse``): at most ``max_dim`` float32 values (the socket's
  ``MAXMSGSIZE`` disconnects a peer sending larger frames before Python sees them),
  1 <= n_gen <= ``MAX_N_GEN``, a flat JSON head, finite values; and its engine is within
  its rate (a token bucket per socket). The reader yields to the event loop every
  ``BATCH`` messages, so a flood cannot stall the HTTP side, and no message can end it.

This is the in-engine route: vLLM computes the states anyway, and the plugin only copies
the rows it already sampled from. Needs ``pyzmq`` (the ``learned`` extra).
"""

from __future__ import annotations

import json
import re
import secrets
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from baton.core.request import RequestState

TAG_KEY = "baton_tag"
MAX_DIM = 65_536          # floats: wider than any served model's hidden size (Llama-405B: 16,384)
MAX_N_GEN = 10_000_000    # tokens: a leg's position; beyond it a number is not a count
HEAD_MAX_BYTES = 256      # the JSON head is {"tag": 32 hex digits, "n_gen", "d"}: about 70 bytes
TAG_RE = re.compile(r"[0-9a-f]{32}")
DROP_REASONS = ("auth", "malformed", "too_large", "rate", "unknown_tag", "wrong_engine", "stale", "rejected")
_Z85 = re.compile(r"[0-9a-zA-Z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}")


class Drop(Exception):
    """A message the feed does not believe; ``reason`` is one of ``DROP_REASONS``."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


def is_z85_key(key: Any) -> bool:
    """True for a CURVE key as ZMQ writes it: 40 characters of Z85 (32 bytes)."""
    return isinstance(key, str) and _Z85.fullmatch(key) is not None


def public_key_from_file(path: str) -> str | None:
    """The ``public-key`` of a ZMQ certificate file (``zmq.auth.create_certificates``
    writes ``NAME.key``); None if there is none."""
    with open(path, encoding="utf-8") as f:
        found = re.search(r'public-key\s*=\s*"([^"]*)"', f.read())
    return found.group(1) if found and is_z85_key(found.group(1)) else None


# --- tags ------------------------------------------------------------------------------------
@dataclass(slots=True, frozen=True)
class Leg:
    """What a tag stands for: the request, the tokens it had generated before this leg
    (an engine counts a continuation's tokens from its own start), the instance the leg
    was sent to."""

    req_id: int
    base_tokens: int
    instance: int


class LegTags:
    """The tags of the legs in flight. At most one per (request, instance): a new leg on
    an instance revokes the request's older leg there; ``drop`` forgets a finished
    request's tags (``Control.end``), so the table holds only requests in flight."""

    def __init__(self) -> None:
        self._legs: dict[str, Leg] = {}
        self._by_req: dict[int, dict[int, str]] = {}  # req id -> instance -> tag

    def issue(self, req_id: int, base_tokens: int, instance: int) -> str:
        """A fresh unguessable tag (128 random bits) for a leg about to be sent."""
        tag = secrets.token_hex(16)
        tags = self._by_req.setdefault(req_id, {})
        old = tags.get(instance)
        if old is not None:
            del self._legs[old]
        tags[instance] = tag
        self._legs[tag] = Leg(req_id, base_tokens, instance)
        return tag

    def get(self, tag: str) -> Leg | None:
        return self._legs.get(tag)

    def drop(self, req_id: int) -> None:
        for tag in self._by_req.pop(req_id, {}).values():
            del self._legs[tag]

    def __len__(self) -> int:
        return len(self._legs)


def tag_body(body: dict[str, Any], tag: str) -> dict[str, Any]:
    """The leg's body with ``tag`` in ``vllm_xargs`` (clients cannot send ``vllm_xargs``:
    the gateway drops it with the other engine-only fields)."""
    return {**body, "vllm_xargs": {TAG_KEY: tag}}


# --- one message -------------------------------------------------------------------------------
def parse(frames: list[bytes], max_dim: int = MAX_DIM) -> tuple[str, int, np.ndarray]:
    """(tag, the leg's n_gen, vector) of one message; ``Drop`` says why not. Never raises
    anything else, whatever the bytes."""
    if len(frames) != 2:
        raise Drop("malformed", f"{len(frames)} frames, expected 2")
    head_raw, body = frames
    if len(head_raw) > HEAD_MAX_BYTES:  # also keeps json.loads away from deep nesting
        raise Drop("malformed", f"a head of {len(head_raw)} bytes")
    try:
        head = json.loads(head_raw)
    except (ValueError, RecursionError) as err:  # UnicodeDecodeError is a ValueError
        raise Drop("malformed", "the head is not JSON") from err
    if not isinstance(head, dict):
        raise Drop("malformed", "the head is not an object")
    tag, n_gen, dim = head.get("tag"), head.get("n_gen"), head.get("d")
    if not isinstance(tag, str) or TAG_RE.fullmatch(tag) is None:
        raise Drop("unknown_tag", "not a tag the gateway issues")
    if type(n_gen) is not int or not 1 <= n_gen <= MAX_N_GEN:
        raise Drop("malformed", f"n_gen must be an integer in [1, {MAX_N_GEN}]")
    if type(dim) is not int or dim < 1:
        raise Drop("malformed", "d must be a positive integer")
    if dim > max_dim or len(body) > 4 * max_dim:
        raise Drop("too_large", f"{max(dim, len(body) // 4)} values, at most {max_dim}")
    if len(body) != 4 * dim:
        raise Drop("malformed", f"{len(body)} bytes for {dim} float32 values")
    vec = np.frombuffer(body, dtype=np.float32)
    if not np.isfinite(vec).all():
        raise Drop("malformed", "non-finite values")
    return tag, n_gen, vec


class TokenBucket:
    """At most ``rate_per_s`` messages a second on average, bursts of ``burst``."""

    def __init__(self, rate_per_s: float, burst: float, clock=time.monotonic) -> None:
        self.rate, self.burst, self.clock = rate_per_s, burst, clock
        self.tokens, self.at = burst, clock()

    def take(self) -> bool:
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True


def serves(state: RequestState, iid: int) -> bool:
    """Whether ``iid`` serves ``state``'s current leg: its decode (or colocated) instance,
    or its prefill instance until the request first decodes."""
    if iid == state.decode_instance:
        return True
    return iid == state.prefill_instance and state.decode_start_s is None
