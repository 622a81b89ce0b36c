"""An engine's KV blocks: reservations for arriving KV, a request's blocks freed or held
for an outgoing transfer, and prefix caching (``prefix_cache.PrefixCache``) at admission.
``Engine`` builds on this (and gives it ``waiting``); one class in two files, split for size."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from baton.core.instance import InstanceState
from baton.engine_model.work import EngineConfig, PrefillItem
from baton.engine_model.prefix_cache import PrefixCache

KeySource = Callable[[int, int], tuple[int, ...]]  # (request id, block size) -> its block keys


def _ceil_div(a, b: int):
    return -((-a) // b)


class KvBlocks:
    """KV block bookkeeping of one engine (``state.kv_blocks_used`` counts physical blocks)."""

    def __init__(self, state: InstanceState, config: EngineConfig, keys: KeySource | None) -> None:
        self.state, self.cfg = state, config
        self.cache = PrefixCache(state.kv_blocks_total) if config.enable_prefix_caching else None
        self._key_source = keys
        # Without any request's identity (``keys`` None) nothing can ever hit: the cache
        # only counts queries, and its free queue (anonymous runs alone) is not kept.
        self.tracks_blocks = self.cache is not None and keys is not None
        self.held_blocks: dict[int, int] = {}        # KV kept for outgoing transfers
        self.held_ctx: dict[int, int] = {}           # context tokens of held_blocks' requests

    def reserve(self, now_s: float, blocks: int) -> bool:
        """Take ``blocks`` KV blocks for arriving KV if they are free at ``now_s`` and no
        waiting request is ahead (vLLM admits its waiting queue in order, preempted
        requests first). The caller must then cut the running segment (``interrupt``):
        its block horizon assumed them free."""
        if blocks > self.state.kv_blocks_free_at(now_s) or self.waiting:
            return False
        self._allocate(blocks)
        return True

    def release(self, blocks: int) -> None:
        """Give back blocks that hold no request's KV (a reservation's margin)."""
        self.state.kv_blocks_used -= blocks
        if self.tracks_blocks and blocks > 0:
            self.cache.release(-1, blocks, (), 0)

    def free_request(self, req_id: int, blocks: int, ctx_tokens: int) -> None:
        """Free a request's ``blocks`` KV blocks holding ``ctx_tokens`` tokens; with prefix
        caching its full blocks stay cached in the free queue."""
        if not self.tracks_blocks:
            self.state.kv_blocks_used -= blocks
            return
        keys = self.keys_of(req_id)
        self.state.kv_blocks_used -= self.cache.release(req_id, blocks, keys, ctx_tokens // self.cfg.block_size)

    def hold(self, req_id: int, blocks: int, ctx_tokens: int) -> None:
        """Keep a request's KV here for an outgoing transfer (PD handoff, migration)."""
        self.held_blocks[req_id], self.held_ctx[req_id] = blocks, ctx_tokens

    def release_held(self, req_id: int) -> None:
        """Free the blocks kept here for a request's outgoing KV (``held_blocks``)."""
        self.free_request(req_id, self.held_blocks.pop(req_id), self.held_ctx.pop(req_id))

    def keys_of(self, req_id: int) -> tuple[int, ...]:
        """The request's block keys at this engine's block size (empty: content unknown)."""
        if self.cache is None or self._key_source is None:
            return ()
        return self._key_source(req_id, self.cfg.block_size)

    def _allocate(self, blocks: int) -> None:
        self.state.kv_blocks_used += blocks
        if self.tracks_blocks and blocks > 0:
            self.cache.allocate(blocks)

    def _grow_item(self, item: PrefillItem, chunk: int) -> None:
        extra = max(0, _ceil_div(item.done_tokens + chunk, self.cfg.block_size) - item.blocks)
        item.blocks += extra
        self._allocate(extra)

    def _trim_reservation(self, item: PrefillItem) -> None:
        """A migration reserved a margin above the context; rows must hold exactly what
        their context needs (segment block growth assumes it), so give the rest back."""
        excess = item.blocks - _ceil_div(item.total_tokens, self.cfg.block_size)
        if excess > 0:
            item.blocks -= excess
            self.release(excess)

    def _prefix_hit(self, item: PrefillItem) -> tuple[int, tuple[int, ...]]:
        """(cached blocks, their keys) a waiting request would start from: its longest
        cached prefix of full blocks, at most all but its last token (vLLM computes at least
        one). None for work that already holds blocks here (a migration's reservation)."""
        if self.cache is None or item.blocks or item.done_tokens:
            return 0, ()
        keys = self.keys_of(item.req_id)
        hit = self.cache.hit_blocks(keys, (item.total_tokens - 1) // self.cfg.block_size) if keys else 0
        return hit, keys[:hit]

    def _take_prefix(self, item: PrefillItem, keys: tuple[int, ...], done: int) -> None:
        """Admit with the cached prefix: its blocks are the request's, its tokens computed."""
        assert self.cache is not None
        self.cache.note_query(item.total_tokens, done)
        if not keys:
            return
        self.state.kv_blocks_used += self.cache.take_hits(item.req_id, keys)
        item.blocks, item.done_tokens = len(keys), done
        self.state.progress_prefill(item.req_id, done)


class EngineCaches:
    """The engines' prefix caches as a ``PrefixSource`` (what prefix-aware stages read in
    the simulator: the engine model's cache itself, as precise KV events would show it)."""

    def __init__(self, engines: Mapping[int, KvBlocks]) -> None:
        self.caches = [(i, e.cache) for i, e in engines.items() if e.cache is not None]

    def matches(self, keys: Sequence[int]) -> dict[int, int]:
        first, out = keys[0], {}
        for i, cache in self.caches:
            if cache.starts(first):  # most instances hold not even the first block
                out[i] = cache.hit_blocks(keys, len(keys))
        return out
