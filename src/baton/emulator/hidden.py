"""The emulator's stand-in for Baton's vLLM hidden-state plugin (plugins/vllm_hidden_states).

Same wire format, timing and security: for a request tagged ``vllm_xargs.baton_tag``, after
its generated token N whenever (N - 1) % k == 0, a two-frame ZMQ message (JSON header
``{"tag", "n_gen", "d"}``, then ``d`` float32 values) on a PUB socket that is a CURVE
server when given a secret key (the gateway pins the matching public key:
``gateway.hidden``), and that admits only the listed gateway public keys when given some.
An emulator has no model, so the vector is synthetic: component 0 is the true remaining
length after ``n_gen - 1`` generated tokens divided by 100 (what a perfect predictor would
read), the others a deterministic function of the tag and n_gen. It lets the live path
(tagging, the feed, the policy's learned estimator) be tested without a model.
"""

from __future__ import annotations

import json
import re
import zlib

import numpy as np

from baton.core.errors import ConfigError


def secret_key_from_file(path: str) -> str:
    """The ``secret-key`` of a ZMQ certificate file (``zmq.auth.create_certificates``
    writes ``NAME.key_secret``); ConfigError if unreadable or absent."""
    try:
        with open(path, encoding="utf-8") as f:
            found = re.search(r'secret-key\s*=\s*"([^"]{40})"', f.read())
    except OSError as err:
        raise ConfigError(f"--hidden-states-key-file: cannot read {path}: {err.strerror}") from None
    if found is None:
        raise ConfigError(f"--hidden-states-key-file: no Z85 secret-key in {path}")
    return found.group(1)


class HiddenPublisher:
    """Publishes synthetic hidden states on ``address`` every ``every_tokens`` tokens;
    with ``secret_key`` (Z85) as a CURVE server, admitting only ``client_keys`` (Z85
    public keys of gateways) when there are any."""

    def __init__(self, address: str, every_tokens: int = 16, dim: int = 8, secret_key: str | None = None,
                 client_keys: tuple[str, ...] = ()) -> None:
        import zmq

        self.every, self.dim = every_tokens, dim
        self.context = zmq.Context()  # its own: a ZAP authenticator belongs to one context
        self.auth = None
        if secret_key is not None and client_keys:
            from zmq.auth.thread import ThreadAuthenticator

            self.auth = ThreadAuthenticator(self.context)
            self.auth.start()
            self.auth.configure_curve_callback("*", _Allow(client_keys))
        self.socket = self.context.socket(zmq.PUB)
        self.socket.setsockopt(zmq.LINGER, 0)
        if secret_key is not None:
            self.socket.curve_secretkey = secret_key.encode()
            self.socket.curve_publickey = zmq.curve_public(secret_key.encode())
            self.socket.curve_server = True
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
        if self.auth is not None:
            self.auth.stop()
        self.context.term()


class _Allow:
    """ZAP credentials provider: the gateways allowed to subscribe, by public key."""

    def __init__(self, keys: tuple[str, ...]) -> None:
        self.keys = {k.encode() for k in keys}

    def callback(self, domain: str, key: bytes) -> bool:
        return key in self.keys
