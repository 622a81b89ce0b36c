"""Request bodies of each leg."""

import pytest
from baton.gateway import handoff
from baton.protocol.requests import CHAT, COMPLETIONS, parse_request


def parsed(kind=COMPLETIONS, **body):
    base = {"prompt": "hi"} if kind == COMPLETIONS else {"messages": [{"role": "user", "content": "hi"}]}
    return parse_request(kind, {**base, **body})


def test_nixl_prefill_leg():
    p = parsed(max_tokens=50, min_tokens=10, stream=True, stream_options={"include_usage": True}, temperature=0)
    body = handoff.prefill_body(p)
    assert body["max_tokens"] == 1 and body["stream"] is False and "min_tokens" not in body
    assert "stream_options" not in body and body["temperature"] == 0
    assert body["kv_transfer_params"]["do_remote_decode"] is True
    assert p.body["max_tokens"] == 50  # the original is untouched


def test_nixl_decode_leg_carries_the_returned_params():
    p = parsed(max_tokens=50, min_tokens=10)
    params = {"do_remote_prefill": True, "remote_block_ids": [1, 2], "remote_engine_id": "e"}
    body = handoff.decode_body(p, params, with_ids=True)
    assert body["kv_transfer_params"] == params and body["max_tokens"] == 50 and body["min_tokens"] == 10
    assert body["stream"] is True and body["return_token_ids"] is True
    assert "kv_transfer_params" not in handoff.decode_body(p, None, with_ids=False)  # ExampleConnector


def test_sglang_legs_share_bootstrap_fields():
    pre, dec = handoff.sglang_bodies(parsed(max_tokens=5), "10.0.0.1", 8998, 42, with_ids=False)
    for b in (pre, dec):
        assert (b["bootstrap_host"], b["bootstrap_port"], b["bootstrap_room"]) == ("10.0.0.1", 8998, 42)
    assert pre["stream"] is False and dec["stream"] is True and "return_token_ids" not in dec


def test_continuation_reduces_limits_and_keeps_sampling():
    p = parsed(CHAT, max_completion_tokens=100, min_tokens=30, temperature=0.7, stop=["x"], tools=[])
    body = handoff.continuation_body(p, [1, 2, 3], [7, 8, 9, 10])
    assert body["prompt"] == [1, 2, 3, 7, 8, 9, 10]
    assert body["max_tokens"] == 96 and body["min_tokens"] == 26
    assert body["temperature"] == 0.7 and body["stop"] == ["x"]
    assert "messages" not in body and "tools" not in body and "max_completion_tokens" not in body
    late = handoff.continuation_body(parsed(min_tokens=3), [1], [5, 6, 7, 8])
    # no client max_tokens: the engine default budget (16) carries over, not a fresh 16
    assert "min_tokens" not in late and late["max_tokens"] == 12
    assert handoff.continuation_body(parsed(), [1], [5, 6, 7], default_max_tokens=10)["max_tokens"] == 7
    # a chat request without a budget runs to the end of the context: so does its
    # continuation, where the target's context length is known
    assert handoff.continuation_body(parsed(CHAT), [1], [5, 6, 7] * 10, context_tokens=2048)["max_tokens"] == 2017
    assert handoff.continuation_body(parsed(CHAT), [1], [5, 6, 7])["max_tokens"] == 13  # unknown: the default


TRANSPORT = {"kv_transfer_params": {"do_remote_prefill": True, "remote_host": "10.9.9.9", "remote_port": 1},
             "bootstrap_host": "10.9.9.9", "bootstrap_port": 1, "bootstrap_room": 7}


@pytest.mark.parametrize("field", sorted(TRANSPORT))
def test_client_transport_fields_never_reach_a_leg(field):
    """Even a body that skipped the server's allow-list: no leg carries the client's value."""
    p = parsed(**{field: TRANSPORT[field]}, temperature=0.5)
    bodies = [handoff.prefill_body(p), handoff.decode_body(p, None, True), handoff.colocated_body(p, True),
              *handoff.sglang_bodies(p, "127.0.0.1", 8998, 3, True),
              handoff.continuation_body(p, [1], [2])]
    for body in bodies:
        assert body.get(field) != TRANSPORT[field], body
        assert body.get("temperature") == 0.5


def test_server_allow_list_keeps_openai_and_sampling_fields_and_drops_the_rest():
    from baton.protocol.requests import split_fields
    body = {"prompt": "x", "max_tokens": 3, "ignore_eos": True, "min_tokens": 1, "top_k": 5, "min_p": 0.1,
            "repetition_penalty": 1.1, "max_completion_tokens": 3, "response_format": {"type": "json_object"},
            "guided_json": {}, "return_token_ids": True, **TRANSPORT, "engine_secret": 1}
    kept, dropped = split_fields(body)
    assert sorted(dropped) == sorted([*TRANSPORT, "engine_secret"])
    assert set(kept) == set(body) - set(dropped)
