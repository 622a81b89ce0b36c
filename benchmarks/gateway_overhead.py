"""Gateway overhead against mock backends on 127.0.0.1, all measured in this run.

Two mock engines (aiohttp, separate processes) answer a streamed completion at once with
a fixed 8-token SSE stream. The same client (aiohttp, separate process) then measures:

- latency at concurrency 1: direct to a mock vs through ``baton serve`` (colocated mode,
  round-robin over both mocks; one leg per request, like the Rust router); the
  difference of the p50s and p99s is the gateway's added latency;
- requests per second at concurrency 32: direct, through the gateway, and through the Rust
  ``vllm-router`` (PyPI) on the same mocks when its ``vllm-router`` executable is on PATH
  or in ``$VLLM_ROUTER_BIN``.

Usage: python benchmarks/gateway_overhead.py [--requests 2000] [--seconds 5]
The last line is one JSON object with p50_overhead_ms, p99_overhead_ms, gateway_rps,
direct_rps, vllm_router_rps (null when not installed) and gateway_vs_router.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.live import Server, free_port, servers  # noqa: E402

MOCK = r'''
import json, sys
from aiohttp import web
CHUNKS = b"".join(b"data: " + json.dumps({"id": "x", "object": "text_completion", "model": "m",
    "choices": [{"index": 0, "text": f" {i}", "token_ids": [i], "finish_reason": None}]}).encode() + b"\n\n"
    for i in range(8))
TAIL = (b"data: " + json.dumps({"id": "x", "object": "text_completion", "model": "m", "choices": [
    {"index": 0, "text": "", "finish_reason": "length"}]}).encode() + b"\n\n" + b"data: " +
    json.dumps({"id": "x", "choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 8,
    "total_tokens": 12}}).encode() + b"\n\ndata: [DONE]\n\n")
async def completions(request):
    await request.read()
    return web.Response(body=CHUNKS + TAIL, content_type="text/event-stream")
async def ok(_):
    return web.Response(text="")
app = web.Application()
app.router.add_post("/v1/completions", completions)
app.router.add_get("/health", ok)
app.router.add_get("/metrics", ok)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
'''

BODY = {"prompt": [1, 2, 3, 4], "max_tokens": 8, "stream": True}


class Proc(Server):
    """A plain subprocess (not a baton command) with the test helpers' readiness check."""

    def __init__(self, argv: list[str], port: int, log: Path) -> None:  # noqa: D107
        self.port, self.log = port, log
        self._logf = open(log, "wb")
        self.proc = subprocess.Popen(argv, stdout=self._logf, stderr=subprocess.STDOUT, start_new_session=True)


async def _one(session: aiohttp.ClientSession, url: str) -> float:
    t = time.perf_counter()
    async with session.post(url, json=BODY) as resp:
        await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{url}: status {resp.status}")
    return time.perf_counter() - t


async def latency(url: str, n: int) -> np.ndarray:
    async with aiohttp.ClientSession() as s:
        for _ in range(50):
            await _one(s, url)
        return np.array([await _one(s, url) for _ in range(n)])


async def throughput(url: str, seconds: float, concurrency: int = 32) -> float:
    done = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        end = time.perf_counter() + seconds

        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < end:
                await _one(s, url)
                done += 1
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return done / (time.perf_counter() - t0)


def router_binary() -> str | None:
    return os.environ.get("VLLM_ROUTER_BIN") or shutil.which("vllm-router")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=2000, help="requests per latency measurement")
    ap.add_argument("--seconds", type=float, default=5.0, help="duration of each throughput measurement")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="baton-overhead-"))
    mock_py = tmp / "mock.py"
    mock_py.write_text(MOCK)
    mocks = [Proc([sys.executable, str(mock_py), str(p)], p, tmp / f"mock-{p}.log") for p in (free_port(), free_port())]
    gw_port = free_port()
    cfg = {"port": gw_port, "policy": "colocated", "scrape_interval_s": 5.0,
           "engines": [{"name": f"m{i}", "url": m.url, "role": "mixed"} for i, m in enumerate(mocks)]}
    (tmp / "gw.yaml").write_text(yaml.safe_dump(cfg))
    gw = Server(["serve", "--config", str(tmp / "gw.yaml")], gw_port, tmp / "gw.log")
    procs = [*mocks, gw]
    binary = router_binary()
    if binary:
        rport = free_port()
        router = Proc([binary, "--host", "127.0.0.1", "--port", str(rport), "--policy", "round_robin",
                       "--worker-urls", *[m.url for m in mocks]], rport, tmp / "router.log")
        procs.append(router)
    with servers(*procs):
        direct_url, gw_url = mocks[0].url + "/v1/completions", gw.url + "/v1/completions"
        d_lat = asyncio.run(latency(direct_url, args.requests))
        g_lat = asyncio.run(latency(gw_url, args.requests))
        direct_rps = asyncio.run(throughput(direct_url, args.seconds))
        gateway_rps = asyncio.run(throughput(gw_url, args.seconds))
        router_rps = asyncio.run(throughput(router.url + "/v1/completions", args.seconds)) if binary else None
    d50, d99 = np.percentile(d_lat, [50, 99]) * 1e3
    g50, g99 = np.percentile(g_lat, [50, 99]) * 1e3
    print(f"latency at concurrency 1 ({args.requests} requests): direct p50 {d50:.3f} ms p99 {d99:.3f} ms; "
          f"gateway p50 {g50:.3f} ms p99 {g99:.3f} ms")
    print(f"added: p50 {g50 - d50:.3f} ms, p99 {g99 - d99:.3f} ms (target p99 <= 1 ms)")
    print(f"throughput at concurrency 32: direct {direct_rps:.0f} req/s, gateway {gateway_rps:.0f} req/s "
          f"({gateway_rps / direct_rps:.2f}x direct)" +
          (f", vllm-router {router_rps:.0f} req/s (gateway {gateway_rps / router_rps:.2f}x router)"
           if router_rps else ", vllm-router not installed"))
    print(json.dumps({"p50_overhead_ms": round(g50 - d50, 3), "p99_overhead_ms": round(g99 - d99, 3),
                      "gateway_rps": round(gateway_rps, 1), "direct_rps": round(direct_rps, 1),
                      "vllm_router_rps": None if router_rps is None else round(router_rps, 1),
                      "gateway_vs_router": None if router_rps is None else round(gateway_rps / router_rps, 3)}))


if __name__ == "__main__":
    main()
