"""Kairos through the gateway on 1P2D emulators (real processes on 127.0.0.1): a burst of
long prompts queues on the prefill instance, some are deflected to decode instances as
one colocated leg each (the decode engines' own 512-token budget is the chunk), and the
decodes already streaming there keep their TBT SLO. Nothing is lost and the accounting
returns to zero."""

from __future__ import annotations

import threading
import time

from tests.live import Stream, decision_log, get, metric, post, servers, start_emulator, start_gateway, wait_until

AUTH = {"Authorization": "Bearer admin-token-for-tests"}
TBT_SLO_S = 0.15
KAIROS = {"name": "kairos", "stages": [{"stage": "kairos", "fixed_chunk": True, "max_chunk_tokens": 512,
                                        "proactive": False}]}


def stream_gaps(gw, out: list) -> None:
    """A long decode: the gaps between its tokens as the client saw them."""
    s = Stream(gw.url + "/v1/completions", {"prompt": "a b c", "max_tokens": 150, "ignore_eos": True,
                                            "stream": True}, timeout=120)
    last, gaps, tokens = None, [], 0
    for event in s.events():
        if event.get("choices") and event["choices"][0].get("text"):
            now = time.monotonic()
            if last is not None:
                gaps.append(now - last)
            last, tokens = now, tokens + 1
    s.close()
    out.append((tokens, gaps))


def burst(gw, n: int, spacing_s: float = 0.0, extra: list[threading.Thread] = ()) -> list:
    """``n`` concurrent 3,000-token prompts of 4 output tokens; waits for them and ``extra``."""
    results: list = []

    def one(k):
        body = {"prompt": [1000 + (7 * k + j) % 5000 for j in range(3000)], "max_tokens": 4, "ignore_eos": True}
        results.append(post(gw.url + "/v1/completions", body, timeout=120))
    threads = [threading.Thread(target=one, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
        time.sleep(spacing_s)
    for t in [*threads, *extra]:
        t.join(120)
    return results


def test_a_burst_is_deflected_to_decode_instances_within_the_tbt_slo(tmp_path):
    # time scale 2: a 3,000-token prompt takes about 0.5 s on the prefill instance; a decode
    # iteration with a 512-token chunk about 80 ms, inside the 150 ms TBT SLO
    p = start_emulator(tmp_path, "--time-scale", "2", "--kv-tokens", "200000")
    d0, d1 = (start_emulator(tmp_path, "--time-scale", "2", "--kv-tokens", "200000",
                             "--max-num-batched-tokens", "512") for _ in range(2))
    engines = [{"name": "p0", "url": p.url, "role": "prefill"}, {"name": "d0", "url": d0.url, "role": "decode"},
               {"name": "d1", "url": d1.url, "role": "decode"}]
    gw = start_gateway(tmp_path, {"engines": engines, "policy": KAIROS, "admin_token": "admin-token-for-tests", "scrape_interval_s": 0.1,
                                  "ttft_slo_s": 5.0, "tpot_slo_s": TBT_SLO_S})
    with servers(p, d0, d1, gw):
        streams: list = []
        long = [threading.Thread(target=stream_gaps, args=(gw, streams)) for _ in range(4)]
        for t in long:
            t.start()
        assert wait_until(lambda: metric(gw.url, "baton_inflight_requests") == 4, timeout_s=10)
        results = burst(gw, 10, extra=long)
        assert len(results) == 10 and all(status == 200 and body["usage"]["completion_tokens"] == 4
                                          for status, body in results), results
        assert len(streams) == 4 and all(tokens == 150 for tokens, _ in streams)
        deflected = metric(gw.url, "baton_deflections_total")
        assert 1 <= deflected < 10, deflected  # some, not all: the prefill path stays in use
        assert metric(gw.url, 'baton_requests_total{outcome="ok",path="deflected"}') == deflected
        gaps = sorted(g for _, gs in streams for g in gs)
        assert gaps[int(0.99 * len(gaps))] <= TBT_SLO_S * 1.2, gaps[-10:]  # client-side, relay jitter included
        assert wait_until(lambda: all(v == 0 for v in get(gw.url + "/admin/instances", headers=AUTH)[1]
                                      ["in_flight"].values()))


def test_a_held_prefill_is_replanned_when_the_decode_instance_frees_up(tmp_path):
    """1P1D, a burst of 16 prompts of 3,000 tokens (about 0.5 s each on either path at time
    scale 2). Both paths fill up: once the decode path's TTFT passes the 1.2 s SLO, arrivals
    go PD and queue on the prefill instance, where the gateway holds what the engine cannot
    start yet (it reports waiting requests). As the decode instance works through what it
    took, Kairos's tick re-plans held prefills onto it: they leave the PD queue as
    colocated legs, and every request completes."""
    p = start_emulator(tmp_path, "--time-scale", "2", "--kv-tokens", "300000")
    d = start_emulator(tmp_path, "--time-scale", "2", "--kv-tokens", "300000", "--max-num-batched-tokens", "512")
    policy = {"name": "kairos", "stages": [{"stage": "kairos", "fixed_chunk": True, "max_chunk_tokens": 512,
                                            "replan_interval_s": 0.05}]}
    gw = start_gateway(tmp_path, {"engines": [{"name": "p0", "url": p.url, "role": "prefill"},
                                              {"name": "d0", "url": d.url, "role": "decode"}],
                                  "policy": policy, "admin_token": "admin-token-for-tests", "scrape_interval_s": 0.05,
                                  "ttft_slo_s": 1.2, "tpot_slo_s": 0.1})
    with servers(p, d, gw):
        results = burst(gw, 16, spacing_s=0.01)
        assert len(results) == 16 and all(status == 200 and body["usage"]["completion_tokens"] == 4
                                          for status, body in results), results
        log = decision_log(gw.url)
        replanned = {rid for kind, rid, _ in log if kind == "deflect"}
        assert replanned, log  # re-planned after arrival ...
        assert all(("prefill", rid, 0) in log for rid in replanned)  # ... out of the PD queue
        assert metric(gw.url, 'baton_requests_total{outcome="ok",path="deflected"}') >= len(replanned)
        assert wait_until(lambda: all(v == 0 for v in get(gw.url + "/admin/instances", headers=AUTH)[1]
                                      ["in_flight"].values()))
