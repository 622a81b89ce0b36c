"""One engine model under two clocks: an emulator serving a trace over HTTP emits every
request's first and last token when the simulator, running the same engine flags and
preset on one instance with the same arrivals, says it does.

The emulator advances ``baton.engine_model`` one iteration at a time on wall-clock time,
keeping the ideal schedule (``emulator/engine_loop.py``); the simulator advances the same
model on its event clock, many iterations per segment. Arrivals are taken where the
engine sees them (the emulator's submit), so HTTP's own delay is not counted; what is left
is the event loop's wake-up and the stream's delivery, well under ``TOLERANCE_S``. An event
loop stalled for longer than the emulator's catch-up allowance (50 ms: a machine busy with
something else) makes its schedule slip; the emulator says by how much (``slipped_s``),
and the tolerance grows by exactly that. Each
trace mixes chunked prefills (prompts over ``max_num_batched_tokens``), prefills batched
with decodes, and finishing requests; the tight one runs out of KV blocks, so requests
are preempted and recomputed on both clocks."""

from __future__ import annotations

import asyncio
import json
import socket

import aiohttp
import pytest

from baton.core.request import Request
from baton.emulator.engine_loop import LoopConfig
from baton.emulator.server import Emulator, EmulatorConfig
from baton.engine_model.work import EngineConfig
from baton.perf import presets
from baton.perf.scaled import ScaledPerf
from baton.sim import ClusterSpec, simulate

PRESET = "llama-3.1-8b@a100-80g"
TIME_SCALE = 4.0  # iterations of 40-120 ms: the wake-up jitter is small beside them
TOLERANCE_S = 0.010  # the smallest iteration here is 40 ms: any difference in scheduling shows
LEAD_S = 0.05
# (arrival s, prompt tokens, output tokens): chunked long prompts, overlaps, short answers
MIXED = [(0.00, 900, 12), (0.03, 200, 30), (0.05, 2500, 8), (0.20, 64, 40), (0.21, 1200, 5),
         (0.40, 300, 25), (0.41, 300, 25), (0.70, 1800, 10), (0.72, 90, 1), (0.90, 500, 20)]
# contexts that outgrow 100 blocks as they decode: the latest admitted are preempted
GROWING = [(0.00, 300, 120), (0.01, 300, 120), (0.02, 280, 110), (0.03, 310, 100), (0.05, 290, 90),
           (0.30, 200, 60)]


async def _stream(session: aiohttp.ClientSession, url: str, i: int, prompt: int, out: int,
                  t0: float) -> list[float]:
    """Token times (s after ``t0``) of request ``i``, as the client reads them."""
    loop = asyncio.get_running_loop()
    body = {"prompt": list(range(10_000 * (i + 1), 10_000 * (i + 1) + prompt)), "max_tokens": out,
            "stream": True, "ignore_eos": True}
    times = []
    async with session.post(url, json=body, headers={"X-Request-Id": f"r{i}"}) as resp:
        assert resp.status == 200
        async for line in resp.content:
            if line.startswith(b"data: {"):
                if json.loads(line[6:])["choices"][0]["finish_reason"] is None:
                    times.append(loop.time() - t0)
    return times


async def _serve_trace(trace: list[tuple[float, int, int]], engine: EngineConfig,
                       kv_blocks: int) -> tuple[dict[int, float], dict[int, list[float]], float]:
    """Run the trace against one emulator: (engine-side arrival s, token times s) by
    request, and how far the emulator's schedule slipped (s)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    emulator = Emulator(EmulatorConfig(port=port), LoopConfig(engine, kv_blocks, TIME_SCALE), presets.build(PRESET))
    loop = asyncio.get_running_loop()
    arrivals: dict[int, float] = {}
    submit = emulator.engine.submit

    def timed_submit(seq):
        arrivals[int(seq.rid.split("-", 1)[1][1:])] = loop.time() - t0  # cmpl-rN: the X-Request-Id rN
        submit(seq)
    emulator.engine.submit = timed_submit
    runner = aiohttp.web.AppRunner(emulator.app(), access_log=None)
    await runner.setup()
    await aiohttp.web.SockSite(runner, sock).start()
    try:
        async with aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{port}/v1/completions"
            t0 = loop.time()

            async def one(i: int) -> list[float]:
                await asyncio.sleep(max(0.0, t0 + LEAD_S + trace[i][0] * TIME_SCALE - loop.time()))
                return await _stream(session, url, i, trace[i][1], trace[i][2], t0)
            tokens = await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(len(trace)))), 120)
    finally:
        await runner.cleanup()
    return arrivals, dict(enumerate(tokens)), emulator.engine.slipped_s


@pytest.mark.parametrize("trace, kv_tokens", [(MIXED, 40_000), (GROWING, 1_600)], ids=["mixed", "preempting"])
def test_emulator_token_times_equal_the_simulators(trace, kv_tokens):
    engine = EngineConfig(max_num_batched_tokens=1024, max_num_seqs=8, block_size=16, kv_tokens=kv_tokens)
    arrivals, tokens, slipped_s = asyncio.run(_serve_trace(trace, engine, kv_tokens // engine.block_size))
    assert slipped_s < 0.5, f"the event loop stalled {slipped_s:.2f} s in all: nothing to compare"
    # what the tokens are, block by block (no two requests share one), so that the simulated
    # engine's prefix cache serves a recomputed context from its own freed blocks as the
    # emulator's does (it knows the tokens)
    requests = [Request(i, arrivals[i], prompt, out, tuple(range(1000 * (i + 1), 1000 * (i + 1) + (prompt + out) // 16)),
                        engine.block_size) for i, (_, prompt, out) in enumerate(trace)]
    result = simulate(requests, ClusterSpec(prefill=0, decode=0, mixed=1, engine=engine, preset=PRESET),
                      "least-loaded", perf=ScaledPerf(presets.build(PRESET), TIME_SCALE))
    assert (result.counters.preemptions > 0) == (trace is GROWING)
    off = []
    for rec in result.records:
        got = tokens[rec.req_id]
        assert rec.finished and len(got) == trace[rec.req_id][2], rec.req_id
        first_s, last_s = rec.arrival_s + rec.ttft_s, rec.arrival_s + rec.e2e_s
        off += [(rec.req_id, "first", got[0] - first_s), (rec.req_id, "last", got[-1] - last_s)]
    worst = max(off, key=lambda o: abs(o[2]))
    assert abs(worst[2]) <= TOLERANCE_S + slipped_s, (worst, slipped_s, off)
