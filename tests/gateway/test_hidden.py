"""The hidden-state wire format between engines and the gateway, and its configuration."""

import json

import numpy as np
import pytest

from baton.core.errors import ConfigError
from baton.gateway.config import parse_engine
from baton.gateway.hidden import parse, tag_body


def frames(tag, n_gen, vec):
    return [json.dumps({"tag": tag, "n_gen": n_gen, "d": len(vec)}).encode(), np.asarray(vec, np.float32).tobytes()]


def test_a_leg_is_tagged_with_the_request_and_the_tokens_before_it():
    body = tag_body({"prompt": "x", "max_tokens": 4}, req_id=7, base_tokens=30)
    assert body["vllm_xargs"] == {"baton_tag": "7:30"} and body["prompt"] == "x"
    # the state that produced the leg's 16th token has seen 30 + 15 tokens of the request
    req_id, generated, vec = parse(frames("7:30", 16, [1.0, 2.0]))
    assert (req_id, generated, vec.tolist()) == (7, 45, [1.0, 2.0])


@pytest.mark.parametrize("bad", [
    [b"not json", b""],
    frames("7", 16, [1.0]),  # no base
    frames("x:0", 16, [1.0]),
    frames("7:0", 0, [1.0]),  # n_gen counts from 1
    [json.dumps({"tag": "7:0", "n_gen": 1, "d": 3}).encode(), np.zeros(2, np.float32).tobytes()],  # short vector
    [json.dumps({"tag": "7:0", "n_gen": 1, "d": 1}).encode()],  # one frame
    [json.dumps({"tag": "7:0", "n_gen": 1, "d": "x"}).encode(), np.zeros(1, np.float32).tobytes()],
    [json.dumps({"tag": "7:0", "n_gen": 1, "d": None}).encode(), np.zeros(1, np.float32).tobytes()],
    frames("7:0", 1, [float("nan")]),
])
def test_malformed_messages_are_dropped(bad):
    assert parse(bad) is None


def test_hidden_states_must_be_a_zmq_address():
    spec = parse_engine({"url": "http://127.0.0.1:9", "role": "decode", "hidden_states": "tcp://127.0.0.1:5599"}, "e")
    assert spec.hidden_states == "tcp://127.0.0.1:5599"
    with pytest.raises(ConfigError, match="hidden_states"):
        parse_engine({"url": "http://127.0.0.1:9", "role": "decode", "hidden_states": "http://x"}, "engines[0]")
