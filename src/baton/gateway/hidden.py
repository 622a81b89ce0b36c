"""Hidden states from the engines, for learned length predictors (ARES section 4).

An engine with ``hidden_states: tcp://host:port`` in the config runs Baton's vLLM plugin
(``plugins/vllm_hidden_states``), which publishes the last-layer hidden state of each
tagged request every k generated tokens on that ZMQ address. The gateway tags every leg
it sends such an engine (``vllm_xargs.baton_tag`` = the gateway's request id), subscribes
to each address at start, and hands each state to the policy as a ``HiddenState``
observation (``generated_tokens`` = the plugin's N - 1: the state that produced token N
has seen N - 1 generated tokens; the plugin publishes at N - 1 = 0, k, 2k, ..., the
positions the predictor was trained on).

This is the in-engine route: vLLM computes the states anyway, and the plugin only copies
the rows it already sampled from. Needs ``pyzmq`` (the ``learned`` extra).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from baton.core.errors import ConfigError
from baton.core.events import HiddenState

log = logging.getLogger("baton.gateway")
TAG_KEY = "baton_tag"


def tag_body(body: dict[str, Any], req_id: int, base_tokens: int) -> dict[str, Any]:
    """The leg's body tagged ``"<request id>:<tokens generated before this leg>"`` in
    ``vllm_xargs`` (an engine counts a continuation's tokens from its own start; clients
    cannot send ``vllm_xargs``: the gateway drops it with the other engine-only fields)."""
    return {**body, "vllm_xargs": {TAG_KEY: f"{req_id}:{base_tokens}"}}


def parse(frames: list[bytes]) -> tuple[int, int, np.ndarray] | None:
    """(request id, tokens generated so far, vector) of one message; None if malformed."""
    try:
        if len(frames) != 2:
            return None
        head = json.loads(frames[0])
        vec = np.frombuffer(frames[1], dtype=np.float32)
        req, base = str(head["tag"]).split(":")
        req_id, n_gen, dim = int(req), int(head["n_gen"]), head.get("d")
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        return None
    if type(dim) is not int or vec.size != dim or n_gen < 1 or not np.isfinite(vec).all():
        return None
    return req_id, int(base) + n_gen - 1, vec


class HiddenStateFeed:
    """One SUB socket per address; every message becomes a ``HiddenState`` for ``deliver``
    (which drops those of requests the gateway no longer serves). ``on_connected`` gets
    the number of engine sockets connected whenever it changes."""

    @staticmethod
    def check_available() -> None:
        """ConfigError unless pyzmq can be imported."""
        try:
            import zmq.asyncio  # noqa: F401
        except ImportError as e:
            raise ConfigError("engines[].hidden_states needs pyzmq: pip install 'baton[learned]'") from e

    def __init__(self, addresses: list[str], deliver: Callable[[HiddenState], bool],
                 clock: Callable[[], float], on_connected: Callable[[int], None] | None = None) -> None:
        self.check_available()
        import zmq
        import zmq.asyncio

        self.zmq, self.deliver, self.clock, self.on_connected = zmq, deliver, clock, on_connected
        self.context = zmq.asyncio.Context()
        self.sockets, self.monitors = [], []
        for address in addresses:
            sock = self.context.socket(zmq.SUB)
            sock.setsockopt(zmq.SUBSCRIBE, b"")
            sock.setsockopt(zmq.LINGER, 0)
            # a PUB socket drops what it sends before a subscriber is connected: the
            # monitor tells when each engine's socket is (``connected``, a gauge)
            self.monitors.append(sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED))
            sock.connect(address)
            self.sockets.append(sock)
        self.connected: dict[int, bool] = {i: False for i in range(len(addresses))}
        self.dropped = 0  # malformed, or rejected by the policy

    async def run(self) -> None:
        """Receive until cancelled."""
        await asyncio.gather(*(self._read(s) for s in self.sockets),
                             *(self._watch(i, m) for i, m in enumerate(self.monitors)))

    async def _watch(self, index: int, monitor) -> None:
        from zmq.utils.monitor import parse_monitor_message

        while True:
            event = parse_monitor_message(await monitor.recv_multipart())["event"]
            self.connected[index] = event == self.zmq.EVENT_HANDSHAKE_SUCCEEDED
            if self.on_connected:
                self.on_connected(sum(self.connected.values()))

    async def _read(self, sock) -> None:
        while True:
            parsed = parse(await sock.recv_multipart())
            try:
                if parsed is None:
                    raise ValueError("a malformed hidden-state message")
                req_id, generated, vec = parsed
                if self.deliver(HiddenState(req_id, generated, tuple(vec.tolist()), self.clock())):
                    log.debug("hidden state: request %d after %d generated tokens", req_id, generated)
            except Exception:  # malformed, or a vector the predictor cannot read: drop it, keep the feed
                self.dropped += 1
                if self.dropped == 1:  # the first says why; the rest would flood the log
                    log.exception("hidden state dropped")

    def close(self) -> None:
        for sock in self.sockets:
            sock.disable_monitor()
            sock.close(0)
        for mon in self.monitors:
            mon.close(0)
        self.context.term()
