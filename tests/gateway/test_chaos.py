"""The standing chaos and fuzz suite: engines that answer the wrong shape, refuse, hang,
die or drop [DONE]; SIGSTOP under load; slow and malformed clients; fuzzed bodies.

Every case checks that no request is lost (a stream ends with all its tokens and [DONE],
or with an error event), that no token is wrong, and that the gateway's accounting
returns to zero. Timeouts are short (1 s) so the suite stays fast.
"""

from __future__ import annotations

import gzip
import json
import socket
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from baton.emulator.tokens import token_text
from tests.live import (Stream, _conn, get, metric, post, request, servers, start_emulator, start_fake,
                        start_gateway, wait_until)

TOKEN = "admin-token-for-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
FAST = {"admin_token": TOKEN, "scrape_interval_s": 0.2, "token_timeout_min_s": 1.0,
        "first_token_timeout_base_s": 1.0, "body_timeout_s": 1.0, "keepalive_timeout_s": 1.0}
IDS = [1, 2, 3, 4]  # a 4-token prompt given as ids, so continuations are exact


def expected(prompt_len: int, n: int) -> str:
    return "".join(f" {prompt_len + i}" for i in range(n))


def idle(gw) -> bool:
    _, body = get(gw.url + "/admin/instances", headers=AUTH)
    return all(v == 0 for v in body["in_flight"].values())


def stream_all(gw, body: dict) -> tuple[list[dict], bool]:
    """(events, whether [DONE] arrived) of one streamed request. A request that fails
    before its stream starts gets an HTTP error with a JSON body: returned as one event."""
    s = Stream(gw.url + "/v1/completions", {**body, "stream": True}, timeout=20)
    if s.status != 200:
        answer = json.loads(s.resp.read())
        s.close()
        return [answer], True
    events, done = [], False
    while True:
        line = s.resp.fp.readline()
        if not line:
            break
        if line.startswith(b"data: "):
            data = line[6:].strip()
            if data == b"[DONE]":
                done = True
                break
            events.append(json.loads(data))
    s.close()
    return events, done


def texts(events: list[dict]) -> str:
    return "".join(c.get("text") or "" for e in events for c in e.get("choices", []))


@pytest.fixture(scope="module")
def fakes(tmp_path_factory):
    """Two misbehaving mixed engines behind one colocated gateway."""
    tmp = tmp_path_factory.mktemp("chaos")
    a, b = start_fake(tmp), start_fake(tmp)
    engines = [{"name": "a", "url": a.url, "role": "mixed"}, {"name": "b", "url": b.url, "role": "mixed"}]
    gw = start_gateway(tmp, {**FAST, "engines": engines, "policy": "colocated"})
    with servers(a, b, gw):
        yield {"a": a, "b": b, "gw": gw}


def test_a_refused_request_fails_alone_and_the_engines_stay_healthy(fakes):
    gw = fakes["gw"]
    for _ in range(3):  # three in a row would take an engine out if they counted as faults
        status, body = post(gw.url + "/v1/completions", {"prompt": IDS, "max_tokens": 3, "user": "500-body"})
        assert status == 500 and body["error"]["message"] == "cannot encode"
    assert get(gw.url + "/health")[0] == 200
    for _ in range(4):
        status, body = post(gw.url + "/v1/completions", {"prompt": IDS, "max_tokens": 3})
        assert status == 200 and body["choices"][0]["text"] == expected(4, 3)
    assert wait_until(lambda: idle(gw))


def test_error_types_engines_make_up_become_openais(fakes):
    """An engine's 4xx goes to its client with its message and status, in OpenAI's words (one
    error body style: first hour, item 8); a made-up type never reaches /metrics either (a
    label value per made-up type would grow it without bound)."""
    gw = fakes["gw"]
    before = metric(gw.url, 'baton_responses_total{error_type="invalid_request_error",status="400"}')
    for i in range(3):
        status, body = post(gw.url + "/v1/completions", {"prompt": IDS, "max_tokens": 3, "user": f"type-made-up-{i}"})
        assert status == 400 and body["error"]["type"] == "invalid_request_error"
        assert body["error"]["message"] == "refused"
    assert metric(gw.url, 'baton_responses_total{error_type="invalid_request_error",status="400"}') == before + 3
    assert "made-up" not in get(gw.url + "/metrics")[1]


@pytest.mark.parametrize("mode", ["list", "str", "num", "err-str"])
def test_answers_of_the_wrong_shape_become_openai_errors(fakes, mode):
    gw = fakes["gw"]
    status, body = post(gw.url + "/v1/completions", {"prompt": IDS, "max_tokens": 3, "user": mode})
    assert status in (400, 502, 503) and isinstance(body, dict) and body["error"]["message"], body
    events, done = stream_all(gw, {"prompt": IDS, "max_tokens": 3, "user": mode})
    assert done and events and "error" in events[-1], events
    assert metric(gw.url, "baton_backend_errors_total") > 0
    assert wait_until(lambda: idle(gw))
    # malformed answers are engine faults; a good scrape brings the engines back
    assert wait_until(lambda: get(gw.url + "/health")[0] == 200, 5)


def test_a_finished_choice_without_done_is_a_complete_answer(fakes):
    gw = fakes["gw"]
    before = metric(gw.url, "baton_recoveries_total")
    events, done = stream_all(gw, {"prompt": IDS, "max_tokens": 6, "user": "no-done"})
    assert done and texts(events) == expected(4, 6) and not any("error" in e for e in events)
    assert metric(gw.url, "baton_recoveries_total") == before
    assert wait_until(lambda: idle(gw))


def test_engine_fields_the_gateway_does_not_model_reach_the_client(fakes):
    """logprobs come through on the leg the response started on (relayed verbatim; the
    fake writes spaced JSON, so its token ids are nulled by the general splice)."""
    events, done = stream_all(fakes["gw"], {"prompt": IDS, "max_tokens": 5, "logprobs": 1})
    choices = [e["choices"][0] for e in events]
    assert done and texts(events) == expected(4, 5)
    assert [c["logprobs"]["token_logprobs"] for c in choices] == [[-(4 + i) / 100] for i in range(5)]
    assert all(c["token_ids"] is None for c in choices)


@pytest.mark.parametrize("mode,max_tokens", [("finish-then-die", 4), ("finish-then-hang", 4), ("tokens-then-die", 4),
                                             ("tokens-then-die", None)])
def test_an_engine_failing_after_the_finish_reason_leaves_a_complete_answer(fakes, mode, max_tokens):
    """The answer is whole once its finish reason went out, or all the tokens the client
    asked for (vLLM's 16 for completions when it set none): no continuation adds tokens
    (with the budget spent, the reason is length); the engine's failure is still counted."""
    gw = fakes["gw"]
    before = metric(gw.url, "baton_recoveries_total"), metric(gw.url, "baton_backend_errors_total")
    body = {"prompt": IDS, "user": mode, "stream_options": {"include_usage": True}}
    events, done = stream_all(gw, body if max_tokens is None else {**body, "max_tokens": max_tokens})
    n = max_tokens or 16
    assert done and texts(events) == expected(4, n) and not any("error" in e for e in events)
    assert [c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]] == ["length"]
    assert events[-1]["usage"]["completion_tokens"] == n  # the gateway's: the fake sends none
    assert metric(gw.url, "baton_recoveries_total") == before[0]
    assert metric(gw.url, "baton_backend_errors_total") == before[1] + 1
    assert wait_until(lambda: idle(gw))


def test_a_hung_engine_is_left_and_the_stream_continues_elsewhere(fakes):
    gw = fakes["gw"]
    t0 = time.monotonic()
    events, done = stream_all(gw, {"prompt": IDS, "max_tokens": 30, "user": "hang-after-5"})
    assert done and texts(events) == expected(4, 30), events
    assert time.monotonic() - t0 < 8  # token deadline 1 s, not the 600 s total
    assert metric(gw.url, "baton_backend_errors_total") > 0
    assert wait_until(lambda: idle(gw))


def test_a_request_that_kills_two_engines_is_not_tried_a_third_time(fakes):
    gw = fakes["gw"]
    seen = [len(get(f[k].url + "/fake/requests")[1]) for f in [fakes] for k in ("a", "b")]
    events, done = stream_all(gw, {"prompt": IDS, "max_tokens": 30, "user": "die-after-2"})
    assert done and "error" in events[-1] and events[-1]["error"]["code"] == "backend_error"
    assert texts(events) == expected(4, 4)  # two tokens from each engine, none lost or repeated
    after = [len(get(fakes[k].url + "/fake/requests")[1]) for k in ("a", "b")]
    assert sum(after) - sum(seen) == 2
    assert wait_until(lambda: idle(gw))


def test_engines_never_see_the_clients_id_or_credentials(fakes):
    gw = fakes["gw"]
    c, path = _conn(gw.url + "/v1/completions", 10)
    c.request("POST", path, body=json.dumps({"prompt": IDS, "max_tokens": 2}).encode(),
              headers={"Content-Type": "application/json", "X-Request-Id": "mine",
                       "Authorization": "Bearer client-secret"})
    resp = c.getresponse()
    resp.read()
    assert resp.status == 200 and resp.getheader("X-Request-Id") == "mine"
    mine = [r for k in ("a", "b") for r in get(fakes[k].url + "/fake/requests")[1]
            if r["body"].get("max_tokens") == 2 and "user" not in r["body"]]
    assert mine
    for r in mine:
        headers = {k.lower(): v for k, v in r["headers"].items()}
        assert headers["x-request-id"].startswith("baton-")
        assert "client-secret" not in json.dumps(headers)


def test_one_hung_scrape_does_not_slow_the_others(fakes):
    gw = fakes["gw"]
    post(fakes["a"].url + "/fake/metrics-hang", {})

    def scrapes_of_b() -> float:
        lines = str(get(gw.url + "/metrics")[1]).splitlines()
        return sum(float(x.rsplit(" ", 1)[1]) for x in lines
                   if x.startswith('baton_scrapes_total{engine="b",result="ok"}'))

    before = scrapes_of_b()
    time.sleep(2.0)
    assert scrapes_of_b() - before >= 5  # 0.2 s interval; a shared loop would wait on the hung scrape


def _raw(gw, data: bytes, wait_s: float) -> bytes:
    with socket.create_connection(("127.0.0.1", gw.port), timeout=wait_s) as s:
        s.sendall(data)
        out = b""
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                out += chunk
        except socket.timeout:
            pass
        return out


def test_slow_clients_time_out_with_json_errors(fakes):
    gw = fakes["gw"]
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n{")
    t0 = time.monotonic()
    answer = _raw(gw, head, 5)
    assert b"408" in answer.split(b"\r\n")[0] and b'"error"' in answer
    assert time.monotonic() - t0 < 4
    t0 = time.monotonic()
    assert _raw(gw, b"POST /v1/comp", 5) == b""  # half a request line: closed, no answer
    assert time.monotonic() - t0 < 4


@pytest.mark.parametrize("raw, headers, status", [
    (b"[" * 5000 + b"]" * 5000, {}, 400),
    (b"not gzip", {"Content-Encoding": "gzip"}, 400),
    (gzip.compress(b'{"prompt": [1, 2], "max_tokens": 1}'), {"Content-Encoding": "gzip"}, 200),
    (json.dumps({"prompt": list(range(200_000)), "max_tokens": 1}).encode(), {}, 400),  # under max_body_bytes
])
def test_malformed_bodies_get_json_errors(fakes, raw, headers, status):
    got, body = request("POST", fakes["gw"].url + "/v1/completions", raw=raw, headers=headers)
    assert got == status and isinstance(body, dict), (got, body)
    if status >= 400:
        assert body["error"]["message"]


def test_router_and_admin_errors_are_json(fakes):
    gw = fakes["gw"]
    for method, path, headers, status in [("GET", "/nope", {}, 404), ("GET", "/v1/completions", {}, 405),
                                          ("GET", "/admin/instances", {"Authorization": "Bearer t\u00f6k"}, 401)]:
        c, p = _conn(gw.url + path, 10)
        c.putrequest(method, p)
        for k, v in headers.items():
            c.putheader(k, v.encode("latin-1"))
        c.endheaders()
        resp = c.getresponse()
        body = json.loads(resp.read())
        assert resp.status == status and body["error"]["message"], (path, body)


def test_sigstop_under_load_loses_nothing(tmp_path):
    """Eight streams through PD; one decode engine is SIGSTOPped mid-stream for 1.5 s:
    its streams continue on the other decode engine, every token exact."""
    p, d0, d1 = (start_emulator(tmp_path, "--time-scale", "2") for _ in range(3))
    engines = [{"name": "p0", "url": p.url, "role": "prefill"}, {"name": "d0", "url": d0.url, "role": "decode"},
               {"name": "d1", "url": d1.url, "role": "decode"}]
    gw = start_gateway(tmp_path, {**FAST, "engines": engines, "policy": "least-loaded"})
    with servers(p, d0, d1, gw):
        results: list[tuple[list[dict], bool]] = []
        threads = [threading.Thread(target=lambda: results.append(
            stream_all(gw, {"prompt": "a b c d", "max_tokens": 120, "ignore_eos": True}))) for _ in range(8)]
        for t in threads:
            t.start()
        time.sleep(0.8)
        d0.pause()
        time.sleep(1.5)
        d0.resume()
        for t in threads:
            t.join(30)
        assert len(results) == 8
        assert metric(gw.url, "baton_recoveries_total") >= 1  # d0's streams moved (1 s token deadline)
        for events, done in results:
            assert done and texts(events) == "".join(token_text(4 + i) for i in range(120)), texts(events)[-40:]
        assert wait_until(lambda: idle(gw))


def test_an_idle_stopped_engine_is_out_within_a_few_scrape_intervals(tmp_path):
    """Round 3, LOW: an idle SIGSTOPped engine accepts connections and answers nothing; it
    was marked unhealthy only after three scrape timeouts (15-17 s). Each scrape interval
    an unanswered scrape stays open now counts as a failed scrape."""
    m0, m1 = start_emulator(tmp_path), start_emulator(tmp_path)
    engines = [{"name": "m0", "url": m0.url, "role": "mixed"}, {"name": "m1", "url": m1.url, "role": "mixed"}]
    gw = start_gateway(tmp_path, {**FAST, "engines": engines, "policy": "colocated"})  # scrapes every 0.2 s, 5 s timeout
    healthy = 'baton_engine_healthy{engine="m0",role="mixed"}'
    with servers(m0, m1, gw):
        assert wait_until(lambda: metric(gw.url, healthy) == 1)
        m0.pause()
        t0 = time.monotonic()
        out = wait_until(lambda: metric(gw.url, healthy) == 0, timeout_s=4.0)
        took_s = time.monotonic() - t0
        answers = [post(gw.url + "/v1/completions", {"prompt": IDS, "max_tokens": 2})[0] for _ in range(4)]
        m0.resume()
        back = wait_until(lambda: metric(gw.url, healthy) == 1, timeout_s=10.0)
    assert out and took_s < 4.0, took_s
    assert answers == [200] * 4 and back  # served by m1 meanwhile; m0 back once it answers


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fuzz")
    m = start_emulator(tmp, "--max-model-len", "64")  # a chat without max_tokens runs to the end of the context
    gw = start_gateway(tmp, {**FAST, "engines": [{"name": "m", "url": m.url, "role": "mixed"}],
                             "policy": "colocated"})
    with servers(m, gw):
        yield gw


json_values = st.recursive(st.none() | st.booleans() | st.integers(-5, 70000) | st.floats(allow_nan=False)
                           | st.text(max_size=20),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                      max_size=4),
                           max_leaves=12)
fields = st.sampled_from(["prompt", "messages", "max_tokens", "stream", "n", "min_tokens", "temperature",
                          "kv_transfer_params", "stop", "logprobs", "model", "max_completion_tokens"])


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(body=st.dictionaries(fields, json_values, max_size=5), chat=st.booleans())
def test_fuzzed_bodies_never_get_a_5xx_or_a_non_json_answer(plain, body, chat):
    path = "/v1/chat/completions" if chat else "/v1/completions"
    body = {**body, "stream": False} if isinstance(body.get("stream"), bool) else body
    if isinstance(body.get("max_tokens"), int):
        body["max_tokens"] = min(body["max_tokens"], 4)
    status, answer = post(plain.url + path, body, timeout=20)
    assert status < 500 and isinstance(answer, dict), (status, answer)
