"""The emulator's KV handoff when the client goes away: a decode request whose client
disconnects while its prompt's KV is being pulled gives the blocks reserved for it back
(five such aborts once left a decode emulator at 94% KV with nothing running)."""

from __future__ import annotations

import asyncio
import socket

import aiohttp
from aiohttp import web

from baton.emulator.engine_loop import LoopConfig
from baton.emulator.server import Emulator, EmulatorConfig
from baton.perf import presets


async def _serve(emulator: Emulator, sock: socket.socket) -> web.AppRunner:
    # as `baton emulate` serves: a handler is cancelled when its client goes away
    runner = web.AppRunner(emulator.app(), shutdown_timeout=0.2, handler_cancellation=True)
    await runner.setup()
    await web.SockSite(runner, sock).start()
    return runner


def _socket() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock


def test_a_decode_abandoned_mid_pull_gives_its_reserved_blocks_back():
    asyncio.run(_abandoned())


async def _abandoned() -> None:
    perf = presets.build("llama-3.1-8b@a100-80g")
    socks = _socket(), _socket()
    ports = [s.getsockname()[1] for s in socks]
    # a slow link: a 2,000-token prompt's KV takes about a second to move
    prefill = Emulator(EmulatorConfig(port=ports[0], nic_gbps=2.0), LoopConfig.of(20000, 16, 2048, 64), perf)
    decode = Emulator(EmulatorConfig(port=ports[1], nic_gbps=2.0), LoopConfig.of(20000, 16, 2048, 64), perf)
    runners = [await _serve(prefill, socks[0]), await _serve(decode, socks[1])]
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(5):
                body = {"prompt": list(range(2000)), "max_tokens": 1,
                        "kv_transfer_params": {"do_remote_decode": True}}
                async with session.post(f"http://127.0.0.1:{ports[0]}/v1/completions", json=body) as resp:
                    params = (await resp.json())["kv_transfer_params"]
                decode_body = {"prompt": list(range(2000)), "max_tokens": 50, "stream": True,
                               "kv_transfer_params": params}
                task = asyncio.create_task(session.post(f"http://127.0.0.1:{ports[1]}/v1/completions",
                                                        json=decode_body))
                await asyncio.sleep(0.2)  # the pull is under way
                assert decode.engine.blocks_used > 0
                task.cancel()  # the client goes away
                await asyncio.gather(task, return_exceptions=True)
            for _ in range(100):
                if decode.engine.blocks_used == 0:
                    break
                await asyncio.sleep(0.05)
            assert decode.engine.blocks_used == 0 and not decode.engine.running
    finally:
        for runner in runners:
            await runner.cleanup()
