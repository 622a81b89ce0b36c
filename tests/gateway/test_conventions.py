"""The gateway's conventions (first hour, item 8): one response id style per endpoint, the
engine's stop_reason passed on, one error body style, metric labels Prometheus keeps, no
``_created`` series, and the configured SLOs as histogram bucket edges."""

from __future__ import annotations

import re

import pytest

from baton.protocol.errors import OPENAI_ERROR_TYPES
from tests.live import Stream, get, post, request, servers, start_emulator, start_fake, start_gateway

CHAT = {"messages": [{"role": "user", "content": "hi there"}], "max_tokens": 4}
TEXT = {"prompt": "hello there", "max_tokens": 4}
SLOS = {"ttft_slo_s": 0.7, "tpot_slo_s": 0.033,
        "classes": {"objectives": {"fast": {"priority": 1, "ttft_slo_ms": 250}}}}


@pytest.fixture(scope="module")
def gateways(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("conventions")
    p, d, m, fake = start_emulator(tmp), start_emulator(tmp), start_emulator(tmp), start_fake(tmp)
    pd = start_gateway(tmp, {"engines": [{"name": "p", "url": p.url, "role": "prefill"},
                                         {"name": "d", "url": d.url, "role": "decode"}],
                             "policy": "least-loaded", **SLOS})
    colocated = start_gateway(tmp, {"engines": [{"name": "m", "url": m.url, "role": "mixed"}],
                                    "policy": "colocated"})
    odd = start_gateway(tmp, {"engines": [{"name": "f", "url": fake.url, "role": "mixed"}], "policy": "colocated"})
    with servers(p, d, m, fake, pd, colocated, odd):
        yield {"pd": pd, "colocated": colocated, "fake": odd}


@pytest.mark.parametrize("which", ["pd", "colocated"])
@pytest.mark.parametrize("path, body, prefix", [("/v1/chat/completions", CHAT, "chatcmpl-"),
                                                ("/v1/completions", TEXT, "cmpl-")])
def test_one_response_id_style_per_endpoint_on_every_path(gateways, which, path, body, prefix):
    """Streaming PD chat answered with ids like ``baton-...`` (the engine's X-Request-Id)."""
    url = gateways[which].url + path
    status, whole = post(url, body)
    assert status == 200 and whole["id"].startswith(prefix), whole
    s = Stream(url, {**body, "stream": True, "stream_options": {"include_usage": True}})
    ids = {e["id"] for e in s.events()}
    s.close()
    assert len(ids) == 1 and next(iter(ids)).startswith(prefix), ids


@pytest.mark.parametrize("path, body", [("/v1/chat/completions", CHAT), ("/v1/completions", TEXT)])
def test_a_non_streamed_answer_carries_the_engines_stop_reason(gateways, path, body):
    url = gateways["pd"].url + path
    status, plain = post(url, {**body, "max_tokens": 6})
    assert status == 200 and plain["choices"][0]["stop_reason"] is None  # present, as vLLM has it
    words = (plain["choices"][0].get("text") or plain["choices"][0]["message"]["content"]).split()
    stop = " " + words[2]
    status, stopped = post(url, {**body, "max_tokens": 6, "stop": [stop]})
    choice = stopped["choices"][0]
    assert status == 200 and choice["finish_reason"] == "stop" and choice["stop_reason"] == stop, stopped


def _error_is_openais(status: int, body: dict) -> None:
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, body
    assert err["type"] in OPENAI_ERROR_TYPES and isinstance(err["code"], str) and err["message"], body


def test_every_error_body_is_openais(gateways):
    pd, fake = gateways["pd"].url, gateways["fake"].url
    cases = [
        post(pd + "/v1/completions", {**TEXT, "model": "nope"}),                     # the gateway's own 404
        request("GET", pd + "/v1/nothing"),                                           # aiohttp's 404
        request("GET", pd + "/v1/completions"),                                       # aiohttp's 405
        post(pd + "/v1/completions", {"prompt": "x", "max_tokens": -1}),             # the gateway's 400
        post(fake + "/v1/completions", {"prompt": [1, 2], "max_tokens": 2, "user": "type-MadeUp"}),
        post(fake + "/v1/completions", {"prompt": [1, 2], "max_tokens": 2, "user": "vllm-old"}),
        post(fake + "/v1/completions", {"prompt": [1, 2], "max_tokens": 2, "user": "500-body"}),
    ]
    for status, body in cases:
        assert status >= 400
        _error_is_openais(status, body)
    assert cases[0][1]["error"]["type"] == "invalid_request_error" and cases[0][1]["error"]["code"] == "model_not_found"
    old = cases[5][1]["error"]  # older vLLM's top-level body: its message kept, in OpenAI's words
    assert cases[5][0] == 400 and old["message"] == "max_tokens is too large"
    assert old["type"] == "invalid_request_error" and old["code"] == "400"


def test_metrics_label_engines_engine_have_no_created_series_and_slos_are_bucket_edges(gateways):
    url = gateways["pd"].url
    post(url + "/v1/completions", TEXT)
    text = get(url + "/metrics")[1]
    assert 'baton_engine_healthy{engine="d",role="decode"} 1.0' in text
    assert 'baton_scrapes_total{engine="p",result="ok"}' in text
    assert not re.search(r'^baton_\w+\{[^}]*\binstance=', text, re.M)  # Prometheus overwrites `instance`
    assert "_created" not in text
    for edge in ("0.7", "0.25"):  # the gateway's TTFT SLO and the objective's 250 ms
        assert re.search(rf'^baton_ttft_seconds_bucket\{{le="{edge}",path="pd"\}}', text, re.M), edge
        assert re.search(rf'^baton_engine_ttft_seconds_bucket\{{engine="d",le="{edge}"\}}', text, re.M), edge
    assert re.search(r'^baton_tpot_seconds_bucket\{le="0.033",path="pd"\}', text, re.M)
    assert re.search(r'^baton_tbt_seconds_bucket\{le="0.033",path="pd"\}', text, re.M)


def test_an_engine_id_in_another_style_gets_the_endpoints_prefix_in_relayed_bytes_too(gateways):
    """The fake engine names its answers by the bare X-Request-Id (as SGLang may); relayed
    verbatim, its chunks (logprobs and all) carry the id with the endpoint's prefix."""
    s = Stream(gateways["fake"].url + "/v1/completions", {"prompt": [1, 2, 3, 4], "max_tokens": 3, "logprobs": 1,
                                                          "stream": True})
    events = list(s.events())
    s.close()
    ids = {e["id"] for e in events}
    assert len(ids) == 1 and next(iter(ids)).startswith("cmpl-"), ids
    assert all(e["choices"][0]["logprobs"] is not None for e in events if e["choices"] and e["choices"][0]["text"])
