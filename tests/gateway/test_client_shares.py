"""No client can take the gateway from the others (issue 55, finding 7): a client (an API
key, or an address without keys) holds at most ``max_inflight_per_client`` requests at
once, and a stream whose client reads nothing is dropped after ``client_write_timeout_s``
instead of holding its slot and its engine."""

from __future__ import annotations

import json
import socket
import time

from tests.live import Stream, get, metric, post, servers, start_fake, start_gateway, wait_until

TOKEN = "admin-token-for-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
IDS = [1, 2, 3, 4]


def in_flight(gw) -> int:
    return len(get(gw.url + "/admin/requests", headers=AUTH)[1]["requests"])


def test_one_client_holds_at_most_its_share_of_the_slots(tmp_path):
    fake = start_fake(tmp_path)
    gw = start_gateway(tmp_path, {"engines": [{"name": "a", "url": fake.url, "role": "mixed"}], "policy": "colocated",
                                  "admin_token": TOKEN, "api_keys": ["key-a", "key-b"], "max_inflight": 6,
                                  "max_inflight_per_client": 2, "token_timeout_min_s": 60})
    with servers(fake, gw):
        a = {"Authorization": "Bearer key-a"}
        held = [Stream(gw.url + "/v1/completions", {"prompt": IDS, "max_tokens": 9, "stream": True,
                                                    "user": "hang-after-3"}, headers=a) for _ in range(2)]
        try:
            assert all(s.status == 200 for s in held) and wait_until(lambda: in_flight(gw) == 2)
            status, body = post(gw.url + "/v1/completions", {"prompt": IDS, "max_tokens": 2}, headers=a)
            assert status == 429 and body["error"]["code"] == "client_inflight_cap"
            # another client (key) is not held back by the first one's streams
            status, body = post(gw.url + "/v1/completions", {"prompt": IDS, "max_tokens": 2},
                                headers={"Authorization": "Bearer key-b"})
            assert status == 200 and body["choices"][0]["text"] == " 4 5"
        finally:
            for s in held:
                s.close()
        assert wait_until(lambda: in_flight(gw) == 0, 10)
        status, _ = post(gw.url + "/v1/completions", {"prompt": IDS, "max_tokens": 2}, headers=a)
        assert status == 200  # its share came back with its streams' ends
        assert metric(gw.url, 'baton_rejected_total{reason="client_cap"}', AUTH) == 1


def test_a_stream_whose_client_reads_nothing_is_dropped(tmp_path):
    fake = start_fake(tmp_path)
    gw = start_gateway(tmp_path, {"engines": [{"name": "a", "url": fake.url, "role": "mixed"}], "policy": "colocated",
                                  "admin_token": TOKEN, "client_write_timeout_s": 1.0})
    with servers(fake, gw):
        sock = socket.create_connection(("127.0.0.1", gw.port))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        body = json.dumps({"prompt": IDS, "max_tokens": 1_000_000, "stream": True, "user": "flood"}).encode()
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        try:
            assert wait_until(lambda: in_flight(gw) == 1, 10)
            t0 = time.monotonic()
            assert wait_until(lambda: in_flight(gw) == 0, 30)  # not after the whole answer: it would take hours
            assert time.monotonic() - t0 < 20
        finally:
            sock.close()
        assert metric(gw.url, 'baton_requests_total{outcome="client_abort",path="colocated"}') == 1
        status, answer = post(gw.url + "/v1/completions", {"prompt": IDS, "max_tokens": 2})
        assert status == 200 and answer["choices"][0]["text"] == " 4 5"
