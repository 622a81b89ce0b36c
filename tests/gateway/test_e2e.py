"""End to end on 127.0.0.1: emulators and gateways as real processes.

Emulator output token ids are their absolute positions and their text a word chosen by
the position (``token_text``), so every test checks the exact token sequence a client
received.
"""

from __future__ import annotations

import json
import threading

import orjson
import pytest

from baton.emulator.tokens import token_text

from tests.live import (Stream, chunk_texts, decision_log, get, metric, post, request, servers, start_emulator,
                        start_gateway, wait_until)

TOKEN = "admin-token-for-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PROMPT = "a b c d"  # 4 prompt tokens for the emulator


def expected(prompt_len: int, n: int) -> str:
    return "".join(token_text(prompt_len + i) for i in range(n))


def engines(p, d0, d1):
    return [{"name": "p0", "url": p.url, "role": "prefill"},
            {"name": "d0", "url": d0.url, "role": "decode"},
            {"name": "d1", "url": d1.url, "role": "decode"}]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """One prefill and two decode emulators, and gateways with different policies on them."""
    tmp = tmp_path_factory.mktemp("e2e")
    p, d0, d1 = (start_emulator(tmp, "--time-scale", "2") for _ in range(3))
    base = {"engines": engines(p, d0, d1), "admin_token": TOKEN, "scrape_interval_s": 0.2}
    gws = {"pd": start_gateway(tmp, {**base, "policy": "least-loaded", "max_body_bytes": 65536}),
           "ils": start_gateway(tmp, {**base, "policy": "ils"}),
           "colocated": start_gateway(tmp, {"engines": engines(p, d0, d1), "policy": "colocated"}),
           # the whole gateway's cap: this client may use every slot (its share: test_client_shares.py)
           "small": start_gateway(tmp, {**base, "policy": "least-loaded", "max_inflight": 2,
                                        "max_inflight_per_client": 2}),
           "rebuild": start_gateway(tmp, {"engines": engines(p, d0, d1), "policy": "colocated",
                                          "verbatim_relay": False})}
    with servers(p, d0, d1, *gws.values()):
        yield {"p": p, "d0": d0, "d1": d1, **gws}


def idle(gw) -> bool:
    """The gateway's accounting is back to zero everywhere."""
    _, body = get(gw.url + "/admin/instances", headers=AUTH)
    return all(v == 0 for v in body["in_flight"].values())


def decisions(gw) -> list[tuple[str, int, int]]:
    return decision_log(gw.url, TOKEN)


def complete(gw, n=8, prompt=PROMPT, **extra):
    return post(gw.url + "/v1/completions", {"prompt": prompt, "max_tokens": n, "ignore_eos": True, **extra})


def test_pd_routing_prefills_on_prefill_and_pulls_kv_on_decode(cluster):
    gw, before = cluster["pd"], {k: metric(cluster[k].url, "vllm:prompt_tokens_total") for k in ("p", "d0", "d1")}
    results = [None] * 6

    def one(i):
        results[i] = complete(gw, 20)
    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    [t.start() for t in threads]
    [t.join(30) for t in threads]
    for status, body in results:
        assert status == 200, body
        assert body["choices"][0]["text"] == expected(4, 20)
        assert body["usage"] == {"prompt_tokens": 4, "completion_tokens": 20, "total_tokens": 24}
    after = {k: metric(cluster[k].url, "vllm:prompt_tokens_total") for k in ("p", "d0", "d1")}
    assert after["p"] - before["p"] == 24  # every prompt prefilled on the prefill instance
    assert after["d0"] == before["d0"] and after["d1"] == before["d1"]  # decodes pulled the KV
    placed = decisions(gw)[-12:]
    assert {d[2] for d in placed if d[0] == "prefill"} == {0}
    assert {d[2] for d in placed if d[0] == "decode"} == {1, 2}  # concurrent requests spread out
    assert wait_until(lambda: idle(gw))


@pytest.mark.parametrize("kind", ["completions", "chat"])
def test_streaming_equals_non_streaming(cluster, kind):
    gw = cluster["pd"]
    if kind == "chat":
        url, body, plen = gw.url + "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi there"}]}, 7
    else:
        url, body, plen = gw.url + "/v1/completions", {"prompt": PROMPT}, 4
    body = {**body, "max_tokens": 12, "ignore_eos": True}
    status, full = post(url, body)
    assert status == 200
    s = Stream(url, {**body, "stream": True, "stream_options": {"include_usage": True}})
    assert s.status == 200
    events = list(s.events())
    s.close()
    assert chunk_texts(events) == expected(plen, 12)
    text = full["choices"][0]["text"] if kind == "completions" else full["choices"][0]["message"]["content"]
    assert text == expected(plen, 12)
    assert [e["choices"][0]["finish_reason"] for e in events if e["choices"]][-1] == "length"
    assert events[-1]["usage"]["completion_tokens"] == 12 and events[-1]["choices"] == []
    assert wait_until(lambda: idle(gw))


def test_early_binding_binds_decode_at_arrival(cluster):
    gw = cluster["ils"]
    for _ in range(3):
        assert complete(gw, 6)[1]["choices"][0]["text"] == expected(4, 6)
    log = decisions(gw)
    for rid in {d[1] for d in log}:
        mine = [d for d in log if d[1] == rid]
        assert [d[0] for d in mine] == ["prefill", "decode"]  # bound in the arrival plan, never re-chosen
        assert mine[1][2] in (1, 2)


def test_colocated_mode_serves_each_request_on_one_instance(cluster):
    gw = cluster["colocated"]
    before = {k: metric(cluster[k].url, "vllm:prompt_tokens_total") for k in ("p", "d0", "d1")}
    for _ in range(3):
        status, body = complete(gw, 5)
        assert status == 200 and body["choices"][0]["text"] == expected(4, 5)
    after = {k: metric(cluster[k].url, "vllm:prompt_tokens_total") for k in ("p", "d0", "d1")}
    assert sum(after.values()) - sum(before.values()) == 12  # one full prefill per request, no handoff
    status, body = get(gw.url + "/admin/instances", headers=AUTH)
    assert status == 403  # this gateway has no admin token: the admin API is off


def test_migration_mid_stream_keeps_the_token_sequence(cluster):
    gw = cluster["pd"]
    s = Stream(gw.url + "/v1/completions", {"prompt": PROMPT, "max_tokens": 300, "ignore_eos": True, "stream": True,
                                            "stream_options": {"include_usage": True}})
    events, it = [], s.events()
    for _ in range(10):
        events.append(next(it))
    (req,) = get(gw.url + "/admin/requests", headers=AUTH)[1]["requests"]
    source = req["decode_instance"]
    target = "d1" if source == 1 else "d0"
    ok_before = metric(gw.url, 'baton_migrations_total{result="ok"}')
    status, _ = post(gw.url + f"/admin/requests/{req['req_id']}/migrate", {"target": target}, headers=AUTH)
    assert status == 202
    events += list(it)
    s.close()
    assert chunk_texts(events) == expected(4, 300)  # nothing duplicated, nothing missing
    # relayed verbatim before the move, rebuilt after it: one response id, one finish, and
    # usage for the whole answer (the continuation's own prompt holds 4 + the moved tokens)
    assert len({e["id"] for e in events}) == 1
    assert [c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]] == ["length"]
    assert events[-1]["choices"] == [] and events[-1]["usage"]["prompt_tokens"] == 4
    assert events[-1]["usage"]["completion_tokens"] == 300
    assert metric(gw.url, 'baton_migrations_total{result="ok"}') == ok_before + 1
    assert wait_until(lambda: idle(gw))


def test_client_abort_stops_upstream_work(cluster):
    gw = cluster["pd"]
    s = Stream(gw.url + "/v1/completions", {"prompt": PROMPT, "max_tokens": 2000, "ignore_eos": True, "stream": True})
    it = s.events()
    for _ in range(5):
        next(it)
    s.close()
    assert wait_until(lambda: idle(gw))
    for k in ("p", "d0", "d1"):
        assert wait_until(lambda: metric(cluster[k].url, "vllm:num_requests_running") == 0)
        assert wait_until(lambda: metric(cluster[k].url, "vllm:kv_cache_usage_perc") == 0)


def test_bad_input_gets_openai_errors(cluster):
    gw = cluster["pd"]
    status, body = request("POST", gw.url + "/v1/completions", raw=b'{"prompt": "x", ')
    assert status == 400 and "not valid JSON" in body["error"]["message"]
    status, body = request("POST", gw.url + "/v1/completions", raw=b'{"prompt": "' + b"x" * 70000 + b'"}')
    assert status == 413 and "exceeds 65536 bytes" in body["error"]["message"]
    status, body = post(gw.url + "/v1/completions", {"max_tokens": 3})
    assert status == 400 and body["error"]["param"] == "prompt"
    status, body = post(gw.url + "/v1/completions", {"prompt": "x", "max_tokens": -1})
    assert status == 400 and body["error"]["param"] == "max_tokens"
    status, body = post(gw.url + "/v1/completions", {"prompt": "x", "model": "nope"})
    assert status == 404 and body["error"]["code"] == "model_not_found"
    assert wait_until(lambda: idle(gw))


def test_admin_requires_the_bearer_token(cluster):
    gw = cluster["pd"]
    assert get(gw.url + "/admin/instances")[0] == 401
    assert get(gw.url + "/admin/instances", headers={"Authorization": "Bearer wrong"})[0] == 401
    status, body = get(gw.url + "/admin/instances", headers=AUTH)
    assert status == 200 and [i["name"] for i in body["instances"]] == ["p0", "d0", "d1"]
    assert all(i["scraped"] is not None and i["scraped"]["kv_usage"] is not None for i in body["instances"])
    assert get(gw.url + "/admin/policy", headers=AUTH)[1]["scheduler"] == "least-loaded"
    assert request("PATCH", gw.url + "/admin/instances/d1", {"role": "mixed"})[0] == 401


def test_admin_changes_roles_and_membership(cluster):
    gw = cluster["ils"]
    status, body = request("PATCH", gw.url + "/admin/instances/d1", {"role": "banana"}, headers=AUTH)
    assert status == 400 and body["error"]["param"] == "role"
    status, body = request("PATCH", gw.url + "/admin/instances/d1", {"role": "prefill"}, headers=AUTH)
    assert status == 200 and body["role"] == "prefill"
    for _ in range(4):
        complete(gw, 3)
    assert {d[2] for d in decisions(gw)[-8:] if d[0] == "decode"} == {1}  # d1 no longer decodes
    request("PATCH", gw.url + "/admin/instances/d1", {"role": "decode"}, headers=AUTH)
    assert metric(gw.url, "baton_role_flips_total") == 2
    status, body = post(gw.url + "/admin/instances", {"name": "d0", "url": cluster["d0"].url, "role": "decode"},
                        headers=AUTH)
    assert status == 409
    status, body = post(gw.url + "/admin/instances", {"url": "ftp://x", "role": "decode"}, headers=AUTH)
    assert status == 400 and "instance.url" in body["error"]["message"]
    status, body = post(gw.url + "/admin/instances", {"name": "d0b", "url": cluster["d0"].url, "role": "decode"},
                        headers=AUTH)
    assert status == 201 and body["healthy"] and body["scraped"] is not None
    assert request("DELETE", gw.url + "/admin/instances/d0b", headers=AUTH)[0] == 200
    assert [i["name"] for i in get(gw.url + "/admin/instances", headers=AUTH)[1]["instances"]] == ["p0", "d0", "d1"]


def test_overload_gets_429_and_nothing_is_lost(cluster):
    gw = cluster["small"]
    results = []

    def one():
        results.append(complete(gw, 150))
    threads = [threading.Thread(target=one) for _ in range(5)]
    [t.start() for t in threads]
    [t.join(30) for t in threads]
    codes = sorted(s for s, _ in results)
    assert len(codes) == 5 and codes.count(200) >= 2 and 429 in codes
    for status, body in results:
        if status == 429:
            assert body["error"]["type"] == "rate_limit_exceeded"
        else:
            assert body["choices"][0]["text"] == expected(4, 150)
    assert wait_until(lambda: idle(gw))


def test_gateway_metrics_per_decision_path(cluster):
    gw = cluster["pd"]
    complete(gw, 4)
    _, text = get(gw.url + "/metrics")
    assert 'baton_ttft_seconds_count{path="pd"}' in text
    assert metric(gw.url, 'baton_requests_total{outcome="ok",path="pd"}') >= 1
    assert metric(gw.url, 'baton_tbt_seconds_count{path="pd"}') >= 3


def test_engine_killed_mid_stream_is_continued_elsewhere(tmp_path):
    p, d0, d1 = (start_emulator(tmp_path, "--time-scale", "2") for _ in range(3))
    gw = start_gateway(tmp_path, {"engines": engines(p, d0, d1), "admin_token": TOKEN, "policy": "least-loaded"})
    with servers(p, d0, d1, gw):
        s = Stream(gw.url + "/v1/completions", {"prompt": PROMPT, "max_tokens": 200, "ignore_eos": True,
                                                "stream": True})
        events, it = [], s.events()
        for _ in range(10):
            events.append(next(it))
        (req,) = get(gw.url + "/admin/requests", headers=AUTH)[1]["requests"]
        victim, survivor = (d0, d1) if req["decode_instance"] == 1 else (d1, d0)
        victim.kill()
        events += list(it)
        s.close()
        assert chunk_texts(events) == expected(4, 200)
        assert metric(gw.url, "baton_recoveries_total") == 1
        def victim_healthy() -> bool:
            insts = {i["name"]: i for i in get(gw.url + "/admin/instances", headers=AUTH)[1]["instances"]}
            return insts["d0" if victim is d0 else "d1"]["healthy"]
        # marked down after unhealthy_after_failures faults in a row (the failed leg, then scrapes)
        assert wait_until(lambda: not victim_healthy(), 10)
        assert wait_until(lambda: idle(gw))
        # with the only other decode instance gone too, a request fails cleanly
        survivor.kill()
        status, body = complete(gw, 5)
        assert status in (502, 503) and body["error"]["message"]
        assert wait_until(lambda: idle(gw))


def test_sglang_bootstrap_adapter(tmp_path):
    p = start_emulator(tmp_path, "--disaggregation-mode", "prefill")
    d = start_emulator(tmp_path, "--disaggregation-mode", "decode")
    cfg = {"engines": [{"name": "p0", "url": p.url, "role": "prefill", "bootstrap_port": p.port},
                       {"name": "d0", "url": d.url, "role": "decode"}],
           "pd_protocol": "sglang", "admin_token": TOKEN}
    gw = start_gateway(tmp_path, cfg)
    with servers(p, d, gw):
        for stream in (False, True):
            body = {"prompt": PROMPT, "max_tokens": 9, "ignore_eos": True, "stream": stream}
            if stream:
                s = Stream(gw.url + "/v1/completions", body)
                text = chunk_texts(list(s.events()))
                s.close()
            else:
                status, out = post(gw.url + "/v1/completions", body)
                text = out["choices"][0]["text"]
            assert text == expected(4, 9)
        assert metric(p.url, "vllm:prompt_tokens_total") == 8
        assert metric(d.url, "vllm:prompt_tokens_total") == 0  # the decode side pulled the KV by room
        assert wait_until(lambda: idle(gw))


def test_client_transport_fields_never_steer_an_engine(cluster):
    """A client's kv_transfer_params / bootstrap_* must not make an engine connect where
    the client says: on a colocated gateway (where nothing replaces them) the emulator
    would pull KV from this listening socket if the field got through."""
    import socket
    lure = socket.socket()
    lure.bind(("127.0.0.1", 0))
    lure.listen(4)
    lure.settimeout(0.5)
    port = lure.getsockname()[1]
    params = {"do_remote_prefill": True, "remote_host": "127.0.0.1", "remote_port": port,
              "remote_engine_id": "x", "remote_block_ids": [1, 2]}
    try:
        for name in ("colocated", "pd"):
            gw = cluster[name]
            before = metric(gw.url, "baton_dropped_fields_total")
            status, body = complete(gw, 4, kv_transfer_params=params, bootstrap_host="127.0.0.1",
                                    bootstrap_port=port, bootstrap_room=1)
            assert status == 200 and body["choices"][0]["text"] == expected(4, 4), body
            assert metric(gw.url, "baton_dropped_fields_total") == before + 4
            with pytest.raises(OSError):
                lure.accept()  # nobody came
        assert wait_until(lambda: idle(cluster["pd"]))
    finally:
        lure.close()


@pytest.mark.parametrize("bad", [
    {"prompt": "a \ud800 b"},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": None}]}]},
    {"messages": [{"role": "user", "content": 7}]},
])
def test_client_input_that_crashes_engines_is_refused_and_costs_nobody_else(cluster, bad):
    """Inputs that make vLLM answer 500 are a 400 at the gateway and at the emulator, and
    the engines stay healthy for everyone else."""
    kind = "chat/completions" if "messages" in bad else "completions"
    for url in (cluster["pd"].url, cluster["d0"].url):
        status, body = post(f"{url}/v1/{kind}", {**bad, "max_tokens": 2})
        assert status == 400 and isinstance(body, dict) and body["error"]["type"], body
    assert get(cluster["pd"].url + "/health")[0] == 200
    status, body = complete(cluster["pd"], 3)
    assert status == 200 and body["choices"][0]["text"] == expected(4, 3)


def test_client_request_id_is_echoed_but_never_shared_with_engines(cluster):
    """Twenty concurrent requests with one X-Request-Id all complete, the prefill engine's
    KV goes back to zero (a shared id used to leak the blocks held for the handoff), and
    each response carries the client's id back."""
    gw, results = cluster["pd"], []

    def one():
        from tests.live import _conn
        conn, path = _conn(gw.url + "/v1/completions", 30.0)
        conn.request("POST", path, body=b'{"prompt": "a b c d", "max_tokens": 3, "ignore_eos": true}',
                     headers={"Content-Type": "application/json", "X-Request-Id": "same"})
        resp = conn.getresponse()
        results.append((resp.status, resp.getheader("X-Request-Id"), resp.read()))
        conn.close()

    threads = [threading.Thread(target=one) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(results) == 20 and all(s == 200 and h == "same" for s, h, _ in results)
    assert wait_until(lambda: metric(cluster["p"].url, "vllm:kv_cache_usage_perc") == 0, 10)
    assert wait_until(lambda: idle(gw))


def test_the_engines_model_names_are_served_and_an_alias_is_rewritten(tmp_path):
    """Engines with no model in the config: the gateway learns their name from /v1/models,
    serves it and the alias, and sends each engine its own name (the emulator, like vLLM,
    answers 404 to any other)."""
    emu = start_emulator(tmp_path, "--model", "org/real-name")
    gw = start_gateway(tmp_path, {"engines": [{"name": "m", "url": emu.url, "role": "mixed"}],
                                  "policy": "colocated", "model": "my-alias", "scrape_interval_s": 0.1})
    with servers(emu, gw):
        served = lambda: [m["id"] for m in get(gw.url + "/v1/models")[1]["data"]]  # noqa: E731
        assert wait_until(lambda: served() == ["my-alias", "org/real-name"])
        for name in ("org/real-name", "my-alias", None):
            body = {"prompt": PROMPT, "max_tokens": 3, **({"model": name} if name else {})}
            status, out = post(gw.url + "/v1/completions", body)
            assert status == 200, out
            assert out["choices"][0]["text"] == expected(4, 3) and out["model"] == (name or "my-alias")
        status, out = post(emu.url + "/v1/completions", {"prompt": PROMPT, "model": "my-alias"})
        assert status == 404 and out["error"]["code"] == "model_not_found"
        status, out = post(gw.url + "/v1/completions", {"prompt": PROMPT, "model": "other"})
        assert status == 404 and out["error"]["code"] == "model_not_found"


@pytest.mark.parametrize("gw_name", ["pd", "colocated"])
def test_token_ids_are_returned_to_clients_that_ask(cluster, gw_name):
    """prompt and output ids as the engine reports them (what a client needs to rebuild the
    exact model input, e.g. to train a length predictor on hidden states)."""
    status, direct = post(cluster["d0"].url + "/v1/completions",
                          {"prompt": PROMPT, "max_tokens": 6, "return_token_ids": True})
    assert status == 200
    assert len(direct["choices"][0]["prompt_token_ids"]) == 4
    status, body = complete(cluster[gw_name], 6, return_token_ids=True)
    assert status == 200, body
    choice = body["choices"][0]
    assert choice["token_ids"] == direct["choices"][0]["token_ids"]
    assert choice["prompt_token_ids"] == direct["choices"][0]["prompt_token_ids"]


def test_streamed_token_ids_include_the_prompt_ids_in_the_first_chunk(cluster):
    body = {"prompt": PROMPT, "max_tokens": 5, "stream": True, "return_token_ids": True, "ignore_eos": True}
    direct = list(Stream(cluster["d0"].url + "/v1/completions", body).events())
    relayed = list(Stream(cluster["pd"].url + "/v1/completions", body).events())
    first = [e["choices"][0] for e in relayed if e.get("choices")][0]
    assert first["prompt_token_ids"] == [e["choices"][0] for e in direct if e.get("choices")][0]["prompt_token_ids"]
    ids = [t for e in relayed if e.get("choices") for t in e["choices"][0].get("token_ids") or []]
    assert ids == [t for e in direct if e.get("choices") for t in e["choices"][0].get("token_ids") or []]


def _without(event: bytes, *keys: str) -> dict:
    out = json.loads(event)
    for k in keys:
        out.pop(k, None)
    return out


@pytest.mark.parametrize("kind", ["completions", "chat"])
def test_a_stream_in_the_clients_format_is_relayed_as_the_engine_wrote_it(cluster, kind):
    """Same endpoint, same model name, the client asks for what the leg asks (token ids
    and usage): every event is the engine's bytes; only id and created differ from a
    direct request (they are the leg's own), and they are the same on every chunk."""
    path = "/v1/completions" if kind == "completions" else "/v1/chat/completions"
    prompt = {"prompt": PROMPT} if kind == "completions" else {"messages": [{"role": "user", "content": "hi"}]}
    body = {**prompt, "max_tokens": 6, "ignore_eos": True, "stream": True, "return_token_ids": True,
            "stream_options": {"include_usage": True}}
    direct = list(Stream(cluster["d0"].url + path, body).raw_events())
    relayed = list(Stream(cluster["colocated"].url + path, body).raw_events())
    assert len(relayed) == len(direct) and relayed[-1] == direct[-1] == b"[DONE]"
    assert [_without(e, "id", "created") for e in relayed[:-1]] == [_without(e, "id", "created") for e in direct[:-1]]
    assert len({json.loads(e)["id"] for e in relayed[:-1]}) == 1
    engine_format = [json.loads(e) for e in direct[:-1]]
    for raw, ref in zip(relayed[:-1], engine_format):  # byte for byte once id and created are the same
        assert raw == orjson.dumps({**ref, "id": json.loads(raw)["id"], "created": json.loads(raw)["created"]})


def test_token_ids_the_client_did_not_ask_for_are_nulled_not_reencoded(cluster):
    body = {"prompt": PROMPT, "max_tokens": 5, "ignore_eos": True, "stream": True}
    relayed = [json.loads(e) for e in Stream(cluster["colocated"].url + "/v1/completions", body).raw_events()
               if e != b"[DONE]"]
    choices = [e["choices"][0] for e in relayed]
    tokens = [c for c in choices if c["text"]]
    assert len(tokens) == 5 and all("token_ids" in c and c["token_ids"] is None for c in tokens)  # leg asked
    assert "prompt_token_ids" in choices[0] and choices[0]["prompt_token_ids"] is None
    assert all(e.get("usage") is None for e in relayed)
    assert chunk_texts(relayed) == expected(4, 5) and choices[-1]["finish_reason"] == "length"
    rebuilt = list(Stream(cluster["rebuild"].url + "/v1/completions", body).events())
    assert chunk_texts(rebuilt) == expected(4, 5)
    assert all("token_ids" not in e["choices"][0] for e in rebuilt)  # the gateway's own chunks
    assert rebuilt[0]["id"].startswith("cmpl-") and relayed[0]["id"].startswith("cmpl-baton-")  # the engine's


def test_a_client_naming_an_alias_gets_rebuilt_chunks_with_its_name(tmp_path):
    emu = start_emulator(tmp_path, "--model", "org/real-name")
    gw = start_gateway(tmp_path, {"engines": [{"name": "m", "url": emu.url, "role": "mixed", "model": "org/real-name"}],
                                  "policy": "colocated", "model": "my-alias"})
    with servers(emu, gw):
        for name in ("my-alias", "org/real-name"):
            body = {"model": name, "prompt": PROMPT, "max_tokens": 4, "stream": True, "ignore_eos": True}
            events = list(Stream(gw.url + "/v1/completions", body).events())
            assert {e["model"] for e in events} == {name} and chunk_texts(events) == expected(4, 4)
            assert ("token_ids" in events[0]["choices"][0]) == (name == "org/real-name")  # verbatim: nulled


def test_a_migrated_chat_without_a_budget_ends_where_an_unmoved_one_does(tmp_path):
    """Chat without max_tokens runs to the end of the context (vLLM's default, and the
    emulator's); its continuation gets the rest of the target's context, from /v1/models."""
    a, b = (start_emulator(tmp_path, "--max-model-len", "160", "--time-scale", "3") for _ in range(2))
    gw = start_gateway(tmp_path, {"engines": [{"name": "a", "url": a.url, "role": "mixed"},
                                              {"name": "b", "url": b.url, "role": "mixed"}],
                                  "policy": "colocated", "admin_token": TOKEN, "scrape_interval_s": 0.1})
    with servers(a, b, gw):
        body = {"messages": [{"role": "user", "content": "hi there"}], "stream": True,
                "stream_options": {"include_usage": True}}
        assert wait_until(lambda: len(get(gw.url + "/v1/models")[1]["data"]) == 1)
        direct = list(Stream(a.url + "/v1/chat/completions", body).events())
        s = Stream(gw.url + "/v1/chat/completions", body)
        events, it = [], s.events()
        for _ in range(6):
            events.append(next(it))
        (req,) = get(gw.url + "/admin/requests", headers=AUTH)[1]["requests"]
        target = "b" if req["decode_instance"] == 0 else "a"
        assert post(gw.url + f"/admin/requests/{req['req_id']}/migrate", {"target": target}, headers=AUTH)[0] == 202
        events += list(it)
        s.close()
        assert direct[-1]["usage"]["completion_tokens"] == 160 - direct[-1]["usage"]["prompt_tokens"]
        assert chunk_texts(events) == chunk_texts(direct)
        assert events[-1]["usage"] == direct[-1]["usage"]


@pytest.mark.parametrize("stream", [False, True])
def test_stop_strings_end_generation_as_vllm_does(cluster, stream):
    """The emulator applies ``stop`` as vLLM does (text cut before the string, finish
    reason stop, stop_reason naming it), directly and through the PD gateway."""
    full = expected(4, 60)
    at = full.find("for it")
    n = next(k for k in range(1, 61) if "for it" in expected(4, k))
    for url in (cluster["p"].url, cluster["pd"].url):
        body = {"prompt": PROMPT, "max_tokens": 60, "stop": ["zzz", "for it"], "ignore_eos": True}
        if stream:
            s = Stream(url + "/v1/completions", {**body, "stream": True, "stream_options": {"include_usage": True}})
            events = list(s.events())
            s.close()
            text, usage = chunk_texts(events), events[-1]["usage"]
            reason = [e["choices"][0]["finish_reason"] for e in events if e["choices"]][-1]
        else:
            status, out = post(url + "/v1/completions", body)
            assert status == 200, out
            text, usage, reason = out["choices"][0]["text"], out["usage"], out["choices"][0]["finish_reason"]
            if url == cluster["p"].url:
                assert out["choices"][0]["stop_reason"] == "for it"
        assert (text, reason, usage["completion_tokens"]) == (full[:at], "stop", n), url
    status, out = post(cluster["p"].url + "/v1/completions", {"prompt": PROMPT, "max_tokens": 60, "stop": "for it",
                                                              "include_stop_str_in_output": True})
    assert out["choices"][0]["text"] == full[:at + len("for it")]
    status, out = post(cluster["p"].url + "/v1/completions", {"prompt": PROMPT, "stop": [3]})
    assert status == 400 and out["error"]["param"] == "stop"
