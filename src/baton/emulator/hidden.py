"""The emulator's stand-in for Baton's vLLM hidden-state plugin (plugins/vllm_hidden_states).

Same wire format and timing: for a request tagged ``vllm_xargs.baton_tag``, after its
generated token N whenever (N - 1) % k == 0, a two-frame ZMQ message (JSON header ``{"tag",
"n_gen", "d"}``, then ``d`` float32 values) on a PUB socket. An emulator has no model, so
the vector is synthetic: component 0 is the true remaining length after ``n_gen - 1``
generated tokens divided by 100 (what a perfect predictor would read), the others a
deterministic function of the tag and n_gen. It lets the live path (tagging, the feed,
the policy's learned estimator) be tested without a model.
"""

from __future__ import annotations

import json
import zlib

import numpy as np


class HiddenPublisher:
    """Publishes synthetic hidden states on ``address`` every ``every_tokens`` tokens."""

    def __init__(self, address: str, every_tokens: int = 16, dim: int = 8) -> None:
        import zmq

        self.every, self.dim = every_tokens, dim
        self.socket = zmq.Context.instance().socket(zmq.PUB)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.bind(address)

    def due(self, n_gen: int) -> bool:
        return (n_gen - 1) % self.every == 0

    def publish(self, tag: str, n_gen: int, output_tokens: int) -> None:
        """The state that produced token ``n_gen`` of an ``output_tokens``-token answer."""
        rng = np.random.default_rng(zlib.crc32(f"{tag}:{n_gen}".encode()))
        vec = rng.standard_normal(self.dim).astype(np.float32)
        vec[0] = (output_tokens - (n_gen - 1)) / 100.0
        head = json.dumps({"tag": tag, "n_gen": n_gen, "d": self.dim}).encode()
        self.socket.send_multipart([head, vec.tobytes()])

    def close(self) -> None:
        self.socket.close(0)
