"""Prefix-aware routing live: the KV-event index (stores chained from token ids whatever the
engine's hashes, removals, gaps and over-capacity resyncs), the feed surviving anything a
peer sends, and a gateway in front of two emulators that publish KV events, where requests
sharing a prefix follow the instance that caches it and the engine's own counters agree."""

import time

import pytest

from baton.core.prefix import token_block_keys
from baton.gateway.kv_index import KvEventIndex
from baton.protocol.kv_events import KvEvent, KvEventBatch, encode_batch
from tests.live import (Stream, decision_log, free_port, get, metric, post, servers, start_emulator, start_gateway,
                        wait_until)

TOKENS = list(range(1000, 1064))  # four blocks of 16


def _stored(hashes, parent, tokens):
    return KvEvent("BlockStored", tuple(hashes), parent, tuple(tokens), 16)


def _index(capacity=100):
    idx = KvEventIndex()
    idx.add_engine(0, capacity, 16)
    idx.add_engine(1, capacity, 16)
    return idx


def test_stores_are_keyed_by_their_tokens_whatever_the_engine_hashes():
    idx = _index()
    keys = token_block_keys(TOKENS, 16)
    idx.apply(0, 0, KvEventBatch(0.0, [_stored((901, 902), None, TOKENS[:32])]), 0.0)
    idx.apply(0, 1, KvEventBatch(0.0, [_stored((903,), 902, TOKENS[32:48])]), 0.0)  # chained by parent hash
    idx.apply(1, 0, KvEventBatch(0.0, [_stored(("a",), None, TOKENS[:16])]), 0.0)  # other hashes, same key
    assert idx.matches(keys) == {0: 3, 1: 1}
    idx.apply(0, 2, KvEventBatch(0.0, [KvEvent("BlockRemoved", (902,))]), 0.0)
    assert idx.matches(keys) == {0: 1, 1: 1}  # block 3 is still held but no longer reachable as a prefix
    assert idx.blocks(0) == 2


def test_gaps_orphans_clears_and_overflow_resync_the_engine_only():
    idx = _index(capacity=3)
    idx.apply(0, 0, KvEventBatch(0.0, [_stored((1, 2), None, TOKENS[:32])]), 0.0)
    idx.apply(1, 0, KvEventBatch(0.0, [_stored((1,), None, TOKENS[:16])]), 0.0)
    idx.apply(0, 5, KvEventBatch(0.0, []), 0.0)  # batches 1-4 lost
    st = idx.state()
    assert st[0]["gaps"] == 4 and st[0]["resyncs"] == 1 and st[0]["indexed_blocks"] == 0
    assert st[0]["last_resync"] == "gap"
    assert st[1]["indexed_blocks"] == 1  # the other engine keeps its entries
    idx.apply(0, 6, KvEventBatch(0.0, [_stored((3,), 2, TOKENS[32:48])]), 0.0)  # parent forgotten
    assert idx.state()[0]["orphans"] == 1 and idx.blocks(0) == 0
    idx.apply(0, 7, KvEventBatch(0.0, [_stored((1, 2, 3, 4), None, TOKENS)]), 0.0)  # 4 > capacity 3
    assert idx.blocks(0) == 0 and idx.state()[0]["resyncs"] == 2
    idx.apply(1, 1, KvEventBatch(0.0, [KvEvent("AllBlocksCleared")]), 0.0)
    assert idx.blocks(1) == 0


def test_verified_stores_are_only_blocks_of_prompts_sent_there_and_their_output():
    """Issue 55 (MEDIUM 3): with ``verify`` a store is indexed only as a block of a prompt
    the gateway sent to that engine, or as one of the blocks its output can fill after
    the prompt's last block; a forged store of another prompt is counted, not indexed."""
    idx = KvEventIndex(verify=True)
    idx.add_engine(0, 100, 16)
    idx.add_engine(1, 100, 16)
    keys = token_block_keys(TOKENS, 16)
    idx.expect(0, keys[:2], max_tokens=16)  # a 2-block prompt (and a partial third) went to 0, 16 tokens out
    idx.apply(1, 0, KvEventBatch(0.0, [_stored((1, 2), None, TOKENS[:32])]), 0.0)  # never sent to 1
    assert idx.blocks(1) == 0 and idx.state()[1]["unverified"] == 2
    # engine 0: the prompt's blocks, then two blocks continuing it (the partial block and
    # the output: ceil(16 / 16) + 1 = 2), then a third that nothing sent could fill
    idx.apply(0, 0, KvEventBatch(0.0, [_stored((1, 2, 3, 4), None, TOKENS)]), 0.0)
    assert idx.matches(keys) == {0: 4} and idx.state()[0]["unverified"] == 0
    more = list(range(7000, 7016))
    idx.apply(0, 1, KvEventBatch(0.0, [_stored((5,), 4, more)]), 0.0)
    assert idx.blocks(0) == 4 and idx.state()[0]["unverified"] == 1
    # a branch off the middle of the prompt is no block of it
    idx.apply(0, 2, KvEventBatch(0.0, [_stored((6,), 1, more)]), 0.0)
    assert idx.blocks(0) == 4 and idx.state()[0]["unverified"] == 2
    unchecked = _index()  # verify off (unit seams, and kv_events_verify: false)
    unchecked.apply(1, 0, KvEventBatch(0.0, [_stored((1, 2), None, TOKENS[:32])]), 0.0)
    assert unchecked.blocks(1) == 2


def test_the_feed_drops_what_it_cannot_use_resyncs_and_keeps_reading():
    pytest.importorskip("zmq")
    pytest.importorskip("msgpack")
    from baton.gateway.kv_feed import KvEventFeed, KvSource

    idx, drops = _index(), []
    src = KvSource(0, "e0", f"tcp://127.0.0.1:{free_port()}", topic="kv")
    feed = KvEventFeed([src], idx, drops.append)
    try:
        good = encode_batch(KvEventBatch(time.time(), [_stored((1, 2), None, TOKENS[:32])]))
        feed.handle(src, [b"kv", (0).to_bytes(8, "big"), good])
        assert idx.blocks(0) == 2
        for frames in ([b"kv", b"x", good], [b"kv"], [b"other", (1).to_bytes(8, "big"), good],
                       [b"kv", (1).to_bytes(8, "big"), b"\xc1not msgpack"],
                       [b"kv", (1).to_bytes(8, "big"), encode_batch(KvEventBatch(0.0, [_stored((5,), None, (1,))]))]):
            feed.handle(src, frames)
        assert drops == ["malformed", "malformed", "topic", "malformed", "malformed"]
        assert idx.blocks(0) == 0  # every drop cleared what the engine's index held
        feed.handle(src, [b"kv", (2).to_bytes(8, "big"), good])
        assert idx.blocks(0) == 2 and feed.applied == 2
    finally:
        feed.close()


@pytest.mark.parametrize("gateway_binds", [False, True], ids=["engine-binds", "gateway-binds"])
def test_requests_sharing_a_prefix_follow_the_instance_that_caches_it(tmp_path, gateway_binds):
    pytest.importorskip("zmq")
    pytest.importorskip("msgpack")
    ports = [free_port(), free_port()]
    # kv_events: the engine binds, the gateway connects; kv_events_listen: the other way round
    endpoint, key = ("tcp://127.0.0.1:{}", "kv_events_listen") if gateway_binds else ("tcp://*:{}", "kv_events")
    emulators = [start_emulator(tmp_path, "--time-scale", "0.2", "--kv-events-config",
                                f'{{"enable_kv_cache_events": true, "publisher": "zmq", '
                                f'"endpoint": "{endpoint.format(p)}"}}')
                 for p in ports]
    engines = [{"url": e.url, "role": "mixed", "name": f"m{i}", key: f"tcp://127.0.0.1:{p}"}
               for i, (e, p) in enumerate(zip(emulators, ports))]
    gw = start_gateway(tmp_path, {"engines": engines, "policy": "prefix-precise", "admin_token": "admin-token-for-tests",
                                  "scrape_interval_s": 0.2})
    auth = {"Authorization": "Bearer admin-token-for-tests"}
    with servers(*emulators, gw):
        assert wait_until(lambda: all(s["connected"] for s in get(gw.url + "/admin/kv", headers=auth)[1]["engines"]
                                      .values()), timeout_s=10)  # both subscriptions up
        time.sleep(0.2)  # and their subscription messages reach the publishers
        shared = list(range(5000, 5800))  # 50 blocks
        # a long answer keeps m0 busy (the first request of all goes to the lowest id), so
        # the shared prompt goes to m1; once m0 is free again, load alone would send the
        # siblings back to m0, and only their prefix holds them on m1
        busy = Stream(gw.url + "/v1/completions", {"prompt": list(range(100, 120)), "max_tokens": 3000,
                                                    "stream": True, "ignore_eos": True})
        assert busy.status == 200
        assert post(gw.url + "/v1/completions", {"prompt": shared + [1, 2, 3], "max_tokens": 2})[0] == 200
        first = [d[2] for d in decision_log(gw.url) if d[0] == "prefill"][-1]
        assert first == 1
        assert sum(1 for _ in busy.events()) > 0  # the long answer ends
        busy.close()
        assert wait_until(lambda: metric(emulators[0].url, "vllm:num_requests_running") == 0)
        time.sleep(0.5)  # two scrapes: both engines read idle again
        name = f"m{first}"
        assert wait_until(lambda: get(gw.url + "/admin/kv", headers=auth)[1]["engines"][name]["indexed_blocks"] >= 50)
        hits_before = metric(emulators[first].url, "vllm:prefix_cache_hits_total")
        for k in range(4):
            code, _ = post(gw.url + "/v1/completions", {"prompt": shared + [7, k, 9, 9], "max_tokens": 2})
            assert code == 200
        placed = [d[2] for d in decision_log(gw.url) if d[0] == "prefill"][-4:]
        assert placed == [first] * 4, placed
        # the engine's own counters: each sibling found the 50 shared blocks cached there
        assert metric(emulators[first].url, "vllm:prefix_cache_hits_total") - hits_before >= 4 * 50 * 16
        _, text = get(gw.url + "/metrics")
        assert f'baton_kv_indexed_blocks{{engine="{name}"}}' in str(text)


def test_a_peer_on_a_bound_feed_cannot_draw_requests_to_an_engine(tmp_path):
    """Issue 55 (MEDIUM 3): the gateway binds each engine's feed on loopback; a local
    process that connects to it and forges stores of a prompt never sent to that engine
    moves nothing (before: 96 of 96 requests followed forged events) and is counted."""
    zmq = pytest.importorskip("zmq")
    pytest.importorskip("msgpack")
    ports = [free_port(), free_port()]
    emulators = [start_emulator(tmp_path, "--time-scale", "0.2") for _ in ports]
    engines = [{"url": e.url, "role": "mixed", "name": f"m{i}", "kv_events_listen": f"tcp://127.0.0.1:{p}"}
               for i, (e, p) in enumerate(zip(emulators, ports))]
    gw = start_gateway(tmp_path, {"engines": engines, "policy": "prefix-precise", "admin_token": "admin-token-for-tests",
                                  "scrape_interval_s": 0.2})
    auth = {"Authorization": "Bearer admin-token-for-tests"}
    ctx = zmq.Context()
    forger = ctx.socket(zmq.PUB)
    forger.setsockopt(zmq.LINGER, 0)
    try:
        with servers(*emulators, gw):
            forger.connect(f"tcp://127.0.0.1:{ports[1]}")  # m1's feed: whatever arrives there is m1's
            assert wait_until(lambda: get(gw.url + "/admin/kv", headers=auth)[1]["engines"]["m1"]["connected"],
                              timeout_s=10)
            time.sleep(0.3)  # the gateway's subscription reaches the forger
            shared = list(range(5000, 5800))  # 50 blocks, claimed by m1 and never sent there
            for seq in range(3):
                batch = KvEventBatch(time.time(), [_stored(tuple(range(1, 51)), None, shared)], 0)
                forger.send_multipart([b"", seq.to_bytes(8, "big"), encode_batch(batch)])
            assert wait_until(lambda: get(gw.url + "/admin/kv", headers=auth)[1]["engines"]["m1"]["unverified"] >= 50)
            assert get(gw.url + "/admin/kv", headers=auth)[1]["engines"]["m1"]["indexed_blocks"] == 0
            for k in range(4):  # idle engines, no prefix anywhere: each goes to the lowest id, m0
                assert post(gw.url + "/v1/completions", {"prompt": shared + [7, k], "max_tokens": 2})[0] == 200
            placed = [d[2] for d in decision_log(gw.url) if d[0] == "prefill"][-4:]
            assert placed == [0] * 4, placed
    finally:
        forger.close(0)
        ctx.term()


def test_a_feed_address_the_gateway_binds_names_one_interface():
    from baton.core.errors import ConfigError
    from baton.gateway.config import parse_config
    for bad in ("tcp://*:5557", "tcp://0.0.0.0:5557", "tcp://[::]:5557", "tcp://127.0.0.1", "http://127.0.0.1:1"):
        with pytest.raises(ConfigError, match="engines\\[0\\].kv_events_listen"):
            parse_config({"engines": [{"url": "http://a:1", "role": "mixed", "kv_events_listen": bad}]})
    with pytest.raises(ConfigError, match="not both"):
        parse_config({"engines": [{"url": "http://a:1", "role": "mixed", "kv_events_listen": "tcp://127.0.0.1:5557",
                                   "kv_events": "tcp://127.0.0.1:5558"}]})
    ok = parse_config({"engines": [{"url": "http://a:1", "role": "mixed", "kv_events_listen": "tcp://127.0.0.1:5557"}]})
    assert ok.engines[0].kv_feed == "tcp://127.0.0.1:5557" and ok.kv_events_verify


def _gateway(tmp_path, **extra):
    from baton.gateway.config import parse_config
    from baton.gateway.server import Gateway
    engines = [{"url": "http://127.0.0.1:9", "role": "mixed", "name": "m0"}]
    return Gateway(parse_config({"engines": engines, "policy": "prefix-precise", **extra}))


def test_prompts_are_keyed_from_token_ids_or_the_configured_tokenizer(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    words = [f"w{i}" for i in range(100)]
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(["[UNK]", *words])},
                                                            unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    gw = _gateway(tmp_path, tokenizer=str(tmp_path / "tokenizer.json"))
    text = " ".join(words[:40])
    ids = tok.encode(text).ids
    assert gw.prompt_keys("completions", {"prompt": text}, None) == tuple(token_block_keys(ids, 16))
    assert len(gw.prompt_keys("completions", {"prompt": text}, None)) == 2  # 40 tokens: two full blocks
    assert gw.prompt_keys("completions", {"prompt": TOKENS}, TOKENS) == tuple(token_block_keys(TOKENS, 16))
    assert gw.prompt_keys("chat", {"messages": [{"role": "user", "content": text}]}, None) == ()
    assert _gateway(tmp_path).prompt_keys("completions", {"prompt": text}, None) == ()  # no tokenizer: unkeyed


def test_bad_kv_event_and_tokenizer_settings_are_config_errors_that_name_the_key(tmp_path):
    from baton.core.errors import ConfigError
    from baton.gateway.config import parse_config
    with pytest.raises(ConfigError, match="engines\\[0\\].kv_events"):
        parse_config({"engines": [{"url": "http://a:1", "role": "mixed", "kv_events": "tcp://*:5557"}]})
    with pytest.raises(ConfigError, match="tokenizer"):
        _gateway(tmp_path, tokenizer=str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="kv_events_rate_per_s"):
        parse_config({"engines": [{"url": "http://a:1", "role": "mixed"}], "kv_events_rate_per_s": 0})


def test_a_batch_over_the_size_limit_is_dropped_before_it_is_decoded():
    """Round 3, finding 4: a batch was decoded, keyed and indexed whole before any size
    check (100 batches of 2 MB stalled /health for 23 s)."""
    pytest.importorskip("zmq")
    pytest.importorskip("msgpack")
    from baton.gateway.kv_feed import KvEventFeed, KvFeedLimits, KvSource

    idx, drops = _index(), []
    src = KvSource(0, "e0", f"tcp://127.0.0.1:{free_port()}")
    feed = KvEventFeed([src], idx, drops.append, KvFeedLimits(5000.0, 1024))
    try:
        big = encode_batch(KvEventBatch(time.time(), [_stored(range(1, 41), None, range(640))]))
        assert len(big) > 1024
        feed.handle(src, [b"", (0).to_bytes(8, "big"), big])
        feed.handle(src, [b"", (1).to_bytes(8, "big"), b"\xc1" * 2048])  # not even msgpack: size first
        assert drops == ["too_large", "too_large"] and idx.blocks(0) == 0 and feed.applied == 0
    finally:
        feed.close()


def test_the_default_batch_cap_fits_an_engine_step_and_not_a_flood():
    """Round 3, LOW: the cap was 16 MiB (a 2 MB batch stalled the gateway). An engine step
    of 32,768 batched tokens stores 2,048 blocks of 16: about 150 KB, far under 2 MiB."""
    from baton.gateway.config import parse_config
    from baton.gateway.kv_feed import KvFeedLimits
    step = encode_batch(KvEventBatch(time.time(), [_stored(range(1, 2049), None, [150_000 - t for t in range(32768)])]))
    cap = parse_config({"engines": [{"url": "http://127.0.0.1:1", "role": "mixed"}]}).kv_events_max_bytes
    assert len(step) < cap // 8 and cap == KvFeedLimits().max_message_bytes == 2 * 1024 * 1024
