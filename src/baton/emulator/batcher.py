"""Continuous batching for one emulated engine, timed by a performance model.

Each iteration serves every running decode (one token each) plus prefill chunks up to the
token budget, like vLLM v1's scheduler; its duration is ``perf.iteration_time_s`` of the
batch, times ``time_scale``. KV is paged: a prefill is admitted when blocks for its whole
prompt are free; a decode that needs a new block and finds none preempts the most
recently admitted request, which later recomputes its prompt and output (vLLM's
recompute preemption).
"""

from __future__ import annotations

import asyncio
import enum
import math
import time
from collections import deque
from dataclasses import dataclass, field

from baton.core.prefix import vllm_block_hashes
from baton.engine_model.prefix_cache import CacheListener, PrefixCache
from baton.emulator.timings import RequestTimings
from baton.perf.model import PerfModel, batch_shape


class SeqState(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    HELD = "held"  # prefill done for a remote decode; blocks kept until pulled
    DONE = "done"


@dataclass(slots=True, frozen=True)
class BatcherConfig:
    """Scheduler limits (tokens, sequences, tokens per block), KV capacity in blocks and
    a time scale applied to every iteration (2.0 = twice as slow as the preset)."""

    kv_blocks: int
    block_size: int = 16
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    time_scale: float = 1.0
    enable_prefix_caching: bool = True  # vLLM v1's default (engine_model/prefix_cache.py)


@dataclass(slots=True, eq=False)
class Sequence:
    """One request inside the emulator. Events go to ``events``: ``("token", position)``,
    ``("done", finish_reason)``."""

    rid: str
    prompt_len: int
    max_new: int
    prefill_only: bool = False
    finish_reason: str = "length"  # at max_new: "stop" when a stop string ends it there
    prompt_ids: tuple[int, ...] = ()  # for prefix caching (output ids are their positions)
    _keys: tuple = (0, 0, ())  # (block size, generated, keys): block_keys' last answer
    generated: int = 0
    to_prefill: int = 0
    ctx: int = 0
    blocks: int = 0
    admit_seq: int = 0
    state: SeqState = SeqState.WAITING
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    # engine-side times (time.monotonic, s) for vLLM's latency histograms
    arrived_s: float = field(default_factory=time.monotonic)
    scheduled_s: float | None = None
    first_token_s: float | None = None
    last_token_s: float | None = None

    def emit_token(self) -> None:
        self.events.put_nowait(("token", self.prompt_len + self.generated))
        self.generated += 1

    def token_ids(self) -> list[int]:
        """Prompt and output token ids so far (the emulator's output ids are their positions)."""
        return list(self.prompt_ids) + list(range(self.prompt_len, self.prompt_len + self.generated))

    def block_keys(self, block_size: int) -> tuple[int, ...]:
        """The full blocks of prompt + output so far, keyed as vLLM 0.32 hashes them
        (``core.prefix.vllm_block_hashes``: its KV events carry the same numbers); kept
        until the sequence grows (a waiting request is looked up every iteration)."""
        if self._keys[:2] != (block_size, self.generated):
            self._keys = (block_size, self.generated, tuple(vllm_block_hashes(self.token_ids(), block_size)))
        return self._keys[2]


def blocks_for(tokens: int, block_size: int) -> int:
    return math.ceil(tokens / block_size)


class Batcher:
    """The engine loop and its queues; ``run()`` is a task on the server's event loop."""

    def __init__(self, config: BatcherConfig, perf: PerfModel, timings: RequestTimings | None = None,
                 events: CacheListener | None = None) -> None:
        self.config, self.perf, self.timings = config, perf, timings
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.held: dict[str, Sequence] = {}
        self.blocks_used = 0
        self.preemptions = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.finished = 0
        self._admits = 0
        self._wake = asyncio.Event()
        self._freed = asyncio.Condition()
        self._reserving = 0
        self.cache = PrefixCache(config.kv_blocks) if config.enable_prefix_caching else None
        self.events = events  # KV events: told what the cache stores and evicts, flushed per iteration
        if self.cache is not None:
            self.cache.listener = events

    # --- submission ------------------------------------------------------------------
    def submit(self, seq: Sequence) -> None:
        """Queue a request whose prompt is prefilled here."""
        seq.to_prefill, seq.ctx = seq.prompt_len, 0
        self.prompt_tokens += seq.prompt_len
        self.waiting.append(seq)
        self._wake.set()

    async def reserve(self, blocks: int, timeout_s: float) -> bool:
        """Wait until ``blocks`` are free and take them (a KV transfer's destination)."""
        async def _take() -> None:
            async with self._freed:
                await self._freed.wait_for(lambda: self.free_blocks >= blocks)
                self._allocate(blocks)
        self._reserving += 1
        try:
            await asyncio.wait_for(_take(), timeout_s)
            return True
        except asyncio.TimeoutError:
            return False
        finally:
            self._reserving -= 1

    def unreserve(self, blocks: int) -> None:
        """Give back blocks taken by ``reserve`` when the transfer they were for failed."""
        self.blocks_used -= blocks
        if self.cache is not None and blocks:
            self.cache.release(None, blocks, (), 0)
        self._wake.set()
        self._notify_freed()

    def join_decode(self, seq: Sequence, blocks: int) -> None:
        """Start decoding a request whose prompt KV (``blocks``, already reserved) arrived."""
        seq.blocks, seq.ctx, seq.to_prefill = blocks, seq.prompt_len, 0
        self._admit(seq)
        self._wake.set()

    def abort(self, seq: Sequence) -> None:
        """Drop a request wherever it is and free its blocks."""
        if seq.state is SeqState.WAITING and seq in self.waiting:
            self.waiting.remove(seq)
        elif seq.state is SeqState.RUNNING:
            self.running.remove(seq)
        elif seq.state is SeqState.HELD:
            self.held.pop(seq.rid, None)
        self._finish(seq, None)

    def release_held(self, rid: str) -> Sequence | None:
        """Hand over a held prefill's KV (the pull side calls this after the transfer)."""
        seq = self.held.pop(rid, None)
        if seq is not None:
            self._finish(seq, None)
        return seq

    # --- reads -----------------------------------------------------------------------
    @property
    def free_blocks(self) -> int:
        return self.config.kv_blocks - self.blocks_used

    @property
    def kv_usage(self) -> float:
        return self.blocks_used / self.config.kv_blocks

    # --- the loop --------------------------------------------------------------------
    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        next_s = loop.time()
        while True:
            if not self.running and not self._admissible():
                self._wake.clear()
                await self._wake.wait()
                next_s = loop.time()
            decodes, chunks = self._plan()
            if not decodes and not chunks:
                self._wake.clear()
                await self._wake.wait()
                next_s = loop.time()
                continue
            shape = batch_shape([(c, s.ctx) for s, c in chunks], [s.ctx for s in decodes])
            next_s = max(next_s, loop.time() - 0.05) + self.perf.iteration_time_s(shape) * self.config.time_scale
            await asyncio.sleep(max(0.0, next_s - loop.time()))
            self._apply(decodes, chunks)
            if self.events is not None:
                self.events.flush()

    def _admissible(self) -> bool:
        return self._head_admission() is not None

    def _head_admission(self) -> tuple[int, tuple[int, ...]] | None:
        """(cached blocks, their keys) of the queue's head if it can be admitted now, else None."""
        if not self.waiting or len(self.running) >= self.config.max_num_seqs:
            return None
        hit, keys, need = self._admission(self.waiting[0])
        return (hit, keys) if need <= self.free_blocks else None

    def _admission(self, seq: Sequence) -> tuple[int, tuple[int, ...], int]:
        """(cached blocks it starts from, their keys, free blocks it takes): its longest
        cached prefix of full blocks, never its whole sequence (one token is computed)."""
        bs = self.config.block_size
        need = blocks_for(seq.to_prefill + 1, bs)
        if self.cache is None or seq.ctx:
            return 0, (), need
        keys = seq.block_keys(bs)
        hit = self.cache.hit_blocks(keys, (seq.to_prefill - 1) // bs)
        return hit, keys[:hit], need - hit + self.cache.free_hits(keys[:hit])

    def _allocate(self, blocks: int) -> None:
        self.blocks_used += blocks
        if self.cache is not None and blocks:
            self.cache.allocate(blocks)

    def _free(self, seq: Sequence) -> None:
        """A sequence's blocks go back; with prefix caching its full blocks stay cached."""
        if self.cache is None:
            self.blocks_used -= seq.blocks
        else:
            self.blocks_used -= self.cache.release(seq, seq.blocks, seq.block_keys(self.config.block_size),
                                                   seq.ctx // self.config.block_size)

    def _plan(self) -> tuple[list[Sequence], list[tuple[Sequence, int]]]:
        """This iteration's decodes and prefill chunks; allocates blocks, may preempt."""
        self._grow_decodes()
        decodes = [s for s in self.running if s.to_prefill == 0]
        budget = self.config.max_num_batched_tokens - len(decodes)
        chunks: list[tuple[Sequence, int]] = []
        for s in self.running:
            if s.to_prefill > 0 and budget > 0:
                chunks.append((s, min(s.to_prefill, budget)))
                budget -= chunks[-1][1]
        while budget > 0 and (admission := self._head_admission()) is not None:
            s = self.waiting.popleft()
            hit, keys = admission
            total = blocks_for(s.to_prefill + 1, self.config.block_size)
            if self.cache is not None:
                self.cache.note_query(s.to_prefill, hit * self.config.block_size)
                self.blocks_used += self.cache.take_hits(s, keys)
                s.ctx, s.to_prefill = hit * self.config.block_size, s.to_prefill - hit * self.config.block_size
            self._allocate(total - hit)
            s.blocks = total
            self._admit(s)
            chunks.append((s, min(s.to_prefill, budget)))
            budget -= chunks[-1][1]
        return decodes, chunks

    def _admit(self, seq: Sequence) -> None:
        self._admits += 1
        seq.admit_seq, seq.state = self._admits, SeqState.RUNNING
        if seq.scheduled_s is None:
            seq.scheduled_s = time.monotonic()
        self.running.append(seq)

    def _grow_decodes(self) -> None:
        """Give every decode the block its next token needs, preempting the latest
        admitted request while blocks run short."""
        bs = self.config.block_size
        for s in sorted((s for s in self.running if s.to_prefill == 0), key=lambda s: s.admit_seq):
            if s.state is not SeqState.RUNNING:
                continue
            need = blocks_for(s.ctx + 1, bs) - s.blocks
            while need > self.free_blocks and s.state is SeqState.RUNNING:
                self._preempt(max(self.running, key=lambda r: r.admit_seq))
            if s.state is SeqState.RUNNING and need > 0:
                self._allocate(need)
                s.blocks += need

    def _preempt(self, victim: Sequence) -> None:
        self.running.remove(victim)
        self._free(victim)
        victim.blocks, victim.ctx = 0, 0
        victim.to_prefill = victim.prompt_len + victim.generated
        victim.state = SeqState.WAITING
        self.waiting.appendleft(victim)
        self.preemptions += 1

    def _apply(self, decodes: list[Sequence], chunks: list[tuple[Sequence, int]]) -> None:
        for s in decodes:
            if s.state is SeqState.RUNNING:
                s.ctx += 1
                self._emit(s)
        for s, chunk in chunks:
            if s.state is not SeqState.RUNNING:
                continue
            s.to_prefill -= chunk
            s.ctx += chunk
            if self.cache is not None:
                self.cache.register(s, s.block_keys(self.config.block_size)[:s.ctx // self.config.block_size])
            if s.to_prefill == 0:
                self._emit(s)
        self._notify_freed()

    def _emit(self, s: Sequence) -> None:
        now = time.monotonic()
        if self.timings is not None:
            self.timings.token(s.arrived_s, s.scheduled_s or now, s.last_token_s, now)
        s.first_token_s = s.first_token_s or now
        s.last_token_s = now
        s.emit_token()
        self.generation_tokens += 1
        if s.prefill_only:
            self.running.remove(s)
            s.state = SeqState.HELD
            self.held[s.rid] = s
            s.events.put_nowait(("done", "length"))
        elif s.generated >= s.max_new:
            self.running.remove(s)
            self._finish(s, s.finish_reason)

    def _finish(self, seq: Sequence, reason: str | None) -> None:
        if seq.state is SeqState.DONE:
            return
        self._free(seq)
        seq.blocks, seq.state = 0, SeqState.DONE
        if reason is not None:
            self.finished += 1
            seq.events.put_nowait(("done", reason))
            if self.timings is not None and seq.first_token_s is not None and seq.last_token_s is not None:
                self.timings.finished(seq.arrived_s, seq.first_token_s, seq.last_token_s)
        self._wake.set()
        self._notify_freed()

    def _notify_freed(self) -> None:
        async def _notify() -> None:
            async with self._freed:
                self._freed.notify_all()
        if self._reserving:
            asyncio.get_running_loop().create_task(_notify())
