"""The emulator's prefix cache follows the engine model's rules (engine_model/prefix_cache.py): a
repeated prefix is served from cache (fewer prefill tokens, a shorter first token), at least
one token is computed, preemption keeps every sequence exact, blocks are conserved, and the
vLLM counters appear on /metrics."""

import asyncio
import time

from baton.emulator.engine_loop import LoopConfig, Sequence
from tests.emulator.test_engine_loop import drain, run, with_engine
from tests.live import get, post, servers, start_emulator


def seq(rid, prompt_ids, max_new=4):
    return Sequence(rid, len(prompt_ids), max_new, prompt_ids=tuple(prompt_ids))


def test_a_repeated_prefix_is_served_from_cache_and_its_first_token_comes_sooner():
    async def body(b):
        first = seq("a", range(1000, 3000))
        t0 = time.monotonic()
        b.submit(first)
        await drain(first)
        cold = time.monotonic() - t0
        second = seq("b", list(range(1000, 3000)) + [7, 8, 9])
        t0 = time.monotonic()
        b.submit(second)
        positions, _ = await drain(second)
        return cold, time.monotonic() - t0, positions, b
    cold, warm, positions, b = run(with_engine(LoopConfig.of(kv_blocks=400, block_size=16, time_scale=5.0), body))
    assert positions == list(range(2003, 2007))
    assert (b.cache.stats.queries, b.cache.stats.hits) == (2000 + 2003, 2000)  # 125 full blocks, then 125 again
    assert warm < 0.5 * cold
    assert b.blocks_used == 0 and b.cache.free_blocks() == 400


def test_an_identical_prompt_still_computes_its_last_token():
    async def body(b):
        for rid in ("a", "b"):
            s = seq(rid, range(160))
            b.submit(s)
            await drain(s)
        return b
    b = run(with_engine(LoopConfig.of(kv_blocks=50, block_size=16), body))
    assert b.cache.stats.hits == 144  # 9 of 10 blocks: the 10th holds the last token


def test_preemption_with_shared_prefixes_keeps_sequences_exact_and_blocks_conserved():
    async def body(b):
        seqs = [seq(f"r{i}", list(range(100, 148)) + [i], 60) for i in range(5)]
        for s in seqs:
            b.submit(s)
        return b, await asyncio.gather(*(drain(s) for s in seqs))
    b, outs = run(with_engine(LoopConfig.of(kv_blocks=24, block_size=16), body))
    assert all(positions == list(range(49, 109)) and reason == "length" for positions, reason in outs)
    assert b.preemptions > 0 and b.cache.stats.hits > 0
    assert b.blocks_used == 0 and b.cache.free_blocks() == 24 and not b.cache.active


def test_metrics_count_queried_and_cached_tokens(tmp_path):
    e = start_emulator(tmp_path, "--time-scale", "0.2")
    prompt = " ".join(f"w{i}" for i in range(200))
    with servers(e):
        for _ in range(2):
            assert post(e.url + "/v1/completions", {"prompt": prompt, "max_tokens": 2})[0] == 200
        text = get(e.url + "/metrics")[1]
    values = {line.split()[0].split("{")[0]: float(line.split()[-1]) for line in text.splitlines()
              if line.startswith("vllm:prefix_cache")}
    assert values["vllm:prefix_cache_queries_total"] == 400 and values["vllm:prefix_cache_hits_total"] == 192
    assert 'enable_prefix_caching="True"' in text
