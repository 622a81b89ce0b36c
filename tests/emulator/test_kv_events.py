"""vLLM's KV events: the wire format both ways (map and array encodings), and the emulator
publishing what its prefix cache stores and evicts, with block hashes a reader can
recompute from token ids."""

import time

import pytest

from baton.core.errors import ConfigError
from baton.core.prefix import vllm_block_hashes
from baton.emulator.engine_loop import Sequence
from baton.emulator.tokens import word_ids
from baton.protocol.kv_events import BlockIndex, KvEvent, KvEventBatch, KvEventsConfig, decode_batch, encode_batch
from tests.live import free_port, post, servers, start_emulator

msgpack = pytest.importorskip("msgpack")


def test_map_encoding_round_trips_and_the_array_encoding_reads_too():
    batch = KvEventBatch(12.5, [KvEvent("BlockStored", (1, 2), None, tuple(range(32)), 16),
                                KvEvent("BlockRemoved", (1,)), KvEvent("AllBlocksCleared")], 0)
    back = decode_batch(encode_batch(batch))
    assert back.events == batch.events and back.ts == 12.5
    old = msgpack.packb([3.0, [["BlockStored", [7], 5, [1, 2], 16, None, "GPU"], ["BlockRemoved", [7], "GPU"],
                               ["AllBlocksCleared"]], 1])
    events = decode_batch(old).events
    assert [e.kind for e in events] == ["BlockStored", "BlockRemoved", "AllBlocksCleared"]
    assert events[0].block_hashes == (7,) and events[0].parent_block_hash == 5 and events[0].block_size == 16
    for bad in (b"\xc1", msgpack.packb({"ts": 1.0, "events": [{"type": "Nope"}]}), msgpack.packb(3)):
        with pytest.raises(ValueError):
            decode_batch(bad)


def test_the_index_follows_stores_removals_clears_and_counts_gaps():
    idx = BlockIndex()
    idx.apply(0, KvEventBatch(0.0, [KvEvent("BlockStored", (1, 2, 3))]))
    idx.apply(3, KvEventBatch(0.0, [KvEvent("BlockRemoved", (2,))]))
    assert idx.prefix_hits([1, 2, 3]) == 1 and idx.missed == 2
    idx.apply(4, KvEventBatch(0.0, [KvEvent("AllBlocksCleared")]))
    assert not idx.blocks


def test_events_config_reads_vllms_json_and_names_bad_keys():
    cfg = KvEventsConfig.from_json('{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557"}')
    assert cfg.enabled and cfg.endpoint == "tcp://*:5557"
    with pytest.raises(ConfigError, match="publisher"):
        KvEventsConfig.from_json('{"publisher": "kafka"}')
    with pytest.raises(ConfigError, match="not JSON"):
        KvEventsConfig.from_json("{")


def test_the_emulator_publishes_the_blocks_it_caches(tmp_path):
    zmq = pytest.importorskip("zmq")
    port = free_port()
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    # vLLM's convention: an endpoint with * binds (the engine publishes, readers connect)
    config = f'{{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:{port}"}}'
    e = start_emulator(tmp_path, "--kv-events-config", config, "--time-scale", "0.2")
    prompt = " ".join(f"w{i}" for i in range(200))
    index, stored = BlockIndex(), []
    try:
        with servers(e):
            sub.connect(f"tcp://127.0.0.1:{port}")
            time.sleep(0.5)  # let the subscription reach the publisher before the first event
            for _ in range(2):
                assert post(e.url + "/v1/completions", {"prompt": prompt, "max_tokens": 2})[0] == 200
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                if sub.poll(200):
                    topic, seq, payload = sub.recv_multipart()
                    batch = decode_batch(payload)
                    index.apply(int.from_bytes(seq, "big"), batch)
                    stored += [ev for ev in batch.events if ev.kind == "BlockStored"]
                elif stored:
                    break
    finally:
        sub.close(0)
        ctx.term()
    expected = Sequence("x", 200, 2, prompt_ids=tuple(word_ids(prompt))).block_keys(16)
    assert list(expected) == vllm_block_hashes(word_ids(prompt), 16)  # vLLM's own hashes: unsigned 64-bit
    assert len(expected) == 12 and index.prefix_hits(expected) == 12 and index.missed == 0
    assert sum(len(ev.block_hashes) for ev in stored) == 12  # the second request hit them: nothing new
    assert stored[0].token_ids == tuple(word_ids(prompt)[:16 * len(stored[0].block_hashes)])


def test_a_bad_events_endpoint_is_one_line_and_exit_2():
    import subprocess
    import sys
    p = subprocess.run([sys.executable, "-m", "baton.cli.main", "emulate", "--kv-events-config",
                        '{"enable_kv_cache_events": true, "endpoint": "bogus"}'], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2 and "--kv-events-config: endpoint 'bogus'" in p.stderr and "Traceback" not in p.stderr
