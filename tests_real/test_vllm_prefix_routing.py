"""prefix-precise on two real vLLM CPU instances serving colocated, with prefix caching and
KV events: the gateway indexes vLLM's own BlockStored events (keys from their token ids,
whatever vLLM's hash), so requests that share a prefix go to the instance that holds it,
and vLLM's own hit counters confirm it. Predict-on-route is off (``predict_ttl_s: 0``): the
siblings can follow the prefix only through the events, and the prefix sits on the instance
that load alone would not choose."""

from __future__ import annotations

import time

from tests.live import Stream, decision_log, get, metric, post, servers, start_gateway, wait_until
from tests_real.conftest import AUTH, MODEL, NEEDS_VLLM
from tests_real.test_vllm_prefix import block_size, settled

pytestmark = NEEDS_VLLM
ROOM = {"scrape_interval_s": 0.5, "upstream_timeout_s": 300, "first_token_timeout_base_s": 120,
        "token_timeout_min_s": 60, "admin_token": "real-vllm-admin-token"}
HITS = "vllm:prefix_cache_hits_total"


def prefills(gw) -> list[int]:
    return [iid for kind, _, iid in decision_log(gw.url, "real-vllm-admin-token") if kind == "prefill"]


def _gateway(stack, tmp_path, **extra):
    a, b = stack["prefill"], stack["decode"]
    bs = block_size(b.url)
    engines = [{"name": name, "url": e.url, "role": "mixed", "model": "smollm2",
                "kv_events_listen": f"tcp://127.0.0.1:{e.kv_events_port}"} for name, e in (("a", a), ("b", b))]
    policy = {"name": "prefix-precise-events-only", "stages": [{"stage": "prefix-precise", "predict_ttl_s": 0}]}
    return start_gateway(tmp_path, {"engines": engines, "policy": policy, "block_size": bs, **ROOM, **extra}), bs


def _siblings_follow(stack, gw, path: str, first: dict, siblings: list[dict], n: int, bs: int) -> None:
    """``first`` lands on "b" while a long answer keeps "a" busy; once "a" is free again,
    load alone would send the ``siblings`` back to "a", and only vLLM's events about the
    prefix (``n`` full blocks) hold them on "b"; vLLM's own hit counters confirm it."""
    a, b = stack["prefill"], stack["decode"]
    assert wait_until(lambda: all(get(gw.url + "/admin/kv", headers=AUTH)[1]["engines"][n]["connected"]
                                  for n in ("a", "b")), timeout_s=30)  # both subscriptions up
    busy = Stream(gw.url + "/v1/completions", {"model": "smollm2", "prompt": list(range(300, 320)),
                                                "max_tokens": 200, "ignore_eos": True, "stream": True},
                  timeout=300)
    assert busy.status == 200
    status, body = post(gw.url + path, {"model": "smollm2", **first, "max_tokens": 1, "temperature": 0.0},
                        timeout=300)
    assert status == 200, body
    assert prefills(gw)[-1] == 1, prefills(gw)
    assert sum(1 for _ in busy.events()) > 0  # the long answer ends
    busy.close()
    assert wait_until(lambda: metric(a.url, "vllm:num_requests_running") == 0, timeout_s=60)
    time.sleep(1.5)  # three scrapes: both engines read idle again
    assert wait_until(lambda: get(gw.url + "/admin/kv", headers=AUTH)[1]["engines"]["b"]["indexed_blocks"] >= n,
                      timeout_s=30), get(gw.url + "/admin/kv", headers=AUTH)[1]
    before = {e.url: settled(e.url, HITS) for e in (a, b)}
    for sibling in siblings:
        status, body = post(gw.url + path, {"model": "smollm2", **sibling, "max_tokens": 1, "temperature": 0.0},
                            timeout=300)
        assert status == 200, body
    placed = prefills(gw)[-len(siblings):]
    gained = {e.url: settled(e.url, HITS) - before[e.url] for e in (a, b)}
    print(f"\n{path}: vLLM block size {bs}; first on b; siblings on {placed}; hits gained {gained}")
    assert placed == [1] * len(siblings)
    assert gained[b.url] >= len(siblings) * n * bs and gained[a.url] == 0
    state = get(gw.url + "/admin/kv", headers=AUTH)[1]["engines"]["b"]
    assert state["gaps"] == 0 and state["orphans"] == 0 and state["batches"] > 0


def test_siblings_follow_the_prefix_vllm_reports_holding(stack, tmp_path):
    gw, bs = _gateway(stack, tmp_path)
    n = min(40, 1500 // bs)  # full blocks of a shared prefix that fits the 2,048-token context
    shared = list(range(9000, 9000 + n * bs))  # ids no other test sends
    with servers(gw):
        _siblings_follow(stack, gw, "/v1/completions", {"prompt": shared + [11, 12, 13]},
                         [{"prompt": shared + [20 + k, 30 + k]} for k in range(3)], n, bs)


def test_chat_siblings_follow_their_shared_system_prompt(stack, tmp_path):
    """First hour, item 3: chat requests keyed by the model's chat template rendered as vLLM
    renders it and tokenized as its chat endpoint does, so their block keys are the ones
    vLLM's KV events carry: chats sharing a long system prompt follow it."""
    gw, bs = _gateway(stack, tmp_path, tokenizer=MODEL)
    system = " ".join(f"Rule {i}: answer with care about topic {i * 7 % 101}." for i in range(90))
    n = 320 // bs  # the system prompt is about 1,240 tokens: 320 of them surely in shared full blocks
    chat = [{"role": "system", "content": system}]
    with servers(gw):
        _siblings_follow(stack, gw, "/v1/chat/completions", {"messages": chat + [{"role": "user", "content": "Hi."}]},
                         [{"messages": chat + [{"role": "user", "content": f"Question {k}?"}]} for k in range(3)],
                         n, bs)
