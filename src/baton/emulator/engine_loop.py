"""The emulator's engine: Baton's engine model (``baton.engine_model``, the one the
simulator runs) advanced one iteration at a time on wall-clock time.

Each iteration is planned by the engine model at the loop's clock, lasts the performance
model's time for its batch (times ``time_scale``), and ends when that time has passed; then
its tokens go out. The clock keeps the ideal schedule (iteration ends back to back, an idle
engine woken at the arrival's time), as the simulator's event clock does, unless the event
loop falls more than ``MAX_LAG_S`` behind; so an emulator's token times are the simulator's
for the same arrivals, up to the event loop's wake-up jitter. What is left here is the
asyncio side: requests' event queues, waiting for KV room, latency histograms, counters."""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import Any

from baton.core.instance import InstanceState, Role
from baton.core.prefix import vllm_block_hashes
from baton.engine_model.engine import Engine
from baton.engine_model.prefix_cache import CacheListener
from baton.engine_model.standalone import Standalone, Step
from baton.engine_model.work import EngineConfig
from baton.emulator.timings import RequestTimings
from baton.perf.model import PerfModel
from baton.perf.scaled import scaled

MAX_LAG_S = 0.05  # further behind than this, the clock slips instead of rushing iterations


class SeqState(enum.Enum):
    """Where a request is: in the engine, its KV held for a pull, or ended."""

    ACTIVE = "active"
    HELD = "held"  # prefill done for a remote decode; blocks kept until pulled
    DONE = "done"


@dataclass(slots=True, frozen=True)
class LoopConfig:
    """The engine's flags (``EngineConfig``, as ``baton simulate`` takes them), its KV
    capacity in blocks, and a time scale on every iteration (2.0 = twice as slow)."""

    engine: EngineConfig
    kv_blocks: int
    time_scale: float = 1.0

    @classmethod
    def of(cls, kv_blocks: int, block_size: int = 16, max_num_batched_tokens: int = 8192, max_num_seqs: int = 256,
           time_scale: float = 1.0, enable_prefix_caching: bool = True) -> LoopConfig:
        """A config from the scheduler limits alone (the other flags at vLLM's defaults)."""
        engine = EngineConfig(max_num_batched_tokens, max_num_seqs, block_size, kv_tokens=kv_blocks * block_size,
                              enable_prefix_caching=enable_prefix_caching)
        return cls(engine, kv_blocks, time_scale)

    @property
    def block_size(self) -> int:
        return self.engine.block_size


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
    state: SeqState = SeqState.ACTIVE
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
    return -(-tokens // block_size)


class _BySequence:
    """A ``CacheListener`` that names the request by its ``Sequence`` (the KV events need
    its token ids), where the engine model names it by number."""

    def __init__(self, listener: CacheListener, seqs: dict[int, Sequence]) -> None:
        self.listener, self.seqs = listener, seqs

    def stored(self, req_id: Any, first_index: int, keys: Seq[int]) -> None:
        self.listener.stored(self.seqs[req_id], first_index, keys)

    def removed(self, keys: Seq[int]) -> None:
        self.listener.removed(keys)

    def flush(self) -> None:
        self.listener.flush()


class EngineLoop:
    """One emulated engine: ``run()`` is a task on the server's event loop. Requests are
    ``Sequence`` objects (string ids); the engine model knows them by number."""

    def __init__(self, config: LoopConfig, perf: PerfModel, timings: RequestTimings | None = None,
                 events: CacheListener | None = None) -> None:
        self.config, self.timings, self.events = config, timings, events
        self.state = InstanceState(0, Role.MIXED, config.kv_blocks, config.block_size)
        self.engine = Engine(self.state, config.engine, scaled(perf, config.time_scale), closed_form=False,
                             keys=self._block_keys)
        self.model = Standalone(self.engine)
        self.cache = self.engine.cache
        self.seqs: dict[int, Sequence] = {}
        if self.cache is not None and events is not None:  # KV events: flushed per iteration
            self.cache.listener = _BySequence(events, self.seqs)
        self._ids: dict[int, int] = {}  # id(Sequence) -> its number in the engine model
        self.held: dict[str, Sequence] = {}
        self.prompt_tokens = self.generation_tokens = self.finished = 0
        self._next = 0
        self._wake = asyncio.Event()
        self._woken_s = 0.0  # loop time of the work that woke an idle engine
        self._changed = asyncio.Condition()  # blocks may have freed (KV reservations wait on it)
        self._reserving = 0
        self._idle = True
        self._leaving: set[int] = set()  # aborted in the running iteration: forgotten at its end
        self.slipped_s = 0.0  # how far the schedule slipped behind the ideal one (a stalled event loop)

    # --- reads -----------------------------------------------------------------------
    @property
    def preemptions(self) -> int:
        return self.engine.preemptions

    @property
    def blocks_used(self) -> int:
        return self.state.kv_blocks_used

    @property
    def kv_usage(self) -> float:
        return self.state.kv_blocks_used / self.config.kv_blocks

    @property
    def running(self) -> int:
        """vLLM's ``num_requests_running``: decodes and admitted prefills."""
        return self.state.running_requests

    @property
    def waiting(self) -> int:
        """vLLM's ``num_requests_waiting``."""
        return self.state.waiting_requests

    # --- requests in -----------------------------------------------------------------
    def submit(self, seq: Sequence) -> None:
        """Queue a request whose prompt is prefilled here."""
        self.prompt_tokens += seq.prompt_len
        self.model.submit(self._register(seq), seq.prompt_len, seq.max_new, seq.prefill_only)
        self._kick()

    async def reserve(self, blocks: int, timeout_s: float) -> bool:
        """Wait until ``blocks`` are free with no request waiting ahead, and take them (a
        KV transfer's destination; ``Engine.reserve``). False after ``timeout_s``."""
        loop = asyncio.get_running_loop()

        async def take() -> None:
            async with self._changed:
                await self._changed.wait_for(lambda: self.engine.reserve(loop.time(), blocks))
        self._reserving += 1
        try:
            await asyncio.wait_for(take(), timeout_s)
            return True
        except asyncio.TimeoutError:
            return False
        finally:
            self._reserving -= 1

    def unreserve(self, blocks: int) -> None:
        """Give back blocks taken by ``reserve`` when the transfer they were for failed."""
        self.engine.release(blocks)
        self._freed()

    def join_decode(self, seq: Sequence, blocks: int) -> None:
        """Start decoding a request whose prompt KV (``blocks``, already reserved) arrived."""
        seq.scheduled_s = time.monotonic()
        self.model.join(self._register(seq), seq.prompt_len, seq.max_new, blocks)
        self._kick()

    def abort(self, seq: Sequence) -> None:
        """The client left: drop the request wherever it is and free its blocks (work in
        the running iteration leaves when it ends, as in vLLM)."""
        if seq.state is SeqState.DONE:
            return
        self.held.pop(seq.rid, None)
        seq.state = SeqState.DONE
        rid = self._ids.get(id(seq))
        if rid is not None:
            self.model.abort(rid)
            self._forget_if_gone(rid)
        self._freed()

    def release_held(self, rid: str) -> Sequence | None:
        """Hand over a held prefill's KV (the pull side calls this after the transfer)."""
        seq = self.held.pop(rid, None)
        if seq is not None:
            num = self._ids[id(seq)]
            self.model.release_held(num)
            seq.state = SeqState.DONE
            self._forget_if_gone(num)
            self._freed()
        return seq

    # --- the loop --------------------------------------------------------------------
    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        clock_s = loop.time()
        while True:
            if clock_s < loop.time() - MAX_LAG_S:  # the event loop stalled: the schedule slips
                self.slipped_s += loop.time() - MAX_LAG_S - clock_s
                clock_s = loop.time() - MAX_LAG_S
            end_s = self.model.plan(clock_s)
            self._mark_scheduled()
            if end_s is None:
                self._idle = True
                self._wake.clear()
                await self._wake.wait()
                clock_s = max(clock_s, self._woken_s)
                continue
            await asyncio.sleep(max(0.0, end_s - loop.time()))
            emissions = self.model.finish(end_s)
            clock_s = end_s
            for num in self._leaving:
                self._forget_if_gone(num)
            self._leaving.clear()
            self._deliver(emissions)
            if self.events is not None:
                self.events.flush()
            self._freed()

    def _kick(self) -> None:
        if self._idle:
            self._idle = False
            self._woken_s = asyncio.get_running_loop().time()
            self._wake.set()

    def _mark_scheduled(self) -> None:
        now = time.monotonic()
        for num in self.engine.started:
            seq = self.seqs.get(num)
            if seq is not None and seq.scheduled_s is None:
                seq.scheduled_s = now
        self.engine.started = []

    def _deliver(self, emissions) -> None:
        now = time.monotonic()
        for num, step in emissions:
            seq = self.seqs.get(num)
            if seq is None or seq.state is SeqState.DONE:
                continue
            if step is Step.TOKEN:
                if self.timings is not None:
                    self.timings.token(seq.arrived_s, seq.scheduled_s or now, seq.last_token_s, now)
                seq.first_token_s = seq.first_token_s or now
                seq.last_token_s = now
                seq.emit_token()
                self.generation_tokens += 1
            elif step is Step.HELD:
                seq.state = SeqState.HELD
                self.held[seq.rid] = seq
                seq.events.put_nowait(("done", "length"))
            else:
                self._end(num, seq)

    def _end(self, num: int, seq: Sequence) -> None:
        seq.state = SeqState.DONE
        self.finished += 1
        seq.events.put_nowait(("done", seq.finish_reason))
        if self.timings is not None and seq.first_token_s is not None and seq.last_token_s is not None:
            self.timings.finished(seq.arrived_s, seq.first_token_s, seq.last_token_s)
        self._forget_if_gone(num)

    # --- bookkeeping -----------------------------------------------------------------
    def _register(self, seq: Sequence) -> int:
        self._next += 1
        self.seqs[self._next] = seq
        self._ids[id(seq)] = self._next
        return self._next

    def _forget_if_gone(self, num: int) -> None:
        """Drop a request's entry once the engine model holds nothing of it (an abort in
        the running iteration leaves at its end: until then its block keys are needed)."""
        if num in self.engine.aborting:
            self._leaving.add(num)
            return
        seq = self.seqs.pop(num, None)
        if seq is not None:
            self._ids.pop(id(seq), None)

    def _block_keys(self, num: int, block_size: int) -> tuple[int, ...]:
        seq = self.seqs.get(num)
        return seq.block_keys(block_size) if seq is not None else ()

    def _freed(self) -> None:
        """Blocks may have freed: wake KV reservations waiting for room."""
        if self._reserving:
            asyncio.get_running_loop().create_task(self._notify())

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()
