"""What the gateway refuses in a body before any engine sees it, as vLLM would: ``stop``
with more than four strings (real vLLM 0.x answers 400 "List should have at most 4 items";
a request with 2,000 stop strings of 500 characters froze the emulators it reached, round 3
finding 2), or of the wrong type. One long stop string passes, as it does in vLLM."""

from __future__ import annotations

import pytest

from baton.protocol.errors import ApiError
from baton.protocol.requests import COMPLETIONS, parse_request


@pytest.mark.parametrize("stop", [None, "END", [], ["a", "b", "c", "d"], ["y" * 100_000]])
def test_stops_vllm_takes_pass(stop):
    body = {"prompt": "hi", **({} if stop is None else {"stop": stop})}
    assert parse_request(COMPLETIONS, body).body is body


@pytest.mark.parametrize("stop,message", [
    (["s"] * 5, "at most 4 strings, got 5"), ([f"s{i}" + "x" * 495 for i in range(2000)], "got 2000"),
    ([1, 2], "a string or a list of strings"), ({"a": 1}, "a string or a list of strings"), (7, "list of strings"),
])
def test_stops_vllm_refuses_are_a_400_naming_stop(stop, message):
    with pytest.raises(ApiError) as err:
        parse_request(COMPLETIONS, {"prompt": "hi", "stop": stop})
    assert err.value.status == 400 and err.value.param == "stop" and message in err.value.message
