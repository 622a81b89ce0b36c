"""Request bodies of each leg."""

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
    assert "min_tokens" not in late and "max_tokens" not in late
