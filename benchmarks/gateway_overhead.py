"""Gateway relay cost against mock engines on 127.0.0.1, every figure measured in this run.

Two mock engines (aiohttp, separate processes) answer a streamed completion at once with
``max_tokens`` SSE chunks (one token each, written as fast as the mock can, in the compact
JSON and with the fields of a vLLM 0.32 leg that asked for token ids). Measured:

- **added latency at concurrency 1**: direct-to-a-mock and through-``baton serve``
  requests *interleaved* (alternating, so machine noise lands on both), 8-token streams;
  the added latency is each gateway request minus its direct neighbour, as percentiles of
  those paired differences (a negative figure is printed with a warning);
- **short shape**: 8-token streams at concurrency 32 and 256, requests/s: direct (one mock),
  the gateway (colocated, round-robin over both mocks), and vllm-router (PyPI
  ``vllm-router``) on the same mocks when ``--with-router`` (installed into
  ``~/.cache/baton/vllm-router-venv`` on first use) or ``$VLLM_ROUTER_BIN`` is given;
- **long shape**: 512-token streams at concurrency 32 through the gateway: relayed tokens/s
  and the gateway process's CPU seconds (user + sys, from /proc) per million tokens; once
  through the default gateway, whose relay forwards the mocks' chunks verbatim (the
  engines' model name is configured and the mocks send token ids the client did not ask
  for, as a vLLM leg does: they are nulled in place), and once through a second gateway
  with ``verbatim_relay: false``, which rebuilds every chunk (``*_rebuild``).

``--profile DIR`` samples the default gateway with py-spy (extra ``profile``) during the
short and the long shape, writes the raw stacks to DIR and prints the top frames.

Usage: python benchmarks/gateway_overhead.py [--requests 1000] [--seconds 4] [--with-router]
                                             [--profile DIR]
The last line is one JSON object: gateway_rps, direct_rps, vllm_router_rps,
gateway_vs_router (short shape, concurrency 32), gateway_cpu_ms_per_request, the same at
concurrency 256 (``*_256``), bare_relay_rps and bare_relay_cpu_ms_per_request (a relay
with nothing but aiohttp, on the same mocks: the HTTP stack's floor; also bare_p50_overhead_ms and
bare_p99_overhead_ms), p50_overhead_ms, p99_overhead_ms (paired, concurrency 1),
relayed_tok_s, cpu_s_per_mtok, relayed_tok_s_rebuild, cpu_s_per_mtok_rebuild.
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
from collections import Counter
from pathlib import Path

import aiohttp
import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from baton.core.paths import cache_dir  # noqa: E402
from tests.live import Server, free_port, servers  # noqa: E402

CACHE = cache_dir()
MOCK = r'''
import json, sys
from aiohttp import web
HEAD = {"id": "cmpl-0123456789abcdef", "object": "text_completion", "created": 1732000000, "model": "m"}
def event(obj):  # compact, as vLLM's pydantic output is
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"
def chunk(i):
    return event({**HEAD, "choices": [{"index": 0, "text": f" w{i % 50}", "logprobs": None, "finish_reason": None,
                                       "stop_reason": None, "prompt_token_ids": None, "token_ids": [i]}]})
CHUNKS = [chunk(i) for i in range(4096)]
def tail(n):
    return (event({**HEAD, "choices": [{"index": 0, "text": "", "finish_reason": "length", "token_ids": []}]}) +
            event({**HEAD, "choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": n,
                   "total_tokens": n + 4}}) + b"data: [DONE]\n\n")
async def completions(request):
    body = json.loads(await request.read())
    n = int(body.get("max_tokens") or 8)
    return web.Response(body=b"".join(CHUNKS[:n]) + tail(n), content_type="text/event-stream")
async def ok(_):
    return web.Response(text="")
app = web.Application()
app.router.add_post("/v1/completions", completions)
app.router.add_get("/health", ok)
app.router.add_get("/metrics", ok)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
'''

# The least an aiohttp relay can do per request (read the body, stream the answer back a
# read at a time, no parsing, no policy): the floor of the HTTP stack the gateway is on.
BARE = r'''
import itertools, sys
import aiohttp
from aiohttp import web
try:
    import uvloop
    loop = uvloop.new_event_loop()
except ImportError:
    loop = None
upstreams = itertools.cycle(sys.argv[2:])
async def start(app):
    app["session"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)
async def relay(request):
    body = await request.read()
    async with request.app["session"].post(next(upstreams) + "/v1/completions", data=body,
                                           headers={"Content-Type": "application/json"}) as up:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        async for data in up.content.iter_any():
            await resp.write(data)
        await resp.write_eof()
        return resp
async def ok(_):
    return web.Response(text="")
app = web.Application()
app.on_startup.append(start)
app.router.add_post("/v1/completions", relay)
app.router.add_get("/health", ok)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None,
            **({"loop": loop} if loop else {}))
'''


def body(tokens: int) -> dict:
    return {"prompt": [1, 2, 3, 4], "max_tokens": tokens, "stream": True}


class Proc(Server):
    """A plain subprocess (not a baton command) with the test helpers' readiness check."""

    def __init__(self, argv: list[str], port: int, log: Path) -> None:  # noqa: D107
        self.port, self.log = port, log
        self._logf = open(log, "wb")
        self.proc = subprocess.Popen(argv, stdout=self._logf, stderr=subprocess.STDOUT, start_new_session=True)


async def _one(session: aiohttp.ClientSession, url: str, tokens: int = 8) -> float:
    t = time.perf_counter()
    async with session.post(url, json=body(tokens)) as resp:
        await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{url}: status {resp.status}")
    return time.perf_counter() - t


async def paired_latency(direct: str, gateway: str, n: int) -> np.ndarray:
    """Gateway minus direct latency of alternating request pairs (s); the order inside a
    pair alternates too, so neither side always runs first."""
    async with aiohttp.ClientSession() as s:
        for _ in range(50):
            await _one(s, direct)
            await _one(s, gateway)
        diffs = []
        for i in range(n):
            if i % 2:
                d, g = await _one(s, direct), await _one(s, gateway)
            else:
                g, d = await _one(s, gateway), await _one(s, direct)
            diffs.append(g - d)
        return np.array(diffs)


async def throughput(url: str, seconds: float, concurrency: int, tokens: int = 8) -> float:
    """Requests/s with ``concurrency`` clients in a loop for ``seconds``."""
    done = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        end = time.perf_counter() + seconds

        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < end:
                await _one(s, url, tokens)
                done += 1
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return done / (time.perf_counter() - t0)


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def router_binary(install: bool) -> str | None:
    """vllm-router from $VLLM_ROUTER_BIN or PATH, or (``install``) from its own venv."""
    found = os.environ.get("VLLM_ROUTER_BIN") or shutil.which("vllm-router")
    if found or not install:
        return found
    venv = CACHE / "vllm-router-venv"
    binary = venv / "bin" / "vllm-router"
    if not binary.exists():
        print(f"installing vllm-router into {venv}", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", "vllm-router"], check=True)
    return str(binary)


def _gateway(tmp: Path, mocks: list, name: str, **extra) -> Server:
    port = free_port()
    cfg = {"port": port, "policy": "colocated", "scrape_interval_s": 5.0, "max_inflight": 4096, **extra,
           "engines": [{"name": f"m{i}", "url": m.url, "role": "mixed", "model": "m"} for i, m in enumerate(mocks)]}
    (tmp / f"{name}.yaml").write_text(yaml.safe_dump(cfg))
    return Server(["serve", "--config", str(tmp / f"{name}.yaml")], port, tmp / f"{name}.log")


def start(tmp: Path, binary: str | None) -> tuple[list, Server, Server, Proc, Proc | None]:
    """The mocks, the default gateway, one that rebuilds every chunk, the bare aiohttp
    relay and vllm-router."""
    (tmp / "mock.py").write_text(MOCK)
    (tmp / "bare.py").write_text(BARE)
    mocks = [Proc([sys.executable, str(tmp / "mock.py"), str(p)], p, tmp / f"mock-{p}.log")
             for p in (free_port(), free_port())]
    gw, rebuild = _gateway(tmp, mocks, "gw"), _gateway(tmp, mocks, "gw-rebuild", verbatim_relay=False)
    port = free_port()
    bare = Proc([sys.executable, str(tmp / "bare.py"), str(port), *[m.url for m in mocks]], port, tmp / "bare.log")
    router = None
    if binary:
        rport = free_port()
        router = Proc([binary, "--host", "127.0.0.1", "--port", str(rport), "--policy", "round_robin",
                       "--worker-urls", *[m.url for m in mocks]], rport, tmp / "router.log")
    return mocks, gw, rebuild, bare, router


def _served(server, seconds: float, concurrency: int, tokens: int) -> tuple[float, float]:
    """(requests/s of ``tokens``-token streams, the server process's CPU-seconds per request)."""
    cpu0, t0 = cpu_s(server.proc.pid), time.perf_counter()
    rps = asyncio.run(throughput(server.url + "/v1/completions", seconds, concurrency, tokens))
    return rps, (cpu_s(server.proc.pid) - cpu0) / (rps * (time.perf_counter() - t0))


def _rate(server, seconds: float, concurrency: int) -> tuple[float, float]:
    """(requests/s of 8-token streams, the server process's CPU-ms per request)."""
    rps, cpu = _served(server, seconds, concurrency, 8)
    return round(rps, 1), round(cpu * 1e3, 3)


def _long(gw: Server, seconds: float) -> tuple[float, float]:
    """(relayed tokens/s, gateway CPU-s per million tokens) of 512-token streams."""
    rps, cpu = _served(gw, seconds, 32, 512)
    return round(rps * 512, 1), round(cpu / 512 * 1e6, 2)


def measure(args, mocks, gw, rebuild, bare, router) -> dict:
    direct, gateway = mocks[0].url + "/v1/completions", gw.url + "/v1/completions"
    out: dict = {}
    for key, url in (("", gateway), ("bare_", bare.url + "/v1/completions")):
        diffs = asyncio.run(paired_latency(direct, url, args.requests)) * 1e3
        out[f"{key}p50_overhead_ms"], out[f"{key}p99_overhead_ms"] = \
            (round(float(x), 3) for x in np.percentile(diffs, [50, 99]))
    for conc, suffix in ((32, ""), (256, "_256")):
        out[f"direct_rps{suffix}"] = round(asyncio.run(throughput(direct, args.seconds, conc)), 1)
        out[f"gateway_rps{suffix}"], out[f"gateway_cpu_ms_per_request{suffix}"] = _rate(gw, args.seconds, conc)
        out[f"bare_relay_rps{suffix}"], out[f"bare_relay_cpu_ms_per_request{suffix}"] = \
            _rate(bare, args.seconds, conc)
        rps = asyncio.run(throughput(router.url + "/v1/completions", args.seconds, conc)) if router else None
        out[f"vllm_router_rps{suffix}"] = None if rps is None else round(rps, 1)
        out[f"gateway_vs_router{suffix}"] = None if rps is None else round(out[f"gateway_rps{suffix}"] / rps, 3)
    out["relayed_tok_s"], out["cpu_s_per_mtok"] = _long(gw, args.seconds)
    out["relayed_tok_s_rebuild"], out["cpu_s_per_mtok_rebuild"] = _long(rebuild, args.seconds)
    return out


def report(r: dict) -> None:
    if r["p50_overhead_ms"] < 0 or r["p99_overhead_ms"] < 0:
        print("warning: a negative added latency: machine noise exceeds the gateway's cost here; rerun on a "
              "quieter machine", file=sys.stderr)
    print(f"added latency at concurrency 1 (paired, interleaved): p50 {r['p50_overhead_ms']:.3f} ms, "
          f"p99 {r['p99_overhead_ms']:.3f} ms (target: 0-1 ms); bare aiohttp relay p50 "
          f"{r['bare_p50_overhead_ms']:.3f} ms, p99 {r['bare_p99_overhead_ms']:.3f} ms")
    for conc, sfx in ((32, ""), (256, "_256")):
        router = r[f"vllm_router_rps{sfx}"]
        versus = (f", vllm-router {router:.0f} req/s (gateway {r['gateway_vs_router' + sfx]:.2f}x router)"
                  if router else ", vllm-router not measured (--with-router)")
        print(f"8-token streams at concurrency {conc}: direct {r['direct_rps' + sfx]:.0f} req/s, "
              f"gateway {r['gateway_rps' + sfx]:.0f} req/s ({r['gateway_cpu_ms_per_request' + sfx]:.3f} CPU-ms each), "
              f"bare aiohttp relay {r['bare_relay_rps' + sfx]:.0f} req/s "
              f"({r['bare_relay_cpu_ms_per_request' + sfx]:.3f} CPU-ms each){versus}")
    for label, sfx in (("verbatim", ""), ("rebuilt", "_rebuild")):
        print(f"512-token streams at concurrency 32 through the gateway, chunks {label}: "
              f"{r['relayed_tok_s' + sfx]:.0f} tokens/s relayed, "
              f"{r['cpu_s_per_mtok' + sfx]:.2f} gateway CPU-seconds per million tokens")


def _top_frames(raw: Path, n: int = 15) -> list[tuple[float, float, str]]:
    """(self %, inclusive %, frame) of py-spy's raw (collapsed) stacks, by self time."""
    own, within, total = Counter(), Counter(), 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames, k = stack.split(";"), int(count)
        total += k
        own[frames[-1]] += k
        for f in set(frames):
            within[f] += k
    return [(100 * k / total, 100 * within[f] / total, f) for f, k in own.most_common(n)]


def profile(gw: Server, out_dir: Path, seconds: float) -> None:
    """Sample the gateway with py-spy while each shape runs (not during the measured runs)."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        sys.exit("error: --profile needs py-spy (pip install 'llm-baton[profile]')")
    out_dir.mkdir(parents=True, exist_ok=True)
    for tokens in (8, 512):
        raw = out_dir / f"gateway-{tokens}tok.txt"
        spy_proc = subprocess.Popen([spy, "record", "--pid", str(gw.proc.pid), "--rate", "250", "--format", "raw",
                                     "--duration", str(int(seconds)), "--nonblocking", "-o", str(raw)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        asyncio.run(throughput(gw.url + "/v1/completions", seconds, 32, tokens))
        spy_proc.wait()
        print(f"py-spy, {tokens}-token streams at concurrency 32 (self %, inclusive %, frame); raw stacks in {raw}")
        for own, within, frame in _top_frames(raw):
            print(f"  {own:5.1f} {within:5.1f}  {frame}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=1000, help="request pairs for the paired latency")
    ap.add_argument("--seconds", type=float, default=4.0, help="duration of each throughput measurement")
    ap.add_argument("--with-router", action="store_true", help="install and measure vllm-router")
    ap.add_argument("--profile", type=Path, metavar="DIR", help="also sample the gateway with py-spy")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="baton-overhead-"))
    mocks, gw, rebuild, bare, router = start(tmp, router_binary(args.with_router))
    with servers(*mocks, gw, rebuild, bare, *([router] if router else [])):
        results = measure(args, mocks, gw, rebuild, bare, router)
        if args.profile:
            profile(gw, args.profile, args.seconds)
    report(results)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
