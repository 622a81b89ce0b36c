"""Whether an emulator's token times are the simulator's: ``tests/conformance/test_engine_clocks.py``
run against a ``baton emulate`` process, optionally of another git revision.

    python scripts/clock_check.py [--rev REV] [--random N] [--seed S]

The emulator (this checkout's, or ``REV``'s exported with ``git archive``) serves the test's
traces over HTTP as a separate process, slowed ``TIME_SCALE`` times; this checkout's
simulator runs the same requests on one instance with the same engine flags, arrivals taken
when the client sent each request (so the HTTP hop, about a millisecond, counts: the test
itself takes arrivals inside the emulator). Prints the worst and median gap between the
emulator's and the simulator's first and last token of every request, per trace, and one
JSON line. ``--random N`` adds N random traces under KV pressure (chunked prompts of 100
to 2,400 tokens, 4 to 6 requests, 2,600 to 4,000 KV tokens).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from baton.core.request import Request  # noqa: E402
from baton.engine_model.work import EngineConfig  # noqa: E402
from baton.perf import presets  # noqa: E402
from baton.perf.scaled import ScaledPerf  # noqa: E402
from baton.sim import ClusterSpec, simulate  # noqa: E402
from tests.conformance.test_engine_clocks import GROWING, LEAD_S, MIXED, PRESET, TIME_SCALE, _stream  # noqa: E402

BATCHED_TOKENS = 1024


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _serve(src: Path, trace: list, kv_blocks: int) -> tuple[dict[int, float], dict[int, list[float]]]:
    port = _port()
    args = [sys.executable, "-m", "baton.cli.main", "emulate", "--port", str(port), "--preset", PRESET,
            "--max-num-batched-tokens", str(BATCHED_TOKENS), "--max-num-seqs", "8", "--block-size", "16",
            "--kv-blocks", str(kv_blocks), "--time-scale", str(TIME_SCALE)]
    proc = subprocess.Popen(args, env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    loop = asyncio.get_running_loop()
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(200):
                try:
                    async with session.get(f"http://127.0.0.1:{port}/health") as resp:
                        if resp.status == 200:
                            break
                except aiohttp.ClientError:
                    await asyncio.sleep(0.05)
            url, t0, sent = f"http://127.0.0.1:{port}/v1/completions", loop.time(), {}

            async def one(i: int) -> list[float]:
                await asyncio.sleep(max(0.0, t0 + LEAD_S + trace[i][0] * TIME_SCALE - loop.time()))
                sent[i] = loop.time() - t0
                return await _stream(session, url, i, trace[i][1], trace[i][2], t0)
            tokens = await asyncio.gather(*(one(i) for i in range(len(trace))))
    finally:
        proc.terminate()
        proc.wait()
    return sent, dict(enumerate(tokens))


def gaps(src: Path, trace: list, kv_tokens: int) -> list[float]:
    """|emulator - simulator| of every request's first and last token (s); inf if the
    emulator's answer had a different length."""
    engine = EngineConfig(max_num_batched_tokens=BATCHED_TOKENS, max_num_seqs=8, block_size=16, kv_tokens=kv_tokens)
    sent, tokens = asyncio.run(_serve(src, trace, kv_tokens // 16))
    requests = [Request(i, sent[i], prompt, out, tuple(range(1000 * (i + 1), 1000 * (i + 1) + (prompt + out) // 16)),
                        16) for i, (_, prompt, out) in enumerate(trace)]
    result = simulate(requests, ClusterSpec(prefill=0, decode=0, mixed=1, engine=engine, preset=PRESET),
                      "least-loaded", perf=ScaledPerf(presets.build(PRESET), TIME_SCALE))
    out = []
    for rec in result.records:
        got = tokens[rec.req_id]
        if len(got) != trace[rec.req_id][2]:
            return [float("inf")]
        out += [abs(got[0] - rec.arrival_s - rec.ttft_s), abs(got[-1] - rec.arrival_s - rec.e2e_s)]
    return out


def traces(n_random: int, seed: int) -> list[tuple[str, list, int]]:
    out = [("mixed", MIXED, 40_000), ("preempting", GROWING, 1_600)]
    rng = random.Random(seed)
    while len(out) < 2 + n_random:
        trace = sorted((round(rng.uniform(0, 0.4), 2), rng.choice([100, 300, 800, 1500, 2400]),
                        rng.choice([5, 40, 120])) for _ in range(rng.randint(4, 6)))
        kv = rng.choice([2600, 3000, 3400, 4000])
        if max(p + o for _, p, o in trace) <= kv:
            out.append((f"random-{len(out) - 1}", trace, kv))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rev", help="run this git revision's emulator (default: this checkout's)")
    ap.add_argument("--random", type=int, default=0, help="random traces under KV pressure to add")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        src = ROOT / "src"
        if args.rev:
            archive = subprocess.run(["git", "archive", args.rev], cwd=ROOT, capture_output=True)
            if archive.returncode:
                sys.exit(f"git archive {args.rev}: {archive.stderr.decode().strip()}")
            subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
            src = Path(tmp) / "src"
        figures = {}
        for name, trace, kv in traces(args.random, args.seed):
            g = sorted(gaps(src, trace, kv))
            figures[name] = {"worst_ms": round(g[-1] * 1000, 2), "median_ms": round(g[len(g) // 2] * 1000, 2)}
            print(f"{name:12s} worst {g[-1] * 1000:8.1f} ms   median {g[len(g) // 2] * 1000:6.1f} ms", flush=True)
    print(json.dumps({"emulator": args.rev or "this checkout", "traces": figures}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
