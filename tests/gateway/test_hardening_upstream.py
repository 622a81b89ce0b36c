"""Gateway hardening, upstream side (engines that write past their answers, bodies that
stall the loop, ids, content types): each case failed on the code before it."""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import aiohttp
import pytest

from baton.gateway import framing
from baton.gateway.ids import IdSource
from tests.gateway.test_chaos import AUTH, FAST, IDS, expected
from tests.live import get, metric, post, request, servers, start_fake, start_gateway

CLIENTS, ROUNDS = 4, 4


@pytest.mark.parametrize("mode", ["trail-now", "trail-later"])
def test_bytes_after_a_complete_answer_never_reach_another_request(tmp_path, mode):
    """N7: a prefill engine duplicates each JSON answer after its end, in the same write
    as the body's last byte or 50 ms later while the connection idles in the pool. The
    pooled connection handed the duplicate to the next prefill leg sent on it (another
    client's), whose decode then continued the wrong prompt: clients got each other's
    text. Such connections are closed now, never reused."""
    p, d = start_fake(tmp_path), start_fake(tmp_path)
    engines = [{"name": "p", "url": p.url, "role": "prefill"}, {"name": "d", "url": d.url, "role": "decode"}]
    gw = start_gateway(tmp_path, {**FAST, "engines": engines, "policy": "least-loaded"})

    def ask(prompt_len: int) -> tuple[int, str]:
        status, body = post(gw.url + "/v1/completions", {"prompt": list(range(1, prompt_len + 1)), "max_tokens": 4,
                                                         "user": mode}, timeout=10)
        return prompt_len, body["choices"][0]["text"] if status == 200 else f"HTTP {status}: {body}"

    got = []
    with servers(p, d, gw), ThreadPoolExecutor(CLIENTS) as pool:
        for r in range(ROUNDS):  # every request has its own prompt length, so its own text
            got += pool.map(ask, [4 + CLIENTS * r + c for c in range(CLIENTS)])
            time.sleep(0.1)  # the delayed duplicates land while the connections idle
    wrong = [(n, text) for n, text in got if text != expected(n, 4)]
    assert not wrong, f"{len(wrong)} of {len(got)} clients got another's text: {wrong[:3]}"


def _raw(text: str) -> bytes:
    body = text.encode()
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


async def _exchanges(trail: bytes, later: bytes, make=None) -> tuple[list[str], int]:
    """Four sequential POSTs through ``make(limit=0)``, the connector, to a raw server that answers the n-th
    request on a connection ``answer-n`` (head first, then the body's end with ``trail``,
    then ``later`` 20 ms after): (the bodies read, the connections the server saw)."""
    seen = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(writer)
        for n in itertools.count(1):
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            await reader.readexactly(int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0]))
            answer = _raw(f"answer-{n}")
            writer.write(answer[:-1])
            await asyncio.sleep(0.01)
            writer.write(answer[-1:] + trail)
            await asyncio.sleep(0.02)
            writer.write(later)

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/"
    got = []
    async with aiohttp.ClientSession(connector=(make or framing.upstream_connector)(limit=0)) as session:
        for _ in range(4):
            async with session.post(url, data=b"{}") as resp:
                got.append(await resp.text())
            await asyncio.sleep(0.05)
    server.close()
    return got, len(seen)


@pytest.mark.parametrize("trail,later", [
    (b"", b""),  # a well-behaved engine: one connection for all four
    (_raw("stale"), b""),  # a whole response right behind the answer
    (_raw("stale")[:10], _raw("stale")[10:]),  # its head split over two writes
    (b"", _raw("stale")),  # a whole response while the connection idles
    (b"", b"x"),  # one stray byte while idle
], ids=["clean", "whole-behind", "split-behind", "whole-idle", "byte-idle"])
def test_a_connection_is_reused_only_after_an_answer_that_ended_at_its_framing(trail, later):
    """N7, the mechanism: aiohttp pooled the connection when the body's end was parsed and
    then parsed the rest of that read (or later bytes) as the next request's response."""
    got, connections = asyncio.run(_exchanges(trail, later))
    assert all(text.startswith("answer-") for text in got), got
    assert connections == (1 if trail == later == b"" else 4)


def test_without_its_protocol_hook_the_pool_closes_every_connection(monkeypatch):
    """Where aiohttp builds connections another way, nothing is reused rather than risk it."""
    monkeypatch.setattr(framing, "ResponseHandler", object)
    got, connections = asyncio.run(_exchanges(b"", _raw("stale")))
    assert got == ["answer-1"] * 4 and connections == 4


# Health checks timed from another process, so the test's own threads (sending the
# bodies, holding this process's GIL) do not count in their latency.
_POLL_HEALTH = """
import http.client, sys, threading, time
done, latencies = threading.Event(), []
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()  # until stdin closes
while not done.is_set():
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=10)
    conn.request("GET", "/health")
    conn.getresponse().read()
    conn.close()
    latencies.append(time.perf_counter() - t0)
    time.sleep(0.005)
print(" ".join(f"{x:.4f}" for x in latencies))
"""


def _primed(port: int, body: bytes) -> socket.socket:
    """A connection that has sent all of a completions request but its last byte."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n%s" % (len(body), body[:-1]))
    return s


def _status(s: socket.socket) -> int:
    head = s.recv(65536)
    s.close()
    return int(head.split(b" ", 2)[1])


def test_multi_megabyte_bodies_do_not_stall_the_event_loop(tmp_path):
    """M5: bodies were decoded and validated on the event loop, 100-150 ms per 2 MB of
    token ids here, back to back when several arrive at once: health checks waited for
    all of them (the issue: p99 from 59 to 535 ms). Bodies over 64 KiB are parsed on a
    thread now, one at a time, with the loop running between them (orjson holds the GIL
    while it decodes, so each decode still pauses the loop: the bound is generous).
    Sixteen 1.9 MB bodies whose last bytes arrive together; health checks all the while."""
    a = start_fake(tmp_path)
    gw = start_gateway(tmp_path, {**FAST, "engines": [{"name": "a", "url": a.url, "role": "mixed"}],
                                  "policy": "colocated", "body_timeout_s": 5.0})
    large = json.dumps({"prompt": list(range(100_000, 340_000)), "max_tokens": 2}).encode()  # 1.9 MB
    with servers(a, gw):
        poll = subprocess.Popen([sys.executable, "-c", _POLL_HEALTH, str(gw.port)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
        primed = [_primed(gw.port, large) for _ in range(16)]
        time.sleep(0.1)
        for s in primed:
            s.sendall(large[-1:])
        statuses = [_status(s) for s in primed]
        time.sleep(0.1)
        latencies = sorted(float(x) for x in poll.communicate(timeout=15)[0].split())
        small = post(gw.url + "/v1/completions", {"prompt": IDS, "max_tokens": 2})
    assert latencies[-1] < 0.3, f"slowest health check {latencies[-1] * 1e3:.0f} ms of {len(latencies)}"
    assert statuses == [400] * 16  # 240,000 tokens > max_prompt_tokens, once parsed
    assert small[0] == 200


def test_a_body_over_max_body_bytes_is_a_413_before_it_is_read(tmp_path):
    """M5: the cap was 4 MiB, so 3.8 MB bodies were read and parsed (their prompts far
    over max_prompt_tokens). It is 2 MiB now, the longest allowed prompt in any form, and
    a body declared larger is refused before it is read, with an OpenAI error body."""
    a = start_fake(tmp_path)
    gw = start_gateway(tmp_path, {**FAST, "engines": [{"name": "a", "url": a.url, "role": "mixed"}],
                                  "policy": "colocated"})
    huge = json.dumps({"prompt": list(range(100_000, 575_000)), "max_tokens": 2}).encode()  # 3.8 MB
    with servers(a, gw):
        status, body = request("POST", gw.url + "/v1/completions", raw=huge)
        after = post(gw.url + "/v1/completions", {"prompt": IDS, "max_tokens": 2})
    assert status == 413 and body["error"]["code"] == "request_too_large"
    assert "max_body_bytes" in body["error"]["message"]
    assert after[0] == 200


def test_a_stream_line_that_never_ends_fails_its_leg_at_the_cap(tmp_path):
    """LOW: a stream line without a newline was buffered without bound (and re-joined
    on every read, quadratic), until the leg's read deadline. The leg is malformed once
    a line passes 16 MiB: the engine's connection is closed right there."""
    a = start_fake(tmp_path)
    gw = start_gateway(tmp_path, {**FAST, "engines": [{"name": "a", "url": a.url, "role": "mixed"}],
                                  "policy": "colocated", "first_token_timeout_base_s": 20.0,
                                  "token_timeout_min_s": 20.0})
    with servers(a, gw):
        t0 = time.monotonic()
        status, body = post(gw.url + "/v1/completions", {"prompt": IDS, "max_tokens": 2, "user": "long-line"},
                            timeout=30)
        took = time.monotonic() - t0
        sent = get(a.url + "/fake/requests")[1][-1]["sent"]
        malformed = metric(gw.url, 'baton_backend_errors_total{engine="a",kind="malformed"}')
        log = gw.log.read_text()
    assert status == 503 and body["error"]["message"]  # nowhere else to continue
    assert malformed == 1 and "a stream line longer than 16777216 bytes" in log and took < 10
    assert sent < 64 << 20  # the cap, plus what the sockets' buffers held


def test_internal_ids_are_unguessable():
    """LOW: ids were a per-process random prefix plus a counter, so one response id
    (``cmpl-<id>``) gave away every other request's id, and the X-Request-Id its legs
    carried to engines. Each id is 128 fresh random bits now."""
    source = IdSource()
    a, b = source.next(), source.next()
    assert len(a) == len(b) == 32 and int(a, 16) >= 0
    assert a[:16] != b[:16] and abs(int(b, 16) - int(a, 16)) > 1 << 64


def test_api_and_admin_bodies_must_be_declared_json(tmp_path):
    """LOW: a JSON body sent as text/plain (or a form) was served, so any web page could
    make a visitor's browser post to the gateway without a CORS preflight. POST, PUT and
    PATCH to /v1/ and /admin/ need ``Content-Type: application/json`` now (415)."""
    a = start_fake(tmp_path)
    gw = start_gateway(tmp_path, {**FAST, "engines": [{"name": "a", "url": a.url, "role": "mixed"}],
                                  "policy": "colocated"})
    body = json.dumps({"prompt": IDS, "max_tokens": 2}).encode()
    with servers(a, gw):
        plain = request("POST", gw.url + "/v1/completions", raw=body, headers={"Content-Type": "text/plain"})
        form = request("POST", gw.url + "/v1/chat/completions", raw=b"a=b",
                       headers={"Content-Type": "application/x-www-form-urlencoded"})
        admin = request("PATCH", gw.url + "/admin/instances/a", raw=b'{"role": "decode"}',
                        headers={**AUTH, "Content-Type": "text/plain"})
        charset = request("POST", gw.url + "/v1/completions", raw=body,
                          headers={"Content-Type": "application/json; charset=utf-8"})
    for status, answer in (plain, form, admin):
        assert status == 415 and answer["error"]["code"] == "unsupported_media_type", (status, answer)
    assert "text/plain" in plain[1]["error"]["message"]
    assert charset[0] == 200
