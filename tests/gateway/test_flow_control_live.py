"""Flow control live (``gateway.gate``, issue 51) on a real gateway process and a fake
engine on 127.0.0.1: requests wait while the engine is saturated (by the gateway's own
bookings: prompts queued and not yet prefilled) and leave in band order; one whose client
leaves is withdrawn; one held past the time to live gets 429 with ``Retry-After``; class
headers the config forbids are a 400; the by-class figures appear on ``/metrics``.

The fake engine's ``hang-after-0`` mode holds a stream before its first token, so its
prompt stays queued: with ``max_queued_prefill_tokens`` equal to one prompt, one such
request saturates the engine."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from tests.live import get, metric, post, servers, start_fake, start_gateway, wait_until

TOKEN = "admin-token-for-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
IDS = [1, 2, 3, 4]  # four prompt tokens: one request fills max_queued_prefill_tokens
TIMEOUT = aiohttp.ClientTimeout(total=30)
ANYONE = {"Authorization": "Bearer kz"}  # a client key of no tenant (tenants' keys make keys required)


def config(fake, **flow) -> dict:
    return {"engines": [{"name": "a", "url": fake.url, "role": "mixed"}], "policy": "colocated",
            "admin_token": TOKEN, "api_keys": ["kz"], "first_token_timeout_base_s": 60, "token_timeout_min_s": 60,
            "classes": {"client_headers": "all",
                        "objectives": {"interactive": {"priority": 5, "ttft_slo_ms": 60000}},
                        "tenants": {"team-a": {"api_keys": ["ka"], "objective": "interactive"}}},
            "flow_control": {"enabled": True, "max_queued_prefill_tokens": len(IDS), "fairness": "none", **flow}}


def held(gw) -> float:
    return sum(metric(gw.url, f'baton_flow_held{{band="{b}"}}', AUTH) for b in ("0", "5"))


def in_flight(gw) -> dict[str, int]:
    """X-Request-Id -> request id of the requests in flight."""
    return {r["x_request_id"]: r["req_id"] for r in get(gw.url + "/admin/requests", headers=AUTH)[1]["requests"]}


def placed(gw) -> list[int]:
    """Request ids in the order the policy placed them."""
    return [d["req_id"] for d in get(gw.url + "/admin/decisions", headers=AUTH)[1]["decisions"]
            if d["kind"] == "prefill"]


async def send(url: str, user: str, headers: dict | None = None) -> tuple[int, dict, str]:
    body = {"prompt": IDS, "max_tokens": 2, "stream": True, "user": user}
    async with aiohttp.ClientSession(timeout=TIMEOUT) as s, \
            s.post(url + "/v1/completions", json=body, headers={**ANYONE, **(headers or {})}) as resp:
        return resp.status, dict(resp.headers), await resp.text()


async def until(pred, timeout_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await asyncio.to_thread(pred):
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("workers", [1, 2])
def test_held_in_band_order_withdrawn_when_the_client_leaves_and_shed_past_the_ttl(tmp_path, workers):
    fake = start_fake(tmp_path)
    gw = start_gateway(tmp_path, {**config(fake, ttl_s=2.0), "workers": workers})

    async def run() -> None:
        first = asyncio.ensure_future(send(gw.url, "hang-after-0"))  # placed: it saturates the engine
        await until(lambda: len(placed(gw)) == 1)
        low = asyncio.ensure_future(send(gw.url, "hang-after-0", {"x-baton-priority": "0", "X-Request-Id": "low"}))
        await until(lambda: held(gw) == 1)
        leaves = asyncio.ensure_future(send(gw.url, "hang-after-0"))
        await until(lambda: held(gw) == 2)
        high = asyncio.ensure_future(send(gw.url, "ok", {"Authorization": "Bearer ka"}))  # team-a: band 5
        await until(lambda: held(gw) == 3)
        leaves.cancel()  # its client leaves while it is held: withdrawn, never placed
        await until(lambda: held(gw) == 2)
        first.cancel()  # the engine has room again: the high band goes first
        status, _, text = await asyncio.wait_for(high, 10)
        assert status == 200 and "[DONE]" in text
        # the one that left while held was never placed; the high band went before the low one
        await until(lambda: len(placed(gw)) == 3)
        order, low_id = placed(gw), in_flight(gw)["low"]
        assert order.index(low_id) == 2 and order[1] != low_id
        # request 1 (low) now hangs on the engine; a new low-band request waits past the TTL
        status, headers, text = await asyncio.wait_for(send(gw.url, "ok"), 10)
        assert status == 429 and headers.get("Retry-After") == "1" and '"code": "shed"' in text.replace(
            '":"', '": "')
        low.cancel()
    with servers(fake, gw):
        asyncio.run(run())
        assert wait_until(lambda: held(gw) == 0 and not get(gw.url + "/admin/requests", headers=AUTH)[1]["requests"])
        assert metric(gw.url, 'baton_rejected_total{reason="shed"}', AUTH) == 1
        assert metric(gw.url, 'baton_class_shed_total{band="0",tenant="none"}', AUTH) == 1
        assert metric(gw.url, 'baton_class_requests_total{band="5",outcome="ok",tenant="team-a"}', AUTH) == 1
        assert metric(gw.url, 'baton_class_slo_met_total{band="5",tenant="team-a"}', AUTH) == 1
        assert metric(gw.url, 'baton_class_requests_total{band="0",outcome="client_abort",tenant="none"}',
                      AUTH) == 3


def test_a_class_header_the_config_forbids_is_a_400(tmp_path):
    fake = start_fake(tmp_path)
    cfg = config(fake)
    cfg["classes"]["client_headers"] = "objective"
    gw = start_gateway(tmp_path, cfg)
    with servers(fake, gw):
        status, body = post(gw.url + "/v1/completions", {"prompt": IDS, "max_tokens": 2},
                            headers={**ANYONE, "x-baton-priority": "9"})
        assert status == 400 and body["error"]["code"] == "class_header_forbidden"
        assert "x-baton-priority" in body["error"]["message"]
        status, body = post(gw.url + "/v1/completions", {"prompt": IDS, "max_tokens": 2},
                            headers={**ANYONE, "x-baton-objective": "interactive"})
        assert status == 200 and body["choices"][0]["text"] == " 4 5"
        assert metric(gw.url, 'baton_class_requests_total{band="5",outcome="ok",tenant="none"}', AUTH) == 1
