"""ARES with the learned estimator, live: engines publish hidden states every k tokens on
ZMQ (the emulators stand in for Baton's vLLM plugin, same wire format; one with a CURVE
key the gateway pins, one unauthenticated as before), the gateway tags the legs,
subscribes, and hands the states to the policy; outputs are unchanged."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tests.gateway.test_e2e import expected
from concurrent.futures import ThreadPoolExecutor

from tests.live import (Stream, chunk_texts, free_port, get, metric, post, servers, start_emulator, start_gateway,
                        wait_until)

pytest.importorskip("zmq")

EVERY = 16
OUTPUT_TOKENS = 64
PROMPT = "a b c d"


def identity_mlp(path, dim: int = 8) -> str:
    """prediction = 100 x relu(v[0]): the emulator's v[0] is the true remaining / 100."""
    w0 = np.zeros((dim, 1), np.float32)
    w0[0, 0] = 1.0
    np.savez(path, w0=w0, b0=np.zeros(1, np.float32), w1=np.ones((1, 1), np.float32), b1=np.zeros(1, np.float32),
             mean=np.zeros(dim, np.float32), std=np.ones(dim, np.float32), scale=np.array(100.0))
    return str(path)


def test_hidden_states_reach_the_policy_every_k_tokens_and_outputs_are_unchanged(tmp_path):
    import zmq.auth

    addresses = [f"tcp://127.0.0.1:{free_port()}" for _ in range(2)]
    public, secret = zmq.auth.create_certificates(tmp_path, "m0")
    keyed = [["--hidden-states-key-file", secret], []]
    engines = [start_emulator(tmp_path, "--hidden-states", a, "--hidden-states-every", str(EVERY), "--time-scale", "3",
                              *k) for a, k in zip(addresses, keyed)]
    keys = [{"hidden_states_key_file": public}, {}]
    policy = {"name": "ares-learned", "stages": [
        {"stage": "least-kv"},
        {"stage": "ares", "estimator": "learned", "interval_s": 0.2, "repredict_tokens": EVERY,
         "estimator_params": {"weights": identity_mlp(tmp_path / "mlp.npz")}}]}
    gw = start_gateway(tmp_path, {"engines": [{"name": f"m{i}", "url": e.url, "role": "mixed", "hidden_states": a, **k}
                                              for i, (e, a, k) in enumerate(zip(engines, addresses, keys))],
                                  "policy": policy, "log_level": "debug", "scrape_interval_s": 0.2})
    with servers(*engines, gw):
        # an engine's PUB socket drops what it sends before the gateway is subscribed
        assert wait_until(lambda: metric(gw.url, "baton_hidden_state_sources_connected") == 2, timeout_s=10)
        body = {"prompt": PROMPT, "max_tokens": OUTPUT_TOKENS, "stream": True}
        with ThreadPoolExecutor(4) as pool:
            texts = list(pool.map(lambda _: chunk_texts(list(Stream(gw.url + "/v1/completions", body).events())),
                                  range(4)))
        status, direct = post(engines[0].url + "/v1/completions", {"prompt": PROMPT, "max_tokens": OUTPUT_TOKENS})
        count = metric(gw.url, "baton_hidden_states_total")
        auth_drops = metric(gw.url, 'baton_hidden_states_dropped_total{reason="auth"}')
        predictions = metric(gw.url, 'baton_policy_report{key="length_predictions"}')
        migrations = sum(float(line.rsplit(" ", 1)[1]) for line in str(get(gw.url + "/metrics")[1]).splitlines()
                         if line.startswith('baton_migrations_total{result="done"}'))
    assert status == 200 and direct["choices"][0]["text"] == expected(4, OUTPUT_TOKENS)
    assert texts == [expected(4, OUTPUT_TOKENS)] * 4
    seen: dict[int, list[int]] = {}
    for req_id, generated in re.findall(r"hidden state: request (\d+) after (\d+) generated tokens",
                                        gw.log.read_text()):
        seen.setdefault(int(req_id), []).append(int(generated))
    assert len(seen) == 4 and count == sum(len(v) for v in seen.values())
    assert auth_drops == 0 and "m1 is unauthenticated" in gw.log.read_text()
    assert predictions == count  # the learned estimator predicted on every state it got
    # the states that have seen 0, 16, 32 and 48 generated tokens (the positions the
    # predictor is trained on), each while the request is served
    every_k = list(range(0, OUTPUT_TOKENS, EVERY))
    if migrations == 0:
        assert all(sorted(v) == every_k for v in seen.values()), seen
    else:  # a continuation leg counts from its own start: the gateway offsets it by the tokens before
        assert all(len(v) >= len(every_k) and 0 in v and max(v) < OUTPUT_TOKENS for v in seen.values()), seen
