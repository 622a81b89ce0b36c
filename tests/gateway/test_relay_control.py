"""The pieces of ``baton serve --workers N`` without processes: a relay's steps and their
batching (``relay_control``), control's side applying them and answering calls (``hub``),
and the relays' counts added into control's /metrics. The processes themselves are in
``test_workers.py``, every policy through them in the conformance suite."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client.parser import text_string_to_metric_families

from baton.core.instance import Role
from baton.core.request import Phase
from baton.gateway import ipc
from baton.gateway.hub import ControlHub, RelayFlow
from baton.gateway.metrics import GatewayMetrics
from baton.gateway.relay_control import Link, RelayCluster
from baton.gateway.upstream import UpstreamError
from baton.protocol.errors import ApiError
from tests.gateway.test_control import make

pytest.importorskip("msgpack")


class Wire:
    """A socket that keeps what is sent (relay side: frames; control side: (relay, frame))."""

    def __init__(self) -> None:
        self.sent: list = []

    def send(self, frame: bytes) -> None:
        self.sent.append(ipc.unpack(frame))

    def send_multipart(self, parts: list[bytes]) -> None:
        self.sent.append((parts[0], ipc.unpack(parts[1])))


def link(up: bool = True) -> Link:
    out = Link("ipc://unused", b"relay-0-1", 0.005, lambda m: None, lambda: [0, 1, 4242, []])
    out.sock, out.up = Wire(), up
    return out


def relay_cluster(lk: Link) -> RelayCluster:
    cluster = RelayCluster(lk, 1 << 40, 1000, 16, 1.0)
    from baton.gateway.config import EngineSpec
    for spec in (EngineSpec("http://p:1", Role.PREFILL, "p0"), EngineSpec("http://d:1", Role.DECODE, "d0"),
                 EngineSpec("http://d:2", Role.DECODE, "d1")):
        cluster.add_engine(spec)
    return cluster


def test_a_move_made_of_other_steps_is_one_step_on_the_wire():
    async def go():
        lk = link()
        cluster = relay_cluster(lk)
        st = cluster.new_request(100, 10)
        cluster.bind(st, 0, 1, None)  # placement is control's answer: applied here, not sent
        cluster.prefill_done(st)
        cluster.expect_decode(st, 1)
        cluster.start_decode(st)
        cluster.move_decode(st, 2)  # leave_decode + expect_decode inside: one "md"
        assert lk.ops == [["ed", st.req_id, 1], ["sd", st.req_id], ["md", st.req_id, 2]]
        assert st.req_id >= 1 << 40 and st.decode_instance == 2 and st.phase is Phase.TRANSFER
    asyncio.run(go())


def test_decode_progress_is_summed_and_goes_before_the_same_requests_next_step():
    async def go():
        lk = link()
        lk.tokens(7, 3)
        lk.tokens(7, 2)
        lk.tokens(8, 1)
        lk.op("end", 7, "ok", 5, True)
        assert lk.ops == [["tk", 7, 5], ["end", 7, "ok", 5, True]]
        lk.flush()
        assert lk.sock.sent == [["ops", [["tk", 7, 5], ["end", 7, "ok", 5, True], ["tk", 8, 1]]]]
    asyncio.run(go())


def test_steps_wait_while_control_is_silent_and_a_new_control_gets_a_hello_instead():
    async def go():
        lk = link(up=False)
        lk.epoch = 1
        lk.op("end", 7, "ok", 5, True)
        lk.flush()
        assert lk.sock.sent == [] and lk.ops  # kept: a control that was only hung needs them
        with pytest.raises(ApiError) as err:
            await lk.call("pick_decode", 7, [])
        assert err.value.status == 503 and err.value.code == "control_unavailable"
        lk._handle(["snap", 1, 0.0, False, False, [], [], []])  # the same control answers again
        assert lk.up and lk.sock.sent == [["ops", [["end", 7, "ok", 5, True]]]]
        lk.up, lk.sock.sent = False, []
        lk.op("end", 8, "ok", 5, True)
        lk._handle(["snap", 2, 0.0, False, False, [], [], []])  # another control: a hello, the steps dropped
        assert lk.sock.sent == [["hi", 0, 1, 4242, []]] and not lk.ops
    asyncio.run(go())


def test_relays_counts_add_to_controls_series():
    control, relay = GatewayMetrics(), GatewayMetrics()
    control.requests.labels("pd", "ok").inc(2)
    relay.requests.labels("pd", "ok").inc(3)
    relay.requests.labels("colocated", "error").inc()
    relay.ttft.labels("pd").observe(0.05)
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value
           for fam in text_string_to_metric_families(control.render(relay.counts()).decode()) for s in fam.samples}
    assert got[("baton_requests_total", (("outcome", "ok"), ("path", "pd")))] == 5
    assert got[("baton_requests_total", (("outcome", "error"), ("path", "colocated")))] == 1
    assert got[("baton_ttft_seconds_count", (("path", "pd"),))] == 1
    assert got[("baton_ttft_seconds_bucket", (("le", "0.08"), ("path", "pd")))] == 1


# --- control's side ------------------------------------------------------------------------------
def hub_with_control():
    control, cluster, clock = make()
    hub = ControlHub(control, "ipc://unused")
    hub.sock = Wire()
    return hub, control, cluster


def answers(hub) -> list:
    hub._drain()
    return [m for _, frame in hub.sock.sent for m in (frame[1] if frame[0] == "many" else [frame])
            if m[0] == "ret"]


def test_control_acts_only_on_relays_that_said_hello_in_its_epoch():
    async def go():
        hub, control, cluster = hub_with_control()
        hub._handle(b"r", ["ops", [["call", 0, "place", 1 << 40, "x", 0.0, 100, 10, []]]])
        assert not cluster.requests  # not booked: the relay has not introduced itself
        hub._drain()
        sent = [m for _, f in hub.sock.sent for m in (f[1] if f[0] == "many" else [f])]
        assert {m[0] for m in sent} == {"snap", "ret"}  # its hello follows the snapshot
        (ret,) = [m for m in sent if m[0] == "ret"]
        assert ret[:3] == ["ret", 0, False] and ret[3][4] == "control_unavailable"
        hub.relays[b"r"].asked_s -= 1.0  # still no hello a while later (one control took for gone): asked
        hub._handle(b"r", ["hb"])
        hub._drain()
        assert hub.sock.sent[-1] == (b"r", ["hello?"])
    asyncio.run(go())


def test_a_relays_request_is_placed_stepped_and_released_in_control():
    async def go():
        hub, control, cluster = hub_with_control()
        hub._handle(b"r", ["hi", 0, 1, 4242, []])
        rid = 1 << 40
        hub._handle(b"r", ["ops", [["call", 0, "place", rid, "x", 0.0, 100, 10, []]]])
        (ret,) = answers(hub)
        assert ret[:3] == ["ret", 0, True] and isinstance(control.flows[rid], RelayFlow)
        p = ret[3][0]
        hub._handle(b"r", ["ops", [["bp", rid], ["pd", rid, p], ["call", 1, "pick_decode", rid, []]]])
        d = answers(hub)[-1][3]
        hub._handle(b"r", ["ops", [["ed", rid, d], ["sd", rid], ["tk", rid, 4]]])
        st = cluster.requests[rid]
        assert st.phase is Phase.DECODE and st.generated_tokens == 4 and rid in cluster.instances[d].decodes
        hub._handle(b"r", ["ops", [["be", d, ipc.upstream_fields(UpstreamError("x", connect=True)), True]]])
        assert control.metrics.registry.get_sample_value(
            "baton_backend_errors_total", {"engine": cluster.engines[d].spec.name, "kind": "connect"}) == 1
        hub._handle(b"r", ["ops", [["end", rid, "ok", 4, True]]])
        assert rid not in cluster.requests and rid not in control.flows and not cluster.totals()["decodes"]
    asyncio.run(go())


def test_a_relay_gone_releases_its_requests_and_a_new_control_books_them_from_a_hello():
    async def go():
        hub, control, cluster = hub_with_control()
        decoding = [1 << 40, "a", "pd", 0.0, 100, 10, 0, 2, Phase.DECODE.value, 3, False]
        queued = [(1 << 40) + 1, "b", "pd", 0.0, 50, 10, 0, None, Phase.WAITING.value, 0, True]
        hub._handle(b"r", ["hi", 0, 1, 4242, [decoding, queued]])  # a restarted control learns them
        assert cluster.requests[1 << 40].generated_tokens == 3 and (1 << 40) in cluster.instances[2].decodes
        assert (1 << 40) + 1 in cluster.instances[0].prefill_queue
        assert all(control.flows[r].adopted for r in cluster.requests)
        hub.relay_gone(b"r", "exited")
        assert not cluster.requests and not control.flows and not any(cluster.totals().values())
        assert control.metrics.registry.get_sample_value(
            "baton_requests_total", {"path": "pd", "outcome": "relay_lost"}) == 2
    asyncio.run(go())


def test_a_relay_learns_what_controls_scrapes_found():
    """Model names and context lengths come from the engines' /v1/models, which control
    reads: a relay needs them for its legs' bodies and a continuation's budget."""
    from baton.gateway.config import parse_config
    from baton.gateway.relay import Relay
    config = parse_config({"workers": 2, "engines": [{"name": "a", "url": "http://127.0.0.1:1", "role": "mixed"}]})
    relay = Relay(config, 0, 3, "ipc://unused", "http://127.0.0.1:2")
    relay._on_message(["snap", 1, 0.0, True, True, [[0, False, "decode", False, 40, 0.02]], [], [[0, "m7", 4096]]])
    assert relay.engines.names.by_engine == {0: "m7"} and relay.engines.names.context_tokens == {0: 4096}
    assert relay.engines.names.accepts("m7") and relay.needs_prefix_keys and relay.cluster.hold_enabled
    assert not relay.cluster.healthy(0) and relay.cluster.role(0) is Role.DECODE
    assert relay.cluster.pending_tokens(0) == 40 and relay.cluster.token_interval_s(0) == 0.02


def test_the_counts_of_a_relay_that_died_stay_in_controls_metrics():
    async def go():
        hub, control, cluster = hub_with_control()
        hub._handle(b"r", ["hi", 0, 1, 4242, []])
        counts = [["baton_requests", "baton_requests_total", {"path": "pd", "outcome": "ok"}, 7.0]]
        hub._handle(b"r", ["metrics", -1, counts])  # pushed unasked every ipc.COUNTS_S
        hub.relay_gone(b"r", "exited")
        assert await hub.relay_samples() == counts  # no relay left to ask: what it had counted
        text = control.metrics.render(await hub.relay_samples()).decode()
        assert 'baton_requests_total{outcome="ok",path="pd"} 7.0' in text
    asyncio.run(go())


def test_calls_asked_of_a_control_that_restarted_fail_instead_of_waiting_forever():
    """A control that died and came back within a second (before the relay noticed the
    silence) will never answer what its predecessor was asked: those calls fail (503)."""
    async def go():
        lk = link()
        lk.epoch = 1
        call = asyncio.create_task(lk.call("admit_prefill", 7, 0))  # a held prefill, waiting
        await asyncio.sleep(0)
        lk._handle(["snap", 2, 0.0, False, False, [], [], []])  # a new control's first snapshot
        with pytest.raises(ApiError) as err:
            await asyncio.wait_for(call, 1.0)
        assert err.value.status == 503 and lk.sock.sent[-1][0] == "hi"
    asyncio.run(go())


def test_snapshots_carry_the_engines_specs_only_when_engines_joined():
    """Every 50 ms a snapshot goes to every relay: with hundreds of engines their specs
    would be most of it, so they go once, and again when an engine joins."""
    async def go():
        hub, control, cluster = hub_with_control()
        hub._handle(b"r", ["hb"])
        hub._snapshot_to(b"r")
        hub._drain()
        snaps = [m for _, f in hub.sock.sent for m in (f[1] if f[0] == "many" else [f]) if m[0] == "snap"]
        assert len(snaps[0][6]) == len(cluster.engines) and snaps[-1][6] == []
        from baton.gateway.config import EngineSpec
        cluster.add_engine(EngineSpec("http://d:9", Role.DECODE, "d9"))
        hub._snapshot_to(b"r")
        hub._drain()
        assert [s["name"] for s in hub.sock.sent[-1][1][6]][-1] == "d9"
    asyncio.run(go())


def test_a_404_on_a_relays_leg_makes_control_ask_the_engine_its_name_again():
    """An engine restarted under another model name answers 404: control owns the names
    (its snapshots carry them to the relays every 50 ms), so the relay asks control to
    forget and ask again; a relay that only forgot its own copy got the old name back
    from the next snapshot, and every leg to that engine failed until a restart."""
    async def go():
        from baton.gateway.config import parse_config
        from baton.gateway.relay import Relay
        config = parse_config({"workers": 2, "engines": [{"name": "a", "url": "http://127.0.0.1:1", "role": "mixed"}]})
        relay = Relay(config, 0, 3, "ipc://unused", "http://127.0.0.1:2")
        relay.link.sock, relay.link.up = Wire(), True
        relay._on_message(["snap", 1, 0.0, False, False, [[0, True, "mixed", False, 0, 0.0]], [], [[0, "old", 4096]]])
        relay.engines.rediscover(0)  # what a leg's 404 calls (gateway.faults)
        assert 0 not in relay.engines.names.by_engine and ["rd", 0] in relay.link.ops
        relay.close_parsers()

        asked = []
        control, cluster, clock = make()
        hub = ControlHub(control, "ipc://unused", rediscover=asked.append)
        hub.sock = Wire()
        hub._handle(b"r", ["hi", 0, 1, 4242, []])
        hub._handle(b"r", ["ops", [["rd", 1]]])
        assert asked == [1]
        plain = ControlHub(control, "ipc://unused")  # without an engines object: the name is forgotten
        plain.names.by_engine[1] = "old"
        plain.sock = Wire()
        plain._handle(b"r", ["hi", 0, 1, 4242, []])
        plain._handle(b"r", ["ops", [["rd", 1]]])
        assert 1 not in plain.names.by_engine
    asyncio.run(go())
