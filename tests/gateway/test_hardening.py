"""Gateway hardening, round 2 (engines that lie): each case failed on the code before it."""

from __future__ import annotations

import json
import math
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from baton.gateway.live import ScrapeSample
from baton.gateway.scrape import implausible
from tests.gateway.test_chaos import AUTH, FAST, IDS, expected, idle
from tests.live import get, metric, post, request, servers, start_emulator, start_fake, start_gateway, wait_until


@pytest.mark.parametrize("sample,reason", [
    (ScrapeSample(0.0, running=3, waiting=0, kv_usage=0.4), None),
    (ScrapeSample(0.0), None),  # an engine without these metrics
    (ScrapeSample(0.0, kv_usage=math.nan), "kv_usage is nan"),
    (ScrapeSample(0.0, kv_usage=math.inf), "kv_usage is inf"),
    (ScrapeSample(0.0, kv_usage=1.5), "kv_usage out of range (1.5)"),
    (ScrapeSample(0.0, running=-1), "running out of range (-1)"),
    (ScrapeSample(0.0, waiting=-math.inf), "waiting is -inf"),
])
def test_implausible_scraped_values_are_named(sample, reason):
    assert implausible(sample) == reason


def test_nan_or_inf_engine_metrics_neither_fail_requests_nor_leak_slots(tmp_path):
    """N1: with kv_cache_usage_perc NaN on one engine and +Inf on the other, every
    request placed on them got a 500, its cleanup raised, and the leaked flows filled
    ``max_inflight`` for good (429 for everyone, even after the metric was normal)."""
    a, b = start_fake(tmp_path), start_fake(tmp_path)
    engines = [{"name": "a", "url": a.url, "role": "mixed"}, {"name": "b", "url": b.url, "role": "mixed"}]
    gw = start_gateway(tmp_path, {**FAST, "engines": engines, "policy": "colocated", "max_inflight": 4})
    with servers(a, b, gw):
        for engine, value in ((a, "NaN"), (b, "+Inf")):
            post(engine.url + "/fake/metrics-values", {"kv_cache_usage_perc": value})
        time.sleep(3 * FAST["scrape_interval_s"])  # both engines scraped since
        answers = [post(gw.url + "/v1/completions", {"prompt": IDS, "max_tokens": 5}) for _ in range(8)]
        for engine in (a, b):
            post(engine.url + "/fake/metrics-values", {"kv_cache_usage_perc": "0.25"})
        assert wait_until(lambda: idle(gw), timeout_s=5)
        after = post(gw.url + "/v1/completions", {"prompt": IDS, "max_tokens": 5})
        rejected = metric(gw.url, 'baton_scrapes_total{engine="b",result="rejected"}')
        log = gw.log.read_text()
    assert [status for status, _ in answers] == [200] * 8
    assert all(body["choices"][0]["text"] == expected(4, 5) for _, body in answers)
    assert after[0] == 200
    assert rejected >= 1
    assert "Traceback" not in log and log.count("scraped metrics rejected (kv_usage is nan)") == 1


def test_the_admin_api_sends_no_environment_variable_outside_the_allowlist(tmp_path):
    """N9: ``POST /admin/instances`` with ``api_key_env`` sent any of the gateway's
    environment variables as a bearer token to any URL, and its error told whether a
    variable existed. Only ``admin_env_allowlist`` names are read now, with one error for
    every other name, set or not."""
    a, sink = start_fake(tmp_path), start_fake(tmp_path)
    env = {"BATON_SECRET": "s3cret", "ENGINE_KEY": "k3y"}
    gw = start_gateway(tmp_path, {**FAST, "engines": [{"name": "a", "url": a.url, "role": "mixed"}],
                                  "policy": "colocated", "admin_env_allowlist": ["ENGINE_KEY", "UNSET_KEY"]}, env)
    add = lambda name, var: post(gw.url + "/admin/instances", {"name": name, "url": sink.url, "role": "mixed",  # noqa: E731
                                                               "api_key_env": var}, headers=AUTH)
    with servers(a, sink, gw):
        secret, missing = add("x", "BATON_SECRET"), add("y", "NOT_SET_ANYWHERE")
        unset = add("z", "UNSET_KEY")
        allowed = add("ok", "ENGINE_KEY")
        assert request("DELETE", gw.url + "/admin/instances/a", headers=AUTH)[0] == 200  # all to "ok" now
        assert post(gw.url + "/v1/completions", {"prompt": IDS, "max_tokens": 2})[0] == 200
        seen = {r["headers"].get("Authorization") for r in get(sink.url + "/fake/requests")[1]}
    assert secret[0] == missing[0] == unset[0] == 400
    assert secret[1]["error"]["message"].replace("BATON_SECRET", "V") == \
        missing[1]["error"]["message"].replace("NOT_SET_ANYWHERE", "V")
    assert "s3cret" not in str(secret[1]) and allowed[0] == 201
    assert seen == {"Bearer k3y"}  # the allowed key, and never the secret


def test_an_engines_absurd_prompt_count_is_bounded(tmp_path):
    """N6: a prefill engine's ``usage.prompt_tokens`` of 10^10 was taken as the prompt's
    length; the decode leg's first-token deadline then costed a 10^10-token prefill on the
    event loop (O(n): seconds of stall for every request). Engine numbers are clamped to
    what the request can be, and the deadline is O(1) in the context length."""
    p, d = start_fake(tmp_path), start_fake(tmp_path)
    engines = [{"name": "p", "url": p.url, "role": "prefill"}, {"name": "d", "url": d.url, "role": "decode"}]
    gw = start_gateway(tmp_path, {**FAST, "engines": engines, "policy": "least-loaded"})
    with servers(p, d, gw):
        by_ids = post(gw.url + "/v1/completions", {"prompt": IDS, "max_tokens": 3, "user": "huge-usage"}, timeout=3)
        by_text = post(gw.url + "/v1/completions", {"prompt": "a b c d", "max_tokens": 3, "user": "huge-usage"},
                       timeout=3)
        assert wait_until(lambda: idle(gw), timeout_s=5)
    assert by_ids[0] == by_text[0] == 200
    assert by_ids[1]["usage"]["prompt_tokens"] == len(IDS)
    assert by_text[1]["usage"]["prompt_tokens"] <= 131072


HEAD_ONLY = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             b"Content-Length: 100\r\n\r\n{")


def _tricklers(port: int, n: int) -> list[socket.socket]:
    """``n`` connections from another loopback address that send a head and one byte of
    a 100-byte body, then nothing."""
    out = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=("127.0.0.2", 0))
        s.sendall(HEAD_ONLY)
        out.append(s)
    return out


def _answers(socks: list[socket.socket], wait_s: float) -> list[bytes]:
    """The status line each trickling connection got (b"" if none within ``wait_s``)."""
    got = []
    for s in socks:
        s.settimeout(wait_s)
        try:
            got.append(s.recv(64).split(b"\r\n", 1)[0])
        except OSError:
            got.append(b"")
        s.close()
    return got


def test_slow_bodies_cannot_lock_other_clients_out(tmp_path):
    """N5: connections still sending their body counted towards ``max_inflight``; a few
    trickling connections made every legitimate request a 429. Now only requests whose
    body arrived count; bodies still arriving after ``slow_body_after_s`` are slow and
    capped apart, per client address too (429 for that address's next slow body)."""
    a = start_fake(tmp_path)
    gw = start_gateway(tmp_path, {**FAST, "body_timeout_s": 5.0, "engines": [{"name": "a", "url": a.url,
                                  "role": "mixed"}], "policy": "colocated", "max_inflight": 8,
                                  "max_body_reads_per_client": 4, "slow_body_after_s": 0.2,
                                  "min_body_bytes_per_s": 0.01})  # they stay slow, not dropped
    with servers(a, gw):
        first = _tricklers(gw.port, 6)
        time.sleep(0.5)  # all six turned slow: four fill that address's cap of 4
        later = _tricklers(gw.port, 4)
        answers = [post(gw.url + "/v1/completions", {"prompt": IDS, "max_tokens": 2}) for _ in range(10)]
        refused = _answers(later, 1.0)
        kept = _answers(first, 0.2)
        rejected = metric(gw.url, 'baton_rejected_total{reason="body_reads"}')
    assert [status for status, _ in answers] == [200] * 10
    assert refused == [b"HTTP/1.1 429 Too Many Requests"] * 4
    # the six turned slow together: four fit the address's cap and are still waited for
    # (5 s body timeout), two are refused as they turn slow
    assert sorted(kept) == [b""] * 4 + [b"HTTP/1.1 429 Too Many Requests"] * 2 and rejected == 6


def test_bodies_trickling_from_many_addresses_give_way_to_a_faster_one(tmp_path):
    """Round 3, MEDIUM 9: slow bodies from 8 or more addresses filled the gateway's cap of
    slow bodies and every other slow body was refused. At the cap a body turning slow now
    takes the place of the slowest one when it arrives faster (that one gets 408)."""
    a = start_fake(tmp_path)
    gw = start_gateway(tmp_path, {**FAST, "body_timeout_s": 5.0, "engines": [{"name": "a", "url": a.url,
                                  "role": "mixed"}], "policy": "colocated", "max_body_reads": 8,
                                  "max_body_reads_per_client": 4, "slow_body_after_s": 0.2,
                                  "min_body_bytes_per_s": 0.01})  # tricklers are not dropped for their rate
    body = json.dumps({"prompt": IDS, "max_tokens": 2, "user": " " * 2000}).encode()
    with servers(a, gw):
        attackers = []
        for k in range(8):  # one trickling body from each of eight addresses: the cap is full
            s = socket.create_connection(("127.0.0.1", gw.port), timeout=5, source_address=(f"127.0.0.{2 + k}", 0))
            s.sendall(HEAD_ONLY)
            attackers.append(s)
        time.sleep(0.6)
        legit = socket.create_connection(("127.0.0.1", gw.port), timeout=10)
        legit.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      + f"Content-Length: {len(body)}\r\n\r\n".encode())
        for i in range(0, len(body), len(body) // 10 + 1):  # about 0.6 s of a steady body
            legit.sendall(body[i:i + len(body) // 10 + 1])
            time.sleep(0.06)
        status = legit.recv(64).split(b"\r\n", 1)[0]
        legit.close()
        others = _answers(attackers, 0.5)
    assert status == b"HTTP/1.1 200 OK"
    assert sorted(others) == [b""] * 7 + [b"HTTP/1.1 408 Request Timeout"]  # the slowest gave way


def test_a_body_arriving_too_slowly_is_dropped_early(tmp_path):
    """A trickling body holds its connection only until its rate is judged (after
    ``slow_body_after_s``), not for the whole ``body_timeout_s``: 408, and the slot is free."""
    a = start_fake(tmp_path)
    gw = start_gateway(tmp_path, {**FAST, "body_timeout_s": 30.0, "engines": [{"name": "a", "url": a.url,
                                  "role": "mixed"}], "policy": "colocated", "slow_body_after_s": 0.3})
    with servers(a, gw):
        t0 = time.monotonic()
        got = _answers(_tricklers(gw.port, 8), 5.0)
        took_s = time.monotonic() - t0
        dropped = metric(gw.url, 'baton_rejected_total{reason="slow_body"}')
        after = post(gw.url + "/v1/completions", {"prompt": IDS, "max_tokens": 2})
    assert got == [b"HTTP/1.1 408 Request Timeout"] * 8 and dropped == 8
    assert took_s < 3.0 and after[0] == 200


def test_a_burst_from_one_address_is_not_refused(tmp_path):
    """Behind a load balancer every client has one address: bodies that arrived with their
    head count towards no cap (the per-client cap refused 90 of 192 in a 64-burst before)."""
    a = start_fake(tmp_path)
    gw = start_gateway(tmp_path, {**FAST, "engines": [{"name": "a", "url": a.url, "role": "mixed"}],
                                  "policy": "colocated", "max_body_reads_per_client": 2, "max_body_reads": 2})
    with servers(a, gw), ThreadPoolExecutor(64) as pool:
        answers = list(pool.map(lambda _: post(gw.url + "/v1/completions", {"prompt": IDS, "max_tokens": 2}),
                                range(192)))
    assert [status for status, _ in answers] == [200] * 192


def test_a_burst_queued_on_one_prefill_engine_is_not_taken_for_a_hang(tmp_path):
    """N10: the first-token deadline ignored the queue ahead, so a burst on a busy
    prefill engine timed out the later prefills (the engine declared hung, 503s). The
    deadline now includes the prefill work the gateway has queued on that instance."""
    p, d = start_emulator(tmp_path), start_emulator(tmp_path)
    engines = [{"name": "p", "url": p.url, "role": "prefill"}, {"name": "d", "url": d.url, "role": "decode"}]
    gw = start_gateway(tmp_path, {**FAST, "engines": engines, "policy": "least-loaded", "admin_token": "admin-token-for-tests"})
    body = {"prompt": list(range(1000, 3000)), "max_tokens": 2}
    with servers(p, d, gw), ThreadPoolExecutor(40) as pool:
        answers = list(pool.map(lambda _: post(gw.url + "/v1/completions", body, timeout=60), range(40)))
        timeouts = metric(gw.url, 'baton_backend_errors_total{engine="p",kind="timeout"}')
    assert [status for status, _ in answers] == [200] * 40
    assert timeouts == 0


def test_failed_admin_logins_lock_an_address_out_and_the_gateway_is_no_engine_of_its_own(tmp_path):
    """Round 3, LOW: the admin token could be guessed at any speed, and an engine could be
    added at the gateway's own address (a request would then loop through it)."""
    a = start_fake(tmp_path)
    gw = start_gateway(tmp_path, {**FAST, "engines": [{"name": "a", "url": a.url, "role": "mixed"}],
                                  "policy": "colocated"})
    with servers(a, gw):
        for url in (gw.url, f"http://localhost:{gw.port}", f"http://0.0.0.0:{gw.port}"):
            status, body = post(gw.url + "/admin/instances", {"name": "me", "url": url, "role": "mixed"},
                                headers=AUTH)
            assert status == 400 and "the gateway's own address" in body["error"]["message"], body
        wrong = {"Authorization": "Bearer guess"}
        assert [get(gw.url + "/admin/instances", headers=wrong)[0] for _ in range(10)] == [401] * 10
        status, body = get(gw.url + "/admin/instances", headers=wrong)
        assert status == 429 and body["error"]["code"] == "admin_login_locked"
        assert get(gw.url + "/admin/instances", headers=AUTH)[0] == 429  # locked, right token or not
        assert post(gw.url + "/v1/completions", {"prompt": IDS, "max_tokens": 2})[0] == 200  # clients unaffected
