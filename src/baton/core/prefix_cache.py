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

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import compress, filterfalse, islice, repeat, takewhile
from operator import not_
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
    """Which free blocks hold which keys (LRU free queue) and which used blocks are shared.

    The free queue is an append-only log read from its front: ``refs`` maps each cached key
    to the number of requests holding it, or, while it is free, to minus its position in
    the log. A free key taken by a hit leaves a hole (None) in the log, so evicting n
    blocks from the front is a slice of the log, widened by the holes it spans, and one
    bulk delete: no Python-level step per block. Anonymous runs
    (free blocks without a key) sit in the log as one entry each, with a count. This keeps
    the simulator with caching on within a small factor of caching off."""

    total_blocks: int
    # every cached key -> requests holding it (> 0), or -(its log position) while free
    refs: dict = field(default_factory=dict)
    # request -> the keys of its first blocks, in order: a shared cached block, or None for
    # a block it computed whose key another block already caches (its own copy, private)
    held: dict[int, list[int | None]] = field(default_factory=dict)
    stats: CacheStats = field(default_factory=CacheStats)
    listener: CacheListener | None = None
    _log: list = field(default_factory=list)      # keys and _Anon runs, as freed
    _base: int = 1                                 # log position of _log[0]
    _front: int = 1                                # position of the next entry to evict
    _anon_at: deque = field(default_factory=deque)        # positions of the _Anon runs queued
    _free_keys: int = 0                            # keys in the queue
    _anon_blocks: int = 0                          # blocks in its anonymous runs

    def __post_init__(self) -> None:
        self._push([], self.total_blocks)

    @property
    def active(self) -> dict[int, int]:
        """Keys held by running requests -> how many hold each."""
        return {k: r for k, r in self.refs.items() if r > 0}

    # --- lookup -----------------------------------------------------------------------
    def hit_blocks(self, keys: Sequence[int], max_blocks: int) -> int:
        """Length of the longest prefix of ``keys`` cached here (held or free)."""
        return len(list(takewhile(self.refs.__contains__, islice(keys, max_blocks))))  # no copy of keys

    def free_hits(self, keys: Sequence[int]) -> int:
        """How many of ``keys`` sit in the free queue (taking them uses free blocks)."""
        return sum(map((0).__gt__, map(self.refs.__getitem__, keys)))

    def note_query(self, prompt_tokens: int, hit_tokens: int) -> None:
        self.stats.requests += 1
        self.stats.queries += prompt_tokens
        self.stats.hits += hit_tokens

    # --- blocks in ----------------------------------------------------------------------
    def take_hits(self, req_id: int, keys: Sequence[int]) -> int:
        """The request holds the cached ``keys`` (a prefix of its blocks); returns how many
        left the free queue (new physical blocks in use)."""
        counts = list(map(self.refs.__getitem__, keys))
        # held: one more holder; free (-position): now held once (max(c, 0) + 1 either way)
        self.refs.update(zip(keys, map((1).__add__, map(max, counts, repeat(0)))))
        # the free ones' log entries go stale: their positions, -c, less the log's base
        leaving = list(map((-self._base).__sub__, filter((0).__gt__, counts)))
        _drain(map(self._log.__setitem__, leaving, repeat(None)))
        self._free_keys -= len(leaving)
        self.held.setdefault(req_id, []).extend(keys)
        return len(leaving)

    def allocate(self, n: int) -> None:
        """Take ``n`` blocks from the front of the free queue, evicting the keys they held."""
        evicted: list[int] = []
        while n > 0:
            n = self._evict(n, evicted)
        if evicted and self.listener is not None:
            self.listener.removed(evicted)
        self._trim()

    def _evict(self, n: int, evicted: list[int]) -> int:
        """Evict up to ``n`` keys from the front, up to the next anonymous run, then take
        from that run; returns how many blocks are still wanted."""
        log, base, f = self._log, self._base, self._front
        end = base + len(log)
        anon = self._anon_at[0] if self._anon_at else end
        stop = min(f + n, anon)
        window = log[f - base:stop - base]
        holes = window.count(None)
        missing = holes
        while missing and stop < anon:  # each stale entry spanned widens the cut by one
            more = log[stop - base:min(stop + missing, anon) - base]
            stop += len(more)
            window += more
            missing = more.count(None)
            holes += missing
        keys = [k for k in window if k is not None] if holes else window
        _drain(map(self.refs.__delitem__, keys))
        evicted += keys
        self._free_keys -= len(keys)
        n -= len(keys)
        if n > 0 and stop == anon < end:
            run = log[anon - base]
            used = min(n, run.count)
            run.count -= used
            self._anon_blocks -= used
            n -= used
            if not run.count:
                self._anon_at.popleft()
                stop += 1
        elif n > 0 and stop >= end:
            raise RuntimeError(f"prefix cache: {n} more blocks wanted from an empty free queue")
        self._front = stop
        return n

    def register(self, req_id: int, keys: Sequence[int]) -> int:
        """Blocks the request just computed, in order after those it holds: each whose key
        is cached nowhere becomes a shared cached block; one whose key another block
        already caches (computed twice, as when two requests with one prefix run at once)
        stays the request's own, and the blocks after it are still cached. Returns how many
        were registered."""
        mine, refs = self.held.setdefault(req_id, []), self.refs
        start = len(mine)
        new = keys[start:]
        if not new:
            return 0
        if not any(map(refs.__contains__, new)):
            refs.update(dict.fromkeys(new, 1))
            mine.extend(new)
            stored = [(start, list(new))]
        else:
            indexed: list[tuple[int, int]] = []
            for j, k in enumerate(new, start):
                if k in refs:
                    mine.append(None)
                else:
                    refs[k] = 1
                    mine.append(k)
                    indexed.append((j, k))
            stored = _runs(indexed)
        if self.listener is not None:
            for first, run in stored:
                if run:
                    self.listener.stored(req_id, first, run)
        return sum(len(run) for _, run in stored)

    # --- blocks out ---------------------------------------------------------------------
    def release(self, req_id: int, blocks: int, keys: Sequence[int], full_blocks: int) -> int:
        """Free a request's ``blocks`` blocks (its shared ones first in its block list);
        ``keys`` are its block keys and ``full_blocks`` how many of its blocks are full.
        Returns the physical blocks freed (shared blocks still held by others are not)."""
        held = self.held.pop(req_id, [])
        mine = held if None not in held else [k for k in held if k is not None]
        private = blocks - len(mine)  # its own blocks: the duplicates in ``held``, then the rest
        # its later full blocks whose key nobody caches are cached as they are freed
        refs, start = self.refs, len(held)
        later = keys[start:min(len(mine) + private, full_blocks)]
        tail = list(filterfalse(refs.__contains__, later))
        if tail and self.listener is not None:
            for first, run in _runs([(start + j, k) for j, k in enumerate(later) if k not in refs]):
                self.listener.stored(req_id, first, run)
        tail.reverse()
        counts = list(map(refs.__getitem__, mine))
        if counts.count(1) == len(counts):  # nobody else holds them: all go back
            freed = mine[::-1]
        else:
            left = list(map((-1).__add__, counts))
            refs.update(zip(mine, left))
            freed = list(compress(reversed(mine), map(not_, reversed(left))))
        self._push(tail + freed, private - len(tail))
        return private + len(freed)

    def _push(self, keys: list[int], anon: int) -> None:
        """Append to the queue's tail: a run of ``anon`` blocks without keys, then ``keys``."""
        pos = self._base + len(self._log)
        if anon > 0:
            self._anon_at.append(pos)
            self._anon_blocks += anon
            self._log.append(_Anon(anon))
            pos += 1
        self.refs.update(zip(keys, range(-pos, -pos - len(keys), -1)))
        self._log += keys
        self._free_keys += len(keys)

    def _trim(self) -> None:
        """Drop the log's consumed front; rebuild it once stale entries outnumber the live."""
        consumed = self._front - self._base
        if len(self._log) - consumed > 2 * (self._free_keys + len(self._anon_at)) + 4096:
            self._rebuild()
        elif consumed > 4096 and consumed * 2 > len(self._log):
            del self._log[:consumed]
            self._base = self._front

    def _rebuild(self) -> None:
        entries = self._live_entries()
        self._base = self._front = self._base + len(self._log)
        self._log, self._anon_at = [], deque()
        self._free_keys = self._anon_blocks = 0
        for e in entries:  # rare: amortised over the stale entries it drops
            if e.__class__ is _Anon:
                self._push([], e.count)
            else:
                self._push([e], 0)

    def _live_entries(self) -> list:
        """The queue's entries from its front, stale ones left out."""
        refs, base = self.refs, self._base
        return [e for pos, e in enumerate(self._log[self._front - base:], self._front)
                if e is not None and (e.count > 0 if e.__class__ is _Anon else refs.get(e) == -pos)]

    def free_blocks(self) -> int:
        """Blocks in the free queue (cached or not): total minus the physical blocks in use."""
        return self._free_keys + self._anon_blocks

    def cached_keys(self) -> list[int]:
        """Keys of the cached free blocks, next to be evicted first."""
        return [e for e in self._live_entries() if e.__class__ is not _Anon]

    def holds(self, req_id: int) -> int:
        """How many shared blocks the request holds."""
        return sum(1 for k in self.held.get(req_id, ()) if k is not None)


def _drain(iterator) -> None:
    """Run an iterator of side effects at C speed."""
    deque(iterator, maxlen=0)
