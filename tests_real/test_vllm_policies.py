"""SIBYL and ARES on three real vLLM CPU instances (1 prefill + 2 decode, ExampleConnector
through one shared folder): SIBYL answers every shape of request (it failed every
non-streaming one live before the one-core rework), and ARES migrates running decodes
between the two decode instances and keeps ticking after the requests it moved finish (it
stopped for good after its first finished migration)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.live import Stream, chunk_texts, decision_log, get, metric, post, request, servers, start_gateway, wait_until
from tests_real.conftest import AUTH, GREEDY, NEEDS_VLLM, PROMPTS, VLLM

pytestmark = NEEDS_VLLM
ROOM = {"scrape_interval_s": 0.5, "upstream_timeout_s": 300, "first_token_timeout_base_s": 120,
        "token_timeout_min_s": 60, "admin_token": "real-vllm-admin-token"}


@pytest.fixture(scope="module")
def third(stack):
    """A second decode instance beside the session's two, on the same KV folder."""
    from tests.live import free_port
    tmp = stack["tmp"]
    engine = VLLM(free_port(), tmp / "kv", tmp / "vllm-2.log")
    try:
        engine.wait_started()
        yield engine
    finally:
        engine.stop()


def engines(stack, third, second_role: str = "decode") -> list[dict]:
    return [{"name": "prefill", "url": stack["prefill"].url, "role": "prefill", "model": "smollm2"},
            {"name": "decode", "url": stack["decode"].url, "role": "decode", "model": "smollm2"},
            {"name": "decode2", "url": third.url, "role": second_role, "model": "smollm2"}]


def idle(gw) -> bool:
    body = get(gw.url + "/admin/instances", headers=AUTH)[1]
    return all(v == 0 for v in body["in_flight"].values()) and all(v == 0 for v in body["held_prefills"].values())


def test_sibyl_answers_streaming_and_non_streaming_completions_and_chat(stack, third, tmp_path):
    gw = start_gateway(tmp_path, {"engines": engines(stack, third), "policy": "sibyl", **ROOM})
    chat = {"model": "smollm2", "messages": [{"role": "user", "content": "Say hello."}], **GREEDY}
    with servers(gw):
        for prompt in PROMPTS:
            completion = {"model": "smollm2", "prompt": prompt, **GREEDY}
            status, direct = post(stack["decode"].url + "/v1/completions", completion, timeout=300)
            status2, body = post(gw.url + "/v1/completions", completion, timeout=300)
            assert status == status2 == 200, body
            want = direct["choices"][0]["text"]
            assert body["choices"][0]["text"] == want and want.strip()
            assert body["usage"]["completion_tokens"] == direct["usage"]["completion_tokens"]
            s = Stream(gw.url + "/v1/completions", {"model": "smollm2", "prompt": prompt, "stream": True,
                                                     **GREEDY}, timeout=300)
            assert s.status == 200 and chunk_texts(list(s.events())) == want
            s.close()
        status, direct = post(third.url + "/v1/chat/completions", chat, timeout=300)
        status2, got = post(gw.url + "/v1/chat/completions", chat, timeout=300)
        assert status == status2 == 200
        assert got["choices"][0]["message"]["content"] == direct["choices"][0]["message"]["content"]
        assert wait_until(lambda: idle(gw), timeout_s=10)
        ok = metric(gw.url, 'baton_requests_total{outcome="ok",path="pd-early"}')  # labels sorted
        placed = {inst for kind, _, inst in decision_log(gw.url, "real-vllm-admin-token") if kind == "decode"}
    assert ok == 2 * len(PROMPTS) + 1  # SIBYL binds every decode early
    assert placed <= {1, 2} and placed
    assert "Traceback" not in gw.log.read_text()


def _stream_all(url: str, body: dict) -> list[dict]:
    s = Stream(url + "/v1/completions", body, timeout=300)
    assert s.status == 200
    events = list(s.events())
    s.close()
    return events


def test_ares_migrates_between_real_decode_instances_and_keeps_ticking(stack, third, tmp_path):
    """Four long greedy decodes start on ``decode`` while ``decode2`` is a prefill
    instance; once it turns decode (an operator adding capacity), ARES balances by moving
    running requests there mid-stream. Every answer keeps its exact length, and ARES's
    ticks go on after the moved requests have finished."""
    policy = {"name": "ares-real", "stages": [{"stage": "least-kv"}, {"stage": "ares", "interval_s": 0.5}]}
    gw = start_gateway(tmp_path, {"engines": engines(stack, third, "prefill"), "policy": policy, **ROOM})
    body = {"model": "smollm2", "prompt": "Once upon a time, in a small village by the sea,", "max_tokens": 160,
            "temperature": 0.0, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    with servers(gw), ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(_stream_all, gw.url, body) for _ in range(4)]
        decoding = lambda: [r for r in get(gw.url + "/admin/requests", headers=AUTH)[1]["requests"]  # noqa: E731
                            if r["phase"] == "decode" and r["generated_tokens"] >= 4]
        assert wait_until(lambda: len(decoding()) == 4, timeout_s=240, interval_s=0.2)
        status, _ = request("PATCH", gw.url + "/admin/instances/decode2", {"role": "decode"}, headers=AUTH)
        assert status == 200
        results = [f.result(timeout=600) for f in futures]
        moved = metric(gw.url, 'baton_migrations_total{result="ok"}')
        ticks = metric(gw.url, 'baton_policy_ticks_total{stage="1"}')
        time.sleep(1.5)
        ticks_later = metric(gw.url, 'baton_policy_ticks_total{stage="1"}')
        errors = metric(gw.url, "baton_policy_tick_errors_total")
        assert wait_until(lambda: idle(gw), timeout_s=10)
    assert all(e[-1]["usage"]["completion_tokens"] == 160 for e in results)
    assert all(len(chunk_texts(e)) > 0 for e in results)
    assert moved >= 1, "ARES moved nothing to the new decode instance"
    assert ticks_later > ticks and errors == 0
    assert "Traceback" not in gw.log.read_text()
