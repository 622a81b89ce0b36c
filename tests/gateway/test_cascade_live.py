"""CascadeInfer through the gateway on 4 emulators (real processes on 127.0.0.1): a stream
that crosses its stage's bound mid-stream moves to the next stage by continuation, token
for token, and the accounting returns to zero."""

from __future__ import annotations

from baton.emulator.tokens import token_text
from tests.live import Stream, get, metric, servers, start_emulator, start_gateway, wait_until

AUTH = {"Authorization": "Bearer admin-token-for-tests"}
CHAIN = {"name": "cascade", "stages": [{"stage": "cascade", "layout": "chain", "first_cut": 64, "refine": "off"}]}


def test_a_stream_crosses_stages_token_exactly(tmp_path):
    emus = [start_emulator(tmp_path, "--time-scale", "3") for _ in range(4)]
    engines = [{"name": f"m{i}", "url": e.url, "role": "mixed"} for i, e in enumerate(emus)]
    gw = start_gateway(tmp_path, {"engines": engines, "policy": CHAIN, "admin_token": "admin-token-for-tests", "scrape_interval_s": 0.2})
    with servers(*emus, gw):
        # stages: [0, 64) on m0, [64, 128) on m1, [128, 256) on m2, the rest on m3
        s = Stream(gw.url + "/v1/completions", {"prompt": "a b c d", "max_tokens": 150, "ignore_eos": True,
                                                "stream": True}, timeout=120)
        text = "".join(e["choices"][0]["text"] for e in s.events() if e.get("choices"))
        s.close()
        assert text == "".join(token_text(4 + i) for i in range(150))  # every token once, in order
        assert metric(gw.url, 'baton_migrations_total{result="ok"}') == 2  # crossed 64 and 128
        served = [metric(e.url, "vllm:generation_tokens_total") for e in emus]
        assert served[0] > 0 and served[1] > 0 and served[2] > 0 and served[3] == 0
        assert wait_until(lambda: all(v == 0 for v in get(gw.url + "/admin/instances", headers=AUTH)[1]
                                      ["in_flight"].values()))
