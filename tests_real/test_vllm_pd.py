"""Two real vLLM CPU instances (prefill and decode, ExampleConnector through a shared
folder) behind the gateway: greedy PD output equals a single instance's, streaming works,
and the gateway reads the engines' scraped metrics."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.live import (Server, Stream, chunk_texts, free_port, get, metric, post, request, start_gateway,
                        wait_until)

PY = os.environ.get("BATON_VLLM_PYTHON")
MODEL = os.environ.get("BATON_VLLM_MODEL")
pytestmark = pytest.mark.skipif(not (PY and MODEL), reason="BATON_VLLM_PYTHON and BATON_VLLM_MODEL not set")
START_TIMEOUT_S = 600
AUTH = {"Authorization": "Bearer real"}
PROMPTS = ["The capital of France is", "Write one sentence about the sea:"]
# never send `seed`: with chunked prompts it crashes the CPU server
GREEDY = {"max_tokens": 24, "temperature": 0.0}


class VLLM(Server):
    def __init__(self, port: int, kv_dir: Path, log: Path) -> None:  # noqa: D107
        self.port, self.log = port, log
        self._logf = open(log, "wb")
        config = ('{"kv_connector":"ExampleConnector","kv_role":"kv_both",'
                  f'"kv_connector_extra_config":{{"shared_storage_path":"{kv_dir}"}}}}')
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen(
            [PY, "-m", "vllm.entrypoints.openai.api_server", "--model", MODEL, "--served-model-name", "smollm2",
             "--max-model-len", "2048", "--dtype", "bfloat16", "--host", "127.0.0.1", "--port", str(port),
             "--enforce-eager", "--kv-transfer-config", config], stdout=self._logf, stderr=subprocess.STDOUT, env=env,
            start_new_session=True)

    def wait_started(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited: {self.log.read_text()[-3000:]}")
            try:
                if get(self.url + "/health", timeout=2)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(1)
        raise RuntimeError(f"vLLM not ready after {START_TIMEOUT_S}s: {self.log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vllm")
    t0 = time.monotonic()
    prefill, decode = (VLLM(free_port(), tmp / "kv", tmp / f"vllm-{i}.log") for i in range(2))
    procs = [prefill, decode]
    try:
        prefill.wait_started()
        decode.wait_started()
        print(f"\nboth vLLM instances ready after {time.monotonic() - t0:.0f} s")
        engines = [{"name": "prefill", "url": prefill.url, "role": "prefill", "model": "smollm2"},
                   {"name": "decode", "url": decode.url, "role": "decode", "model": "smollm2"}]
        gw = start_gateway(tmp, {"engines": engines, "policy": "least-loaded", "admin_token": "real",
                                 "scrape_interval_s": 0.5, "upstream_timeout_s": 300,
                                 # vLLM on 2 CPU cores is orders slower than the A100 preset
                                 # the read deadlines are computed from: give it room
                                 "first_token_timeout_base_s": 120, "token_timeout_min_s": 60})
        procs.append(gw)
        gw.wait_ready()
        yield {"prefill": prefill, "decode": decode, "gw": gw}
    finally:
        for p in procs:
            p.stop()


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
    gw = stack["gw"]
    want = reference(stack["decode"].url, PROMPTS[0])
    s = Stream(gw.url + "/v1/completions", {"model": "smollm2", "prompt": PROMPTS[0], "stream": True,
                                            "stream_options": {"include_usage": True}, **GREEDY}, timeout=300)
    assert s.status == 200
    events = list(s.events())
    s.close()
    assert chunk_texts(events) == want
    assert events[-1]["usage"]["completion_tokens"] == 24
    assert len([e for e in events if e.get("choices")]) > 2  # really streamed, not one blob


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
    assert metric(gw.url, 'baton_scrapes_total{instance="decode",result="ok"}') > 0
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
