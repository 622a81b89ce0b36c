"""prefix-precise on two real vLLM CPU instances serving colocated, with prefix caching and
KV events: the gateway indexes vLLM's own BlockStored events (keys from their token ids,
whatever vLLM's hash), so requests that share a prefix go to the instance that holds it,
and vLLM's own hit counters confirm it. Predict-on-route is off (``predict_ttl_s: 0``): the
siblings can follow the prefix only through the events, and the prefix sits on the instance
that load alone would not choose."""

from __future__ import annotations

import time

from tests.live import Stream, decision_log, get, metric, post, servers, start_gateway, wait_until
from tests_real.conftest import AUTH, NEEDS_VLLM
from tests_real.test_vllm_prefix import block_size, settled

pytestmark = NEEDS_VLLM
ROOM = {"scrape_interval_s": 0.5, "upstream_timeout_s": 300, "first_token_timeout_base_s": 120,
        "token_timeout_min_s": 60, "admin_token": "real-vllm-admin-token"}
HITS = "vllm:prefix_cache_hits_total"


def prefills(gw) -> list[int]:
    return [iid for kind, _, iid in decision_log(gw.url, "real") if kind == "prefill"]


def test_siblings_follow_the_prefix_vllm_reports_holding(stack, tmp_path):
    a, b = stack["prefill"], stack["decode"]
    bs = block_size(b.url)
    engines = [{"name": name, "url": e.url, "role": "mixed", "model": "smollm2",
                "kv_events": f"tcp://127.0.0.1:{e.kv_events_port}"} for name, e in (("a", a), ("b", b))]
    policy = {"name": "prefix-precise-events-only", "stages": [{"stage": "prefix-precise", "predict_ttl_s": 0}]}
    gw = start_gateway(tmp_path, {"engines": engines, "policy": policy, "block_size": bs, **ROOM})
    n = min(40, 1500 // bs)  # full blocks of a shared prefix that fits the 2,048-token context
    shared = list(range(9000, 9000 + n * bs))  # ids no other test sends
    with servers(gw):
        assert wait_until(lambda: all(get(gw.url + "/admin/kv", headers=AUTH)[1]["engines"][n]["connected"]
                                      for n in ("a", "b")), timeout_s=30)  # both subscriptions up
        # a long answer keeps "a" busy (the first request of all goes to the lowest id), so
        # the shared prompt goes to "b"; once "a" is free again, load alone would send the
        # siblings back to "a", and only vLLM's events about the prefix hold them on "b"
        busy = Stream(gw.url + "/v1/completions", {"model": "smollm2", "prompt": list(range(300, 320)),
                                                    "max_tokens": 200, "ignore_eos": True, "stream": True},
                      timeout=300)
        assert busy.status == 200
        status, body = post(gw.url + "/v1/completions", {"model": "smollm2", "prompt": shared + [11, 12, 13],
                                                         "max_tokens": 1, "temperature": 0.0}, timeout=300)
        assert status == 200, body
        first = prefills(gw)[-1]
        assert first == 1, prefills(gw)
        assert sum(1 for _ in busy.events()) > 0  # the long answer ends
        busy.close()
        assert wait_until(lambda: metric(a.url, "vllm:num_requests_running") == 0, timeout_s=60)
        time.sleep(1.5)  # three scrapes: both engines read idle again
        name, engine, other = "b", b, a
        assert wait_until(lambda: get(gw.url + "/admin/kv", headers=AUTH)[1]["engines"][name]["indexed_blocks"] >= n,
                          timeout_s=30), get(gw.url + "/admin/kv", headers=AUTH)[1]
        before = {e.url: settled(e.url, HITS) for e in (a, b)}
        for k in range(3):
            status, body = post(gw.url + "/v1/completions", {"model": "smollm2", "prompt": shared + [20 + k, 30 + k],
                                                             "max_tokens": 1, "temperature": 0.0}, timeout=300)
            assert status == 200, body
        placed = prefills(gw)[-3:]
        gained = {e.url: settled(e.url, HITS) - before[e.url] for e in (a, b)}
        print(f"\nvLLM block size {bs}; first on {name}; siblings on {placed}; hits gained {gained}")
        assert placed == [first] * 3
        assert gained[engine.url] >= 3 * n * bs and gained[other.url] == 0
        state = get(gw.url + "/admin/kv", headers=AUTH)[1]["engines"][name]
        assert state["gaps"] == 0 and state["orphans"] == 0 and state["batches"] > 0
    assert metric(engine.url, HITS) > 0
