"""vLLM v1's automatic prefix caching over one simulated engine's KV blocks.

Read from vLLM's ``v1/core/kv_cache_manager.py``, ``block_pool.py`` and
``kv_cache_utils.py``:

- full blocks are keyed by a chain: a block's key covers its parent's key and its own
  tokens (``baton.core.prefix.block_keys``), so equal keys mean equal prefixes;
- a request being scheduled from the waiting queue (new, or preempted and re-admitted)
  starts from its longest prefix of cached full blocks, never the whole prompt: at least
  its last token is computed (``max_hit_blocks``);
- a block a running request holds can be shared by any number of requests (reference
  counts); a computed full block is registered under its key, so a request arriving later
  hits it while its first owner still runs;
- freed blocks join the tail of one free queue in reverse order of their request (its last
  block first); allocation takes the queue's head, evicting the cached key it held. A cached
  block hit while free leaves the queue.

The engine keeps counting blocks (``kv_blocks_used`` is physical blocks in use); this class
knows which free blocks hold which key and which used blocks are shared. Blocks that hold
no key (partial blocks, tokens whose content is unknown) sit in the free queue as
anonymous runs.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol




def _runs(indexed: list[tuple[int, int]]) -> list[tuple[int, list[int]]]:
    """(index, key) pairs in index order as runs of consecutive indices: (first, keys)."""
    runs: list[tuple[int, list[int]]] = []
    for j, k in indexed:
        if runs and runs[-1][0] + len(runs[-1][1]) == j:
            runs[-1][1].append(k)
        else:
            runs.append((j, [k]))
    return runs


@dataclass(slots=True)
class CacheStats:
    """vLLM's prefix-cache counters: prompt tokens looked up and found (``queries`` and
    ``hits``, as ``vllm:prefix_cache_queries`` / ``_hits``), and requests looked up."""

    requests: int = 0
    queries: int = 0
    hits: int = 0


@dataclass(slots=True, eq=False)  # hashed by identity: each run is its own queue entry
class _Anon:
    """A run of free blocks that hold no key (a unique object, so runs never merge)."""

    count: int


class CacheListener(Protocol):
    """Told when blocks become cached and when cached blocks are evicted (vLLM's KV events:
    BlockStored, BlockRemoved)."""

    def stored(self, req_id: Any, first_index: int, keys: Sequence[int]) -> None: ...

    def removed(self, keys: Sequence[int]) -> None: ...

    def flush(self) -> None: ...


@dataclass(slots=True)
class PrefixCache:
    """Which free blocks hold which keys (LRU free queue) and which used blocks are shared."""

    total_blocks: int
    free: OrderedDict = field(default_factory=OrderedDict)  # key or _Anon -> None, head evicted first
    active: dict[int, int] = field(default_factory=dict)     # key -> requests holding it
    # request -> the keys of its first blocks, in order: a shared cached block, or None for
    # a block it computed whose key another block already caches (its own copy, private)
    held: dict[int, list[int | None]] = field(default_factory=dict)
    stats: CacheStats = field(default_factory=CacheStats)
    listener: CacheListener | None = None

    def __post_init__(self) -> None:
        self.free[_Anon(self.total_blocks)] = None

    # --- lookup -----------------------------------------------------------------------
    def hit_blocks(self, keys: Sequence[int], max_blocks: int) -> int:
        """Length of the longest prefix of ``keys`` cached here (held or free)."""
        n = 0
        for k in keys[:max_blocks]:
            if k not in self.active and k not in self.free:
                break
            n += 1
        return n

    def free_hits(self, keys: Sequence[int]) -> int:
        """How many of ``keys`` sit in the free queue (taking them uses free blocks)."""
        return sum(1 for k in keys if k in self.free)

    def note_query(self, prompt_tokens: int, hit_tokens: int) -> None:
        self.stats.requests += 1
        self.stats.queries += prompt_tokens
        self.stats.hits += hit_tokens

    # --- blocks in ----------------------------------------------------------------------
    def take_hits(self, req_id: int, keys: Sequence[int]) -> int:
        """The request holds the cached ``keys`` (a prefix of its blocks); returns how many
        left the free queue (new physical blocks in use)."""
        from_free = 0
        free, active = self.free, self.active
        for k in keys:
            if k in free:
                del free[k]
                from_free += 1
                active[k] = 1
            else:
                active[k] += 1
        self.held.setdefault(req_id, []).extend(keys)
        return from_free

    def allocate(self, n: int) -> None:
        """Take ``n`` blocks from the head of the free queue, evicting the keys they held."""
        free, evicted = self.free, []
        while n > 0:
            head, _ = free.popitem(last=False)
            if head.__class__ is _Anon:
                used = min(n, head.count)
                head.count -= used
                n -= used
                if head.count:  # the rest of the run stays at the head
                    free[head] = None
                    free.move_to_end(head, last=False)
            else:
                n -= 1
                evicted.append(head)
        if evicted and self.listener is not None:
            self.listener.removed(evicted)

    def register(self, req_id: int, keys: Sequence[int]) -> int:
        """Blocks the request just computed, in order after those it holds: each whose key
        is cached nowhere becomes a shared cached block; one whose key another block
        already caches (computed twice, as when two requests with one prefix run at once)
        stays the request's own, and the blocks after it are still cached. Returns how many
        were registered."""
        mine = self.held.setdefault(req_id, [])
        active, free, start = self.active, self.free, len(mine)
        stored: list[tuple[int, int]] = []
        for j in range(start, len(keys)):
            k = keys[j]
            if k in active or k in free:
                mine.append(None)
            else:
                active[k] = 1
                mine.append(k)
                stored.append((j, k))
        if stored and self.listener is not None:
            for first, run in _runs(stored):
                self.listener.stored(req_id, first, run)
        return len(stored)

    # --- blocks out ---------------------------------------------------------------------
    def release(self, req_id: int, blocks: int, keys: Sequence[int], full_blocks: int) -> int:
        """Free a request's ``blocks`` blocks (its shared ones first in its block list);
        ``keys`` are its block keys and ``full_blocks`` how many of its blocks are full.
        Returns the physical blocks freed (shared blocks still held by others are not)."""
        held = self.held.pop(req_id, [])
        mine = [k for k in held if k is not None]
        private = blocks - len(mine)  # its own blocks: the duplicates in ``held``, then the rest
        # its later full blocks whose key nobody caches are cached as they are freed
        active, free = self.active, self.free
        start = len(held)
        indexed = [(start + j, k) for j, k in enumerate(keys[start:min(len(mine) + private, full_blocks)])
                   if k not in active and k not in free]
        tail_keys = [k for _, k in indexed]
        if tail_keys and self.listener is not None:
            for first, run in _runs(indexed):
                self.listener.stored(req_id, first, run)
        anon = private - len(tail_keys)
        if anon > 0:
            self.free[_Anon(anon)] = None
        for k in reversed(tail_keys):
            self.free[k] = None
        freed = private
        for k in reversed(mine):
            left = self.active[k] - 1
            if left:
                self.active[k] = left
            else:
                del self.active[k]
                self.free[k] = None
                freed += 1
        return freed

    def free_blocks(self) -> int:
        """Blocks in the free queue (cached or not): total minus the physical blocks in use."""
        return sum(e.count if isinstance(e, _Anon) else 1 for e in self.free)

    def cached_keys(self) -> list[int]:
        """Keys of the cached free blocks, next to be evicted first."""
        return [e for e in self.free if not isinstance(e, _Anon)]

    def holds(self, req_id: int) -> int:
        """How many shared blocks the request holds."""
        return sum(1 for k in self.held.get(req_id, ()) if k is not None)
