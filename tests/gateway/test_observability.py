"""What an operator sees: the gateway's log lines and per-engine gauges, and the
emulator's vLLM latency histograms (real processes on 127.0.0.1)."""

from __future__ import annotations

import pytest

from tests.live import Stream, metric, post, request, servers, start_emulator, start_gateway, wait_until

AUTH = {"Authorization": "Bearer admin-token-for-tests"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("obs")
    e0, e1 = start_emulator(tmp), start_emulator(tmp)
    gw = start_gateway(tmp, {"engines": [{"name": "e0", "url": e0.url, "role": "mixed"},
                                         {"name": "e1", "url": e1.url, "role": "mixed"}],
                             "policy": "colocated", "admin_token": "admin-token-for-tests", "scrape_interval_s": 0.1,
                             "scrape_timeout_s": 1.0, "unhealthy_after_failures": 2,
                             "log_level": "DEBUG", "access_log": True})
    with servers(e0, e1, gw):
        yield {"e0": e0, "e1": e1, "gw": gw}


def log_has(server, text: str, times: int = 1) -> bool:
    return server.log.read_text().count(text) >= times


def test_requests_are_logged_at_debug_and_in_the_access_log(stack):
    gw = stack["gw"]
    assert log_has(gw, "baton serve: ") and log_has(gw, "with policy 'colocated', 2 engines (e0=mixed, e1=mixed)")
    status, _ = post(gw.url + "/v1/completions", {"prompt": "a b", "max_tokens": 3})
    assert status == 200
    assert wait_until(lambda: log_has(gw, "baton.access") and log_has(gw, '"POST /v1/completions HTTP/1.1" 200'))
    assert wait_until(lambda: log_has(gw, ": ok via colocated, 3 tokens"))


def test_per_engine_gauges(stack):
    gw = stack["gw"]
    for name in ("e0", "e1"):
        assert metric(gw.url, f'baton_engine_healthy{{engine="{name}",role="mixed"}}') == 1
        assert 0 <= metric(gw.url, f'baton_engine_scrape_age_seconds{{engine="{name}",role="mixed"}}') < 2
        assert metric(gw.url, f'baton_engine_inflight_requests{{engine="{name}",role="mixed"}}') == 0
    s = Stream(gw.url + "/v1/completions", {"prompt": "a b", "max_tokens": 400, "stream": True})
    next(s.events())  # a token arrived: the request is on an engine
    busy = [n for n in ("e0", "e1") if metric(gw.url, f'baton_engine_inflight_requests{{engine="{n}",role="mixed"}}') == 1]
    s.close()
    assert len(busy) == 1
    assert metric(gw.url, f'baton_engine_ttft_seconds_count{{engine="{busy[0]}"}}') >= 1


def test_health_changes_and_role_changes_are_logged(stack):
    gw, e1 = stack["gw"], stack["e1"]
    down, up = "engine e1 is unhealthy after 2 failures", "engine e1 is healthy again"
    n_down, n_up = (gw.log.read_text().count(t) for t in (down, up))
    e1.pause()
    try:
        assert wait_until(lambda: log_has(gw, down, n_down + 1), timeout_s=15)
        assert metric(gw.url, 'baton_engine_healthy{engine="e1",role="mixed"}') == 0
    finally:
        e1.resume()
    assert wait_until(lambda: log_has(gw, up, n_up + 1), timeout_s=15)
    status, _ = request("PATCH", gw.url + "/admin/instances/e1", {"role": "decode"}, headers=AUTH)
    assert status == 200 and wait_until(lambda: log_has(gw, "instance e1: role mixed -> decode (by admin)"))
    request("PATCH", gw.url + "/admin/instances/e1", {"role": "mixed"}, headers=AUTH)


def test_emulator_exports_vllm_latency_histograms(stack):
    e0 = stack["e0"]
    names = ("time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds",
             "request_prefill_time_seconds", "request_decode_time_seconds", "request_queue_time_seconds")
    before = {n: metric(e0.url, f'vllm:{n}_count{{engine="0",model_name="baton-emulated"}}') for n in names}
    status, _ = post(e0.url + "/v1/completions", {"prompt": "a b c", "max_tokens": 5, "ignore_eos": True})
    assert status == 200
    after = {n: metric(e0.url, f'vllm:{n}_count{{engine="0",model_name="baton-emulated"}}') for n in names}
    delta = {n: after[n] - before[n] for n in names}
    assert delta == {n: (4 if n.startswith("inter_token") else 1) for n in names}
    ttft = metric(e0.url, 'vllm:time_to_first_token_seconds_sum{engine="0",model_name="baton-emulated"}')
    e2e = metric(e0.url, 'vllm:e2e_request_latency_seconds_sum{engine="0",model_name="baton-emulated"}')
    assert 0 < ttft < e2e


def test_per_placement_figures_stay_out_of_metrics():
    """A running mean of matched prefix blocks, read after each of one's own requests, told
    whether another tenant's prefix was cached (round 3, finding 6): /metrics leaves it out."""
    from baton.gateway.metrics import GatewayMetrics

    class Reporting:
        def report(self):
            return {"prefix-precise_matched_blocks_mean": 3.0, "cache_aware_followed": 2.0}
    metrics = GatewayMetrics()
    metrics.watch_policy(Reporting())
    text = metrics.render().decode()
    assert 'baton_policy_report{key="cache_aware_followed"} 2.0' in text and "matched_blocks_mean" not in text


def test_a_flood_of_scrapes_renders_at_most_twenty_times_a_second(monkeypatch):
    """Every render walks every series: beyond FRESH_RENDERS_PER_S scrapes a second the
    last text is served again; below it every scrape is fresh."""
    import asyncio

    from baton.gateway import server
    from baton.gateway.config import parse_config
    gw = server.Gateway(parse_config({"engines": [{"url": "http://127.0.0.1:9", "role": "mixed", "name": "e0"}]}))
    renders = []
    real = gw.metrics.render
    monkeypatch.setattr(gw.metrics, "render", lambda extra=None: renders.append(1) or real(extra))

    async def scrape(n):
        return [await gw._render() for _ in range(n)]
    texts = asyncio.run(scrape(200))
    assert len(renders) == server.FRESH_RENDERS_PER_S and all(t == texts[-1] for t in texts[server.FRESH_RENDERS_PER_S:])
    assert b"baton_" in texts[0]
    gw._renders.clear()  # a second later: fresh again
    asyncio.run(scrape(1))
    assert len(renders) == server.FRESH_RENDERS_PER_S + 1
