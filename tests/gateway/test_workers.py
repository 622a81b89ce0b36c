"""``baton serve --workers 2`` as a user runs it: a supervisor, a control process and two
relay processes on one port, in front of a prefill and a decode emulator. Every answer is
exact; a relay killed mid-stream costs only its own streams and leaves nothing booked; a
control killed mid-stream costs none (the relays finish them and the new control books
them from the relays' hellos); a hung control makes the relays refuse new requests (503)
while their streams go on."""

from __future__ import annotations

import json
import os
import signal
import threading

import pytest

from baton.emulator.tokens import token_text
from tests.live import Stream, chunk_texts, get, metric, post, servers, start_emulator, start_gateway, wait_until

pytest.importorskip("zmq")
pytest.importorskip("msgpack")

TOKEN = "admin-token-for-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
IDS = [1, 2, 3, 4]  # a 4-token prompt given as ids: the emulator's answer follows from its length
RELAY_BITS = 40     # relay.ID_BITS: a request id's relay start number sits above these bits


def expected(n: int) -> str:
    return "".join(token_text(len(IDS) + i) for i in range(n))


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("workers")
    p = start_emulator(tmp, "--disaggregation-mode", "prefill")
    d = start_emulator(tmp, "--disaggregation-mode", "decode")
    engines = [{"name": "p0", "url": p.url, "role": "prefill"}, {"name": "d0", "url": d.url, "role": "decode"}]
    gw = start_gateway(tmp, {"engines": engines, "policy": "least-loaded", "workers": 2, "admin_token": TOKEN,
                             "scrape_interval_s": 0.2})
    with servers(p, d, gw):
        assert wait_until(lambda: len(workers(gw)["relays"]) == 2, 20), gw.log.read_text()[-2000:]
        yield gw


def admin(gw, path: str) -> dict | None:
    """An admin call; None when its connection met a relay that is going down (the kernel
    resets the connections a dead listener had not accepted yet) or control is away."""
    try:
        status, body = get(gw.url + path, headers=AUTH, timeout=5)
    except OSError:
        return None
    return body if status == 200 else None


def workers(gw) -> dict:
    return admin(gw, "/admin/workers") or {"relays": []}


def in_flight(gw) -> list[dict]:
    body = admin(gw, "/admin/requests")
    return [{"x_request_id": "?", "req_id": -1, "generated_tokens": 0}] * 99 if body is None else body["requests"]


def idle(gw) -> bool:
    body = admin(gw, "/admin/instances")
    return body is not None and all(v == 0 for v in body["in_flight"].values()) and not in_flight(gw)


def read_stream(gw, n: int, xid: str, out: dict) -> None:
    """One streamed request; ``out[xid]`` = (text, whether [DONE] came)."""
    try:
        s = Stream(gw.url + "/v1/completions", {"prompt": IDS, "max_tokens": n, "stream": True}, timeout=60,
                   headers={"X-Request-Id": xid})
        events, done = [], False
        for data in s.raw_events():
            if data == b"[DONE]":
                done = True
            else:
                events.append(json.loads(data))
        s.close()
        out[xid] = (chunk_texts(events), done)
    except OSError as err:
        out[xid] = (f"connection error: {err}", False)


def streams(gw, count: int, n: int, tag: str) -> tuple[list[threading.Thread], dict]:
    out: dict = {}
    threads = [threading.Thread(target=read_stream, args=(gw, n, f"{tag}-{i}", out)) for i in range(count)]
    for t in threads:
        t.start()
    return threads, out


def decoding(gw, count: int) -> bool:
    reqs = in_flight(gw)
    return len(reqs) == count and all(r["generated_tokens"] > 0 for r in reqs)


def test_two_relays_answer_exactly_and_share_one_control(gw):
    before = metric(gw.url, "baton_requests_total")
    results: dict = {}

    def one(i: int) -> None:
        if i % 2:
            read_stream(gw, 12, f"x-{i}", results)
        else:
            status, body = post(gw.url + "/v1/completions", {"prompt": IDS, "max_tokens": 12})
            results[f"x-{i}"] = (body["choices"][0]["text"] if status == 200 else str(body), True)
    threads = [threading.Thread(target=one, args=(i,)) for i in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == {f"x-{i}": (expected(12), True) for i in range(24)}
    _, log = get(gw.url + "/admin/decisions", headers=AUTH)
    relays = {e["req_id"] >> RELAY_BITS for e in log["decisions"]}
    assert len(relays) == 2, relays  # the kernel spread the connections over both relays
    assert metric(gw.url, "baton_requests_total") - before == 24  # both relays' counts, added up by control
    assert wait_until(lambda: idle(gw), 5)


def test_control_answers_a_relay_passes_through_are_counted_once(gw):
    """/health, /metrics and the admin API are control's: the relay that passes one on
    counted it too, so a probed gateway showed twice its responses with workers."""
    before = metric(gw.url, "baton_responses_total")
    for _ in range(10):
        assert get(gw.url + "/health")[0] == 200
    # the ten probes and the /metrics read that took ``before`` (counted once it was answered)
    assert metric(gw.url, "baton_responses_total") - before == 11


def test_clients_that_drop_their_streams_leave_no_traceback_in_the_log(gw):
    """A client gone mid-answer (a reset, before or during the stream, streamed or not) is
    one DEBUG line, not aiohttp's ERROR with a 40-line traceback per dropped request (which
    a relay's write to the reset connection used to reach)."""
    import socket
    import struct
    import time
    port = int(gw.url.rsplit(":", 1)[1])
    for stream in (True, False):
        body = json.dumps({"prompt": IDS * 100, "max_tokens": 300, "stream": stream}).encode()
        for delay in (0.0, 0.02, 0.3):
            for _ in range(3):
                s = socket.create_connection(("127.0.0.1", port))
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = reset
                s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          b"Content-Length: %d\r\n\r\n" % len(body) + body)
                time.sleep(delay)
                if stream and delay:
                    s.recv(100)
                s.close()
    assert wait_until(lambda: idle(gw), 15)
    text = gw.log.read_text()
    assert "Traceback" not in text and "Error handling request" not in text, text[-3000:]


def test_a_killed_relay_costs_only_its_own_streams_and_leaves_nothing_booked(gw):
    threads, out = streams(gw, 8, 400, "k")
    assert wait_until(lambda: decoding(gw, 8), 20)
    relays = workers(gw)["relays"]
    victim = max(relays, key=lambda r: r["requests"])
    gen = int(victim["identity"].rsplit("-", 1)[1])
    doomed = {r["x_request_id"] for r in in_flight(gw) if r["req_id"] >> RELAY_BITS == gen}
    assert doomed and len(doomed) < 8 or victim["requests"] == 8
    os.kill(victim["pid"], signal.SIGKILL)
    # control releases its requests within a second (the supervisor tells it)
    assert wait_until(lambda: {r["x_request_id"] for r in in_flight(gw)}.isdisjoint(doomed), 1.0)
    for t in threads:
        t.join(60)
    for xid, (text, done) in out.items():
        if xid in doomed:
            assert not done  # its client saw the connection close: no [DONE], never a wrong token
            assert expected(400).startswith(text) or text.startswith("connection error")
        else:
            assert (text, done) == (expected(400), True), xid
    assert wait_until(lambda: idle(gw), 5)
    # the supervisor started another relay in its place; it serves
    assert wait_until(lambda: len(workers(gw)["relays"]) == 2 and victim["pid"] not in
                      {r["pid"] for r in workers(gw)["relays"]}, 10)
    assert post(gw.url + "/v1/completions", {"prompt": IDS, "max_tokens": 5})[1]["choices"][0]["text"] == expected(5)


def test_a_killed_control_costs_no_stream_and_its_successor_books_them(gw):
    threads, out = streams(gw, 6, 400, "c")
    assert wait_until(lambda: decoding(gw, 6), 20)
    os.kill(workers(gw)["control_pid"], signal.SIGKILL)
    # the new control learns the streams from the relays' hellos and books them again
    assert wait_until(lambda: len(workers(gw)["relays"]) == 2 and len(in_flight(gw)) == 6, 10)
    for t in threads:
        t.join(60)
    assert out == {f"c-{i}": (expected(400), True) for i in range(6)}
    assert wait_until(lambda: idle(gw), 5)
    assert post(gw.url + "/v1/completions", {"prompt": IDS, "max_tokens": 5})[1]["choices"][0]["text"] == expected(5)


def test_a_hung_control_makes_relays_refuse_new_requests_while_streams_go_on(gw):
    threads, out = streams(gw, 4, 300, "h")
    assert wait_until(lambda: decoding(gw, 4), 20)
    control = workers(gw)["control_pid"]
    os.kill(control, signal.SIGSTOP)
    try:
        def refused() -> bool:
            status, body = post(gw.url + "/v1/completions", {"prompt": IDS, "max_tokens": 5}, timeout=5)
            return status == 503 and body["error"]["code"] == "control_unavailable"
        assert wait_until(refused, 5, 0.2)
        for t in threads:
            t.join(60)
        assert out == {f"h-{i}": (expected(300), True) for i in range(4)}
    finally:
        os.kill(control, signal.SIGCONT)
    assert wait_until(lambda: post(gw.url + "/v1/completions", {"prompt": IDS, "max_tokens": 5},
                                   timeout=5)[0] == 200, 10)
    assert wait_until(lambda: idle(gw), 5)
