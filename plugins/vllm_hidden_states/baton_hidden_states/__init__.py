"""vLLM general plugin: the last-layer hidden state of each running request, every k tokens.

ARES predicts a request's remaining length from the serving model's last-layer hidden state
of its last token. vLLM 0.32 has no API for it (its hidden-states connector writes files
when a request ends, and needs CUDA), so this plugin wraps the model runner's
``sample_tokens``: the runner keeps the hidden states of the rows it samples from (after
the final norm: what the LM head reads) in ``execute_model_state.sample_hidden_states``.
After sampling, a request that now has N generated tokens with (N - 1) % k == 0 publishes
the row that produced token N, i.e. the state after N - 1 = 0, k, 2k, ... generated tokens
(the positions a predictor is trained on; N = 1 is the end of the prefill).

Enabled by ``BATON_HIDDEN_STATES_ADDR`` (a ZMQ address the worker binds a PUB socket to,
e.g. ``tcp://127.0.0.1:5599``); ``BATON_HIDDEN_STATES_EVERY`` is k (16). A message has two
frames: a JSON header ``{"tag", "n_gen", "d"}`` and ``d`` float32 values. ``tag`` is the
request's ``vllm_xargs["baton_tag"]`` (the gateway sets a random token per leg); untagged
requests are skipped.

Authentication (ZMQ CURVE; the gateway pins the engine's public key, ``hidden_states_key``
in its config): ``BATON_HIDDEN_STATES_SECRET_KEY`` (the engine's Z85 secret key) or
``BATON_HIDDEN_STATES_KEY_FILE`` (a ``zmq.auth.create_certificates`` ``NAME.key_secret``
file) makes the socket a CURVE server: only a gateway holding the public key can read the
states, and nobody without the secret key can pose as this engine. With
``BATON_HIDDEN_STATES_CLIENT_KEYS`` (comma-separated Z85 public keys of the gateways) only
those may subscribe (a ZAP handler thread in the worker). Without a key the socket is
plain, as before, with a warning. The plugin imports without any of these set.

It only reads tensors the runner already computed; generation is unchanged. Limits:
tensor parallelism 1 (every rank would bind the address), no speculative decoding (more
rows than requests: nothing is published), and it relies on private runner attributes
(``execute_model_state``, ``input_batch.req_ids``, ``requests``) of vLLM 0.32. A ZMQ PUB
socket drops messages while no subscriber is connected.
"""

from __future__ import annotations

import json
import logging
import os
import re

# one PUB socket per worker process, made on first use (vLLM calls ``register`` in every
# process; only the model runner's publishes); a ZAP authenticator must outlive it
_socket = None
_auth = None
log = logging.getLogger("baton_hidden_states")


def _secret_key() -> bytes | None:
    """The engine's CURVE secret key (Z85) from the environment, or None."""
    key = os.environ.get("BATON_HIDDEN_STATES_SECRET_KEY")
    path = os.environ.get("BATON_HIDDEN_STATES_KEY_FILE")
    if not key and path:
        with open(path, encoding="utf-8") as f:
            found = re.search(r'secret-key\s*=\s*"([^"]{40})"', f.read())
        if found is None:
            raise ValueError(f"BATON_HIDDEN_STATES_KEY_FILE: no Z85 secret-key in {path}")
        key = found.group(1)
    if key and len(key) != 40:
        raise ValueError("BATON_HIDDEN_STATES_SECRET_KEY: expected 40 Z85 characters")  # never echo a key
    return key.encode() if key else None


class _Allow:
    """ZAP credentials provider: the gateways allowed to subscribe, by public key."""

    def __init__(self, keys: set[bytes]) -> None:
        self.keys = keys

    def callback(self, domain: str, key: bytes) -> bool:
        return key in self.keys


def _secure(sock, ctx) -> None:
    """Make ``sock`` a CURVE server when the environment holds a key (see the module doc)."""
    global _auth
    import zmq

    secret = _secret_key()
    if secret is None:
        log.warning("baton hidden states on %s are unauthenticated and unencrypted: set "
                    "BATON_HIDDEN_STATES_SECRET_KEY", os.environ["BATON_HIDDEN_STATES_ADDR"])
        return
    clients = {k.strip().encode() for k in os.environ.get("BATON_HIDDEN_STATES_CLIENT_KEYS", "").split(",")
               if k.strip()}
    if clients:
        from zmq.auth.thread import ThreadAuthenticator

        _auth = ThreadAuthenticator(ctx)
        _auth.start()
        _auth.configure_curve_callback("*", _Allow(clients))
    sock.curve_secretkey = secret
    sock.curve_publickey = zmq.curve_public(secret)
    sock.curve_server = True


def _publisher():
    global _socket
    if _socket is None:
        import zmq

        ctx = zmq.Context.instance()
        sock = ctx.socket(zmq.PUB)
        sock.setsockopt(zmq.SNDHWM, 100_000)
        sock.setsockopt(zmq.LINGER, 0)
        _secure(sock, ctx)
        sock.bind(os.environ["BATON_HIDDEN_STATES_ADDR"])
        _socket = sock
    return _socket


def _due(runner, req_ids: list[str], output, every: int) -> list[tuple[int, str, int]]:
    """(row, tag, tokens generated) of the rows to publish after this step."""
    sampled, index = getattr(output, "sampled_token_ids", None), getattr(output, "req_id_to_index", None)
    if sampled is None or index is None:
        return []
    due = []
    for row, rid in enumerate(req_ids):
        state = runner.requests.get(rid)
        if rid not in index or not sampled[index[rid]] or state is None or state.sampling_params is None:
            continue  # a prefill chunk that sampled nothing, or a pooling request
        tag = (state.sampling_params.extra_args or {}).get("baton_tag")
        n_gen = len(state.output_token_ids)
        if tag is not None and (n_gen - 1) % every == 0:
            due.append((row, str(tag), n_gen))
    return due


def register() -> None:
    """vLLM calls this in every process; only the model runner's is patched to publish."""
    if not os.environ.get("BATON_HIDDEN_STATES_ADDR"):
        return
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner  # the CPU runner inherits it

    if getattr(GPUModelRunner, "_baton_hidden_states", False):
        return
    every = int(os.environ.get("BATON_HIDDEN_STATES_EVERY", "16"))
    sample_tokens, init = GPUModelRunner.sample_tokens, GPUModelRunner.__init__

    def patched_sample_tokens(self, *args, **kwargs):
        state = self.execute_model_state
        hidden = None if state is None else state.sample_hidden_states
        req_ids = list(self.input_batch.req_ids)
        output = sample_tokens(self, *args, **kwargs)
        try:
            if hidden is not None and hidden.shape[0] == len(req_ids):
                due = _due(self, req_ids, output, every)
                if due:
                    rows = hidden[[r for r, _, _ in due]].float().cpu().numpy()
                    sock = _publisher()
                    for (_, tag, n_gen), vec in zip(due, rows):
                        head = json.dumps({"tag": tag, "n_gen": n_gen, "d": int(vec.shape[0])}).encode()
                        sock.send_multipart([head, vec.tobytes()])
        except Exception:  # never break generation for a missed prediction input
            log.exception("publishing hidden states failed")
        return output

    def patched_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        _publisher()  # bind before the first request, so subscribers can connect early

    GPUModelRunner.sample_tokens = patched_sample_tokens
    GPUModelRunner.__init__ = patched_init
    GPUModelRunner._baton_hidden_states = True
