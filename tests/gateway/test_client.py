"""ClientOut's verbatim queue before a stream starts (a unit seam: no response is written)."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from baton.gateway.client import ClientOut
from baton.gateway.upstream import UpstreamError, piece_of
from baton.protocol.requests import CHAT, parse_request


def _piece(payload: dict):
    return piece_of(CHAT, payload, orjson.dumps(payload))


ROLE = {"id": "leg-1", "created": 7, "model": "m", "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
USAGE = {"id": "leg-1", "model": "m", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}


def _out(**extra) -> ClientOut:
    parsed = parse_request(CHAT, {"messages": [{"role": "user", "content": "hi"}], "stream": True, **extra})
    return ClientOut(None, parsed, "m", "chatcmpl-own")  # type: ignore[arg-type]


def test_a_role_chunk_alone_does_not_start_the_stream_and_is_dropped_with_its_leg():
    out = _out()
    out.adopt(ROLE)
    out.add_verbatim(_piece(ROLE), 0)
    assert out.rid == "chatcmpl-leg-1" and out.created == 7  # the leg's id, in the endpoint's style
    asyncio.run(out.flush())  # no token yet: nothing is written (the request is None here)
    assert not out.started
    out.discard_unsent()  # the leg failed before its first token
    assert out.rid == "chatcmpl-own" and out.created != 7 and not out._pending


def test_usage_chunks_are_kept_for_the_end_and_only_for_clients_that_asked():
    out = _out()
    out.add_verbatim(_piece(USAGE), 0)
    assert not out._pending and out._usage is None
    out = _out(stream_options={"include_usage": True})
    out.add_verbatim(_piece(USAGE), 0)
    assert not out._pending and out._usage == b"data: " + orjson.dumps(USAGE) + b"\n\n"
    out.leg_changed()  # the answer goes on elsewhere: these counts would be stale
    assert out._usage is None


def test_chat_chunks_with_reasoning_or_tool_calls_count_as_output():
    for delta in ({"reasoning_content": "hm"}, {"tool_calls": [{"index": 0}]}, {"reasoning": "x"}):
        assert piece_of(CHAT, {"choices": [{"index": 0, "delta": delta}]}).tokens == 1
    assert piece_of(CHAT, ROLE).tokens == 0


@pytest.mark.parametrize("ids", [0.0, [1.5], ["7"], [True], [1, None]])
def test_token_ids_that_are_not_a_list_of_integers_are_a_malformed_answer(ids):
    with pytest.raises(UpstreamError) as err:
        piece_of(CHAT, {"choices": [{"index": 0, "delta": {"content": "a"}, "token_ids": ids}]})
    assert err.value.malformed


def test_finish_chunks_relayed_verbatim_replace_the_gateways_own():
    out = _out()
    done = {**ROLE, "choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": "stop", "token_ids": [5]}]}
    out.add_verbatim(_piece(done), 1)
    assert out.finish_sent and out.tokens == 1
    assert orjson.loads(out._pending[0][6:])["choices"][0]["token_ids"] is None  # not asked for
