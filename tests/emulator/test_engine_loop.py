"""The emulator's engine (the engine model on wall-clock time): exact token sequences,
preemption, timing, held KV, aborts."""

import asyncio
import time

from baton.emulator.engine_loop import EngineLoop, LoopConfig, Sequence, SeqState
from tests.sim.helpers import tiny_perf


async def drain(seq):
    positions = []
    while True:
        kind, value = await seq.events.get()
        if kind == "done":
            return positions, value
        positions.append(value)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


async def with_engine(config, body):
    b = EngineLoop(config, tiny_perf())
    task = asyncio.create_task(b.run())
    try:
        return await body(b)
    finally:
        task.cancel()


def test_preemption_under_kv_pressure_keeps_every_sequence_exact():
    async def body(b):
        seqs = [Sequence(f"r{i}", 50, 60) for i in range(4)]
        for s in seqs:
            b.submit(s)
        outs = await asyncio.gather(*(drain(s) for s in seqs))
        return b, seqs, outs
    b, seqs, outs = run(with_engine(LoopConfig.of(kv_blocks=20, block_size=16), body))
    for positions, reason in outs:
        assert positions == list(range(50, 110)) and reason == "length"
    assert b.preemptions > 0  # 4 x 7 blocks do not fit in 20
    assert b.blocks_used == 0 and b.running == 0 and b.waiting == 0 and not b.seqs
    assert b.generation_tokens >= 240 and b.finished == 4


def test_iteration_timing_follows_the_perf_model():
    perf = tiny_perf()

    async def body(b):
        s = Sequence("r", 100, 40)
        t0 = time.perf_counter()
        b.submit(s)
        await drain(s)
        return time.perf_counter() - t0
    elapsed = run(with_engine(LoopConfig.of(kv_blocks=100, time_scale=2.0), body))
    from baton.perf.model import batch_shape
    expect = perf.iteration_time_s(batch_shape([(100, 0)], []))
    expect += sum(perf.iteration_time_s(batch_shape([], [100 + k])) for k in range(1, 40))
    assert 2.0 * expect * 0.95 <= elapsed <= 2.0 * expect * 1.3


def test_prefill_only_holds_blocks_until_released():
    async def body(b):
        s = Sequence("held", 64, 1, prefill_only=True)
        b.submit(s)
        positions, _ = await drain(s)
        held_blocks = b.blocks_used
        state = s.state
        b.release_held("held")
        return positions, held_blocks, state, b.blocks_used
    positions, held, state, after = run(with_engine(LoopConfig.of(kv_blocks=50), body))
    # the prompt's 64 tokens in 4 blocks (the sampled token has no KV yet, as in vLLM)
    assert positions == [64] and state is SeqState.HELD and held == 4 and after == 0


def test_abort_frees_blocks_by_the_end_of_the_running_iteration():
    """As vLLM handles aborts between steps: a request in the running iteration leaves
    when it ends, and nothing of it is left."""
    async def body(b):
        s = Sequence("a", 64, 1000)
        b.submit(s)
        await s.events.get()
        b.abort(s)
        for _ in range(100):
            if b.blocks_used == 0 and not b.seqs:
                break
            await asyncio.sleep(0.01)
        return b.blocks_used, s.state, b.seqs, b.running
    assert run(with_engine(LoopConfig.of(kv_blocks=50), body)) == (0, SeqState.DONE, {}, 0)


def test_a_waiting_request_aborted_leaves_at_once():
    async def body(b):
        first, second = Sequence("a", 64, 200), Sequence("b", 64, 5)
        b.submit(first)
        b.submit(second)  # max_num_seqs 1: the second waits for the first
        await first.events.get()
        b.abort(second)
        waiting_after = b.waiting
        positions, reason = await drain(first)
        return waiting_after, len(positions), reason, second.events.empty(), b.blocks_used
    assert run(with_engine(LoopConfig.of(kv_blocks=50, max_num_seqs=1), body)) == (0, 199, "length", True, 0)


def test_emulator_words_are_one_token_each_for_a_real_tokenizer():
    """Load tools count output tokens by tokenizing the text: each emulated token must be
    one token of a real BPE vocabulary (SmolLM2's, when a local copy exists)."""
    import pytest
    tokenizers = pytest.importorskip("tokenizers")
    from baton.core.paths import cache_dir
    from baton.emulator.tokens import WORDS
    cache = cache_dir()
    path = next((p for p in (cache / "smollm2-tokenizer" / "tokenizer.json", cache / "smollm2-hf" / "tokenizer.json")
                 if p.exists()), None)
    if path is None:
        pytest.skip("no local SmolLM2 tokenizer (make loadtest or make real-vllm prepares one)")
    tok = tokenizers.Tokenizer.from_file(str(path))
    assert [w for w in WORDS if len(tok.encode(w, add_special_tokens=False).ids) != 1] == []
    text = "".join(WORDS[i % len(WORDS)] for i in range(300))
    assert len(tok.encode(text, add_special_tokens=False).ids) == 300
