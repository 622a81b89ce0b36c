"""Two real vLLM CPU instances (prefill and decode, ExampleConnector through a shared
folder) behind the gateway: greedy PD output equals a single instance's, streaming works,
and the gateway reads the engines' scraped metrics."""

from __future__ import annotations

from tests.live import Stream, chunk_texts, get, metric, post, request, wait_until
from tests_real.conftest import AUTH, GREEDY, NEEDS_VLLM, PROMPTS

pytestmark = NEEDS_VLLM


def reference(url: str, prompt: str) -> str:
    status, body = post(url + "/v1/completions", {"model": "smollm2", "prompt": prompt, **GREEDY}, timeout=300)
    assert status == 200, body
    return body["choices"][0]["text"]


def test_pd_greedy_output_equals_a_single_instance(stack):
    gw, single = stack["gw"], stack["decode"]
    before = {k: metric(stack[k].url, "vllm:request_success_total") for k in ("prefill", "decode")}
    for prompt in PROMPTS:
        want = reference(single.url, prompt)
        status, body = post(gw.url + "/v1/completions", {"model": "smollm2", "prompt": prompt, **GREEDY},
                            timeout=300)
        assert status == 200, body
        assert body["choices"][0]["text"] == want and want.strip()
    after = {k: metric(stack[k].url, "vllm:request_success_total") for k in ("prefill", "decode")}
    assert after["prefill"] - before["prefill"] == 2  # the prefill legs ran on the prefill instance
    assert after["decode"] - before["decode"] == 4  # two references + two decode legs


def test_streaming_through_the_gateway(stack):
    """The PD stream is relayed verbatim: apart from the response id and creation time it
    is what vLLM streams to a client directly, token ids (asked for by the gateway's leg,
    not by the client) nulled as vLLM nulls them."""
    gw = stack["gw"]
    want = reference(stack["decode"].url, PROMPTS[0])
    body = {"model": "smollm2", "prompt": PROMPTS[0], "stream": True, "stream_options": {"include_usage": True},
            **GREEDY}
    s = Stream(gw.url + "/v1/completions", body, timeout=300)
    assert s.status == 200
    events = list(s.events())
    s.close()
    assert chunk_texts(events) == want
    assert events[-1]["usage"]["completion_tokens"] == 24
    assert len([e for e in events if e.get("choices")]) > 2  # really streamed, not one blob
    direct = list(Stream(stack["decode"].url + "/v1/completions", body, timeout=300).events())
    strip = lambda e: {k: v for k, v in e.items() if k not in ("id", "created")}  # noqa: E731
    assert [strip(e) for e in events] == [strip(e) for e in direct]
    assert len({e["id"] for e in events}) == 1


def test_chat_through_the_gateway(stack):
    gw, single = stack["gw"], stack["decode"]
    body = {"model": "smollm2", "messages": [{"role": "user", "content": "Say hello."}], **GREEDY}
    status, want = post(single.url + "/v1/chat/completions", body, timeout=300)
    assert status == 200
    status, got = post(gw.url + "/v1/chat/completions", body, timeout=300)
    assert status == 200 and got["choices"][0]["message"]["content"] == want["choices"][0]["message"]["content"]


def test_scraped_engine_metrics_are_read(stack):
    gw = stack["gw"]

    def scraped():
        insts = get(gw.url + "/admin/instances", headers=AUTH)[1]["instances"]
        return all(i["scraped"] and i["scraped"]["running"] is not None and i["scraped"]["kv_usage"] is not None
                   and i["scraped"]["age_s"] < 5 for i in insts)
    assert wait_until(scraped, timeout_s=10)
    assert metric(gw.url, 'baton_scrapes_total{engine="decode",result="ok"}') > 0
    assert wait_until(lambda: all(v == 0 for v in get(gw.url + "/admin/instances", headers=AUTH)[1]["in_flight"].values()))


def test_migration_by_continuation_on_real_engines(stack):
    """Mid-stream move from the decode to the other instance: vLLM returns the prompt and
    output token ids, the target continues from them, and greedy output is unchanged."""
    gw = stack["gw"]
    body = {"model": "smollm2", "prompt": "Once upon a time, in a small village by the sea,",
            "max_tokens": 40, "temperature": 0.0}
    status, want = post(stack["decode"].url + "/v1/completions", body, timeout=300)
    assert status == 200
    ok_before = metric(gw.url, 'baton_migrations_total{result="ok"}')
    s = Stream(gw.url + "/v1/completions", {**body, "stream": True}, timeout=300)
    events, it = [], s.events()
    for _ in range(8):
        events.append(next(it))
    (req,) = get(gw.url + "/admin/requests", headers=AUTH)[1]["requests"]
    # only a decoding instance takes a migration: the prefill instance (kv_both) turns mixed
    status, _ = post(gw.url + f"/admin/requests/{req['req_id']}/migrate", {"target": "prefill"}, headers=AUTH)
    assert status == 409
    status, _ = request("PATCH", gw.url + "/admin/instances/prefill", {"role": "mixed"}, headers=AUTH)
    assert status == 200
    status, _ = post(gw.url + f"/admin/requests/{req['req_id']}/migrate", {"target": "prefill"}, headers=AUTH)
    assert status == 202
    events += list(it)
    s.close()
    assert metric(gw.url, 'baton_migrations_total{result="ok"}') == ok_before + 1
    assert chunk_texts(events) == want["choices"][0]["text"]


def test_a_chat_without_a_budget_continues_to_its_natural_end_after_a_migration(stack):
    """A chat request without max_tokens runs to EOS (vLLM's chat default is the rest of
    the context); its continuation must too, not stop at the completions default of 16
    (vLLM reads max_tokens: null as 16 there: the gateway sends max_model_len minus the
    context). The text is not compared past the move: a greedy continuation that
    re-prefills in bfloat16 may take another token where two logits are nearly equal."""
    gw = stack["gw"]
    body = {"model": "smollm2", "messages": [{"role": "user", "content": "Write three sentences about the sea."}],
            "temperature": 0.0}
    status, want = post(stack["decode"].url + "/v1/chat/completions", body, timeout=300)
    assert status == 200 and want["usage"]["completion_tokens"] > 24, want["usage"]  # longer than 16 + what moves
    status, _ = request("PATCH", gw.url + "/admin/instances/prefill", {"role": "mixed"}, headers=AUTH)
    assert status == 200
    s = Stream(gw.url + "/v1/chat/completions", {**body, "stream": True}, timeout=300)
    events, it = [], s.events()
    for _ in range(4):
        events.append(next(it))
    (req,) = get(gw.url + "/admin/requests", headers=AUTH)[1]["requests"]
    target = "prefill" if req["decode_instance"] != 0 else "decode"
    status, _ = post(gw.url + f"/admin/requests/{req['req_id']}/migrate", {"target": target}, headers=AUTH)
    assert status == 202
    events += list(it)
    s.close()
    reasons = [c["finish_reason"] for e in events for c in e.get("choices", []) if c.get("finish_reason")]
    assert reasons == ["stop"]  # ended by the model, not by a budget
    moved_at = len(chunk_texts(events[:4]))
    assert chunk_texts(events)[:moved_at] == want["choices"][0]["message"]["content"][:moved_at]
    assert len([e for e in events[4:] if chunk_texts([e])]) > 20  # tokens after the move: more than 16


def test_the_gateway_refuses_the_stop_lists_vllm_refuses(stack):
    """Round 3, finding 2: the gateway answers ``stop`` as vLLM does (more than four strings:
    400; one long string: served), so nothing vLLM would refuse reaches an engine."""
    many = {"model": "smollm2", "prompt": PROMPTS[0], "max_tokens": 4, "stop": [f"s{i}" for i in range(5)]}
    long_one = {"model": "smollm2", "prompt": PROMPTS[0], "max_tokens": 4, "stop": ["y" * 100_000]}
    for url in (stack["decode"].url, stack["gw"].url):
        status, body = post(url + "/v1/completions", many, timeout=120)
        assert status == 400, (url, body)
        assert post(url + "/v1/completions", long_one, timeout=300)[0] == 200, url
