"""Prefix caching against real vLLM (CPU, 0.32): requests that share a prefix, sent one
after another to one instance. vLLM's own hit counters rise by what its rules give; its
KV events carry exactly the block hashes Baton computes from the token ids
(``core.prefix.vllm_block_hashes``: sha256 over pickled (parent, tokens, extra keys), seed
"vllm-none-hash"); Baton's engine model, fed the same requests, predicts the same hits."""

from __future__ import annotations

import os
import re
import time

import pytest

from baton.core.prefix import VLLM_NONE_HASH_SEED, vllm_block_hashes
from baton.core.request import Request
from baton.policies import PolicyContext, build_scheduler
from baton.protocol.kv_events import BlockIndex, decode_batch
from baton.sim import ClusterSpec, EngineConfig, Simulator
from tests.live import get, metric, post
from tests_real.conftest import NEEDS_VLLM

pytestmark = NEEDS_VLLM
zmq = pytest.importorskip("zmq")
pytest.importorskip("msgpack")

SHARED = list(range(5000, 5300))  # 300 token ids no other test sends
PROMPTS = [SHARED, SHARED + list(range(6000, 6100)), SHARED[:160] + list(range(7000, 7060))]


def block_size(url: str) -> int:
    text = get(url + "/metrics")[1]
    found = re.search(r'vllm:cache_config_info\{[^}]*block_size="(\d+)"', text)
    assert found, "vllm:cache_config_info carries no block_size"
    return int(found.group(1))


def settled(url: str, name: str) -> float:
    """A counter once it stopped moving (vLLM publishes step stats a little after the answer)."""
    last = metric(url, name)
    for _ in range(20):
        time.sleep(0.25)
        now = metric(url, name)
        if now == last:
            return now
        last = now
    return last


def simulated_hits(bs: int) -> int:
    """Baton's engine model on the same three requests (ids hashed per block), one after another."""
    from baton.perf.fitted import FittedModel
    import numpy as np
    reqs = [Request(i, 10.0 * i, len(p), 1, tuple(hash(tuple(p[j:j + bs])) for j in range(0, len(p), bs)), bs)
            for i, p in enumerate(PROMPTS)]
    perf = FittedModel(np.array([1e-3, 1e-5, 0, 1e-5, 1e-8, 0]), kv_bytes_per_token=1, kv_capacity_tokens=100_000)
    sched = build_scheduler("colocated", PolicyContext(np.random.default_rng(0), perf))
    sim = Simulator(ClusterSpec(prefill=0, decode=0, mixed=1, engine=EngineConfig(2048, 16, bs)), perf, sched, reqs)
    sim.run()
    return sim.engines[0].cache.stats.hits


def test_shared_prefixes_hit_vllms_cache_as_baton_predicts(stack):
    engine = stack["decode"]
    bs = block_size(engine.url)
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.bind(f"tcp://127.0.0.1:{engine.kv_events_port}")  # vLLM's publisher connects to its reader
    # a bound SUB sends its subscription to a peer that connects only when the socket is
    # next used (libzmq runs socket commands in the caller's thread): poll while vLLM's
    # publisher reconnects, or it drops every event as unsubscribed
    until = time.monotonic() + 1.5
    while time.monotonic() < until:
        sub.poll(100)
    index, stored, hits = BlockIndex(), [], []
    try:
        for prompt in PROMPTS:
            before = metric(engine.url, "vllm:prefix_cache_hits_total")
            status, body = post(engine.url + "/v1/completions", {"model": "smollm2", "prompt": prompt,
                                                                 "max_tokens": 1, "temperature": 0.0}, timeout=300)
            assert status == 200, body
            hits.append(settled(engine.url, "vllm:prefix_cache_hits_total") - before)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and sub.poll(500):
            _, seq, payload = sub.recv_multipart()
            batch = decode_batch(payload)
            index.apply(int.from_bytes(seq, "big"), batch)
            stored += [h for e in batch.events if e.kind == "BlockStored" for h in e.block_hashes]
    finally:
        sub.close(0)
        ctx.term()
    seed = os.environ.get("PYTHONHASHSEED", VLLM_NONE_HASH_SEED)
    want = [vllm_block_hashes(p, bs, seed) for p in PROMPTS]
    print(f"\nvLLM block size {bs}; hits per request {hits}; blocks stored {len(stored)}")
    # (a) vLLM's counters: nothing for the first, then every full block of the shared part
    assert hits == [0, (300 // bs) * bs, (160 // bs) * bs]
    # (b) the events: the first prompt's full blocks, with the hashes Baton computes
    assert stored[:len(want[0])] == want[0]
    assert all(index.prefix_hits(w) == len(w) for w in want) and index.missed == 0
    # (c) the engine model predicts the same hits
    assert simulated_hits(bs) == sum(hits)
