"""The hidden-state wire format between engines and the gateway, and its configuration."""

import json

import numpy as np
import pytest

from baton.core.errors import ConfigError
from baton.gateway.config import parse_config, parse_engine
from baton.gateway.hidden import Drop, LegTags, parse, tag_body

TAG = "0123456789abcdef0123456789abcdef"
KEY = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"  # a Z85 public key (the ZMQ docs' example)


def frames(tag, n_gen, vec):
    return [json.dumps({"tag": tag, "n_gen": n_gen, "d": len(vec)}).encode(), np.asarray(vec, np.float32).tobytes()]


def test_a_leg_is_tagged_with_a_random_token_that_stands_for_it():
    tags = LegTags()
    tag = tags.issue(7, 30, 2)
    body = tag_body({"prompt": "x", "max_tokens": 4}, tag)
    assert body["vllm_xargs"] == {"baton_tag": tag} and body["prompt"] == "x" and len(tag) == 32
    leg = tags.get(tag)
    assert (leg.req_id, leg.base_tokens, leg.instance) == (7, 30, 2)
    tag2 = tags.issue(7, 40, 2)  # a new leg there revokes the old one
    assert tags.get(tag) is None and tags.get(tag2) is not None
    tags.drop(7)
    assert len(tags) == 0
    parsed_tag, n_gen, vec = parse(frames(TAG, 16, [1.0, 2.0]))
    assert (parsed_tag, n_gen, vec.tolist()) == (TAG, 16, [1.0, 2.0])


@pytest.mark.parametrize("bad,reason", [
    ([b"not json", b""], "malformed"),
    (frames("7:0", 16, [1.0]), "unknown_tag"),  # the old sequential format
    (frames(TAG, 0, [1.0]), "malformed"),  # n_gen counts from 1
    (frames(TAG, 10**400, [1.0]), "malformed"),
    (frames(TAG, 10**8, [1.0]), "malformed"),
    ([json.dumps({"tag": TAG, "n_gen": 1, "d": 3}).encode(), np.zeros(2, np.float32).tobytes()], "malformed"),
    ([json.dumps({"tag": TAG, "n_gen": 1, "d": 1}).encode()], "malformed"),  # one frame
    ([json.dumps({"tag": TAG, "n_gen": 1, "d": "x"}).encode(), np.zeros(1, np.float32).tobytes()], "malformed"),
    ([json.dumps({"tag": TAG, "n_gen": 1, "d": None}).encode(), np.zeros(1, np.float32).tobytes()], "malformed"),
    ([json.dumps({"tag": TAG, "n_gen": 1, "d": 70_000}).encode(), b""], "too_large"),
    ([b"[" * 200, b""], "malformed"),
    ([b"[" * 100_000, b""], "malformed"),
    ([b'"just a string"', b""], "malformed"),
    (frames(TAG, 1, [float("nan")]), "malformed"),
])
def test_malformed_messages_are_dropped_by_reason(bad, reason):
    with pytest.raises(Drop) as info:
        parse(bad)
    assert info.value.reason == reason


def test_hidden_states_must_be_a_zmq_address():
    spec = parse_engine({"url": "http://127.0.0.1:9", "role": "decode", "hidden_states": "tcp://127.0.0.1:5599"}, "e")
    assert spec.hidden_states == "tcp://127.0.0.1:5599" and spec.hidden_states_key is None
    with pytest.raises(ConfigError, match="hidden_states"):
        parse_engine({"url": "http://127.0.0.1:9", "role": "decode", "hidden_states": "http://x"}, "engines[0]")


def test_an_engines_curve_public_key_inline_or_from_its_certificate(tmp_path):
    base = {"url": "http://127.0.0.1:9", "role": "decode", "hidden_states": "tcp://127.0.0.1:5599"}
    assert parse_engine({**base, "hidden_states_key": KEY}, "e").hidden_states_key == KEY
    cert = tmp_path / "engine.key"
    cert.write_text(f'metadata\ncurve\n    public-key = "{KEY}"\n')
    assert parse_engine({**base, "hidden_states_key_file": str(cert)}, "e").hidden_states_key == KEY
    for bad, match in [({"hidden_states_key": "short"}, "40 Z85"),
                       ({"hidden_states_key_file": str(tmp_path / "none")}, "cannot read"),
                       ({"hidden_states_key": KEY, "hidden_states_key_file": str(cert)}, "not both")]:
        with pytest.raises(ConfigError, match=match):
            parse_engine({**base, **bad}, "engines[0]")
    with pytest.raises(ConfigError, match="needs hidden_states"):
        parse_engine({"url": "http://127.0.0.1:9", "role": "decode", "hidden_states_key": KEY}, "engines[0]")
    with pytest.raises(ConfigError, match="admin API"):
        parse_engine({**base, "hidden_states_key_file": str(cert)}, "body", env_allowlist=frozenset())


def test_the_gateways_client_key_comes_from_the_environment_and_bounds_are_positive(monkeypatch):
    raw = {"engines": [{"url": "http://127.0.0.1:9", "role": "mixed"}]}
    monkeypatch.setenv("GW_KEY", KEY)
    cfg = parse_config({**raw, "hidden_states_client_key_env": "GW_KEY", "hidden_states_rate_per_s": 100})
    assert cfg.hidden_states_client_key == KEY and KEY not in repr(cfg) and cfg.hidden_states_rate_per_s == 100
    monkeypatch.setenv("GW_KEY", "not a key")
    with pytest.raises(ConfigError, match="40 Z85") as info:
        parse_config({**raw, "hidden_states_client_key_env": "GW_KEY"})
    assert "not a key" not in str(info.value)
    with pytest.raises(ConfigError, match="UNSET_KEY is not set"):
        parse_config({**raw, "hidden_states_client_key_env": "UNSET_KEY"})
    with pytest.raises(ConfigError, match="hidden_states_max_dim"):
        parse_config({**raw, "hidden_states_max_dim": 0})
