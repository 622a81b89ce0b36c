"""vLLM v1's automatic prefix caching over one engine's KV blocks, kept as runs.

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
no key (partial blocks, duplicates, tokens whose content is unknown) sit in the free queue
as anonymous runs.

The semantics are block by block (``tests/core/test_prefix_cache.py`` checks them against a
plain per-block pool); the representation is by runs, so that a request costs a walk over
its prompt's branch points, not a step per block. Cached keys form a radix tree of chained
keys (``prefix_tree``); each node is a run of keys in one state: held (by ``ref`` requests),
free (in one free-queue entry), or a *ghost* (evicted, kept only because cached runs hang
below it: a duplicate's successors can outlive the block it duplicated). A free-queue entry
is a run of a chain read upwards from its deepest node: what one release freed, in the
order vLLM evicts it. A hit takes a prompt's leading keys, so it only ever shortens an
entry from its top, and eviction only ever eats an entry from its bottom.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

from baton.core.prefix_tree import hang_below, shared_length
from baton.engine_model.prefix_parts import (GHOST, AnonRun, CacheListener, CacheStats, FreeRun, Node,
                                            add_run, contiguous)

class PrefixCache:
    """Which free blocks hold which keys (LRU free queue) and which used blocks are shared."""

    def __init__(self, total_blocks: int) -> None:
        self.total_blocks = total_blocks
        self.stats = CacheStats()
        self.listener: CacheListener | None = None
        self._root = Node([], None, GHOST)
        # request -> [blocks accounted (shared or its own duplicates), its shared [first, count] runs]
        self.held: dict[Any, list] = {}
        self._queue: deque = deque([AnonRun(total_blocks)])
        self._free_keys = 0      # cached keys in the queue
        self._anon_blocks = total_blocks
        self._dead = 0           # entries emptied by hits, still queued

    # --- lookup -----------------------------------------------------------------------
    def hit_blocks(self, keys: Sequence[int], max_blocks: int) -> int:
        """Length of the longest prefix of ``keys`` cached here (held or free)."""
        node, pos, n = self._root, 0, min(len(keys), max_blocks)
        while pos < n:
            child = node.children.get(keys[pos])
            if child is None or child.ref == GHOST:
                break
            run = child.run
            if pos + len(run) <= len(keys) and run[-1] == keys[pos + len(run) - 1]:
                pos += len(run)  # the whole run (chained keys: its last key settles it)
                node = child
                continue
            pos += shared_length(run, keys, pos)
            break
        return min(pos, n)

    def starts(self, key: int) -> bool:
        """Whether a prompt whose first key is ``key`` would hit at least one block."""
        child = self._root.children.get(key)
        return child is not None and child.ref != GHOST

    def free_hits(self, keys: Sequence[int]) -> int:
        """How many of ``keys`` (cached, a prompt's leading blocks) sit in the free queue."""
        node, pos, n, free = self._root, 0, len(keys), 0
        while pos < n:
            node = node.children[keys[pos]]
            t = min(len(node.run), n - pos)
            if node.ref == 0:
                free += t
            pos += t
        return free

    def note_query(self, prompt_tokens: int, hit_tokens: int) -> None:
        self.stats.requests += 1
        self.stats.queries += prompt_tokens
        self.stats.hits += hit_tokens

    # --- blocks in ----------------------------------------------------------------------
    def take_hits(self, req_id: Any, keys: Sequence[int]) -> int:
        """The request holds the cached ``keys`` (a prefix of its blocks); returns how many
        left the free queue (new physical blocks in use)."""
        leaving = 0
        for node, _ in self._cover(keys, 0, len(keys), create=False):
            if node.ref == 0:  # the entry loses its top: hits take leading keys
                entry = node.entry
                entry.count -= len(node.run)
                if not entry.count:
                    self._dead += 1
                node.entry = None
                leaving += len(node.run)
            node.ref += 1
            node.owner = req_id if node.ref == 1 else None
        self._free_keys -= leaving
        mine = self.held.setdefault(req_id, [0, []])
        add_run(mine[1], mine[0], mine[0] + len(keys))
        mine[0] += len(keys)
        return leaving

    def register(self, req_id: Any, keys: Sequence[int]) -> int:
        """Blocks the request just computed, in order after those it holds: each whose key
        is cached nowhere becomes a shared cached block; one whose key another block
        already caches (computed twice, as when two requests with one prefix run at once)
        stays the request's own, and the blocks after it are still cached. Returns how many
        were registered."""
        mine = self.held.setdefault(req_id, [0, []])
        start, end = mine[0], len(keys)
        if end <= start:
            return 0
        mine[0] = end
        stored: list[list[int]] = []  # [first index, count] runs
        leaf = self._extendable(req_id, keys, start)
        if leaf is not None:  # its own run goes on: one extension, no walk
            leaf.run.extend(keys[start:end])
            add_run(mine[1], start, end)
            stored.append([start, end - start])
        else:
            for node, pos in self._cover(keys, start, end, create=True):
                if node.ref == GHOST:
                    node.ref, node.owner = 1, req_id
                    add_run(mine[1], pos, pos + len(node.run))
                    add_run(stored, pos, pos + len(node.run))
        if self.listener is not None:
            for first, count in stored:
                self.listener.stored(req_id, first, list(keys[first:first + count]))
        return sum(c for _, c in stored)

    def allocate(self, n: int) -> None:
        """Take ``n`` blocks from the front of the free queue, evicting the keys they held."""
        evicted: list[int] | None = [] if self.listener is not None else None
        queue = self._queue
        while n > 0:
            if not queue:
                raise RuntimeError(f"prefix cache: {n} more blocks wanted from an empty free queue")
            entry = queue[0]
            if entry.__class__ is AnonRun:
                used = min(n, entry.count)
                entry.count -= used
                self._anon_blocks -= used
                n -= used
            elif entry.count:
                used = self._evict(entry, n, evicted)
                self._free_keys -= used
                n -= used
            else:
                self._dead -= 1
            if not entry.count:
                queue.popleft()
        if evicted:
            self.listener.removed(evicted)

    # --- blocks out ---------------------------------------------------------------------
    def release(self, req_id: Any, blocks: int, keys: Sequence[int], full_blocks: int) -> int:
        """Free a request's ``blocks`` blocks (its shared ones first in its block list);
        ``keys`` are its block keys and ``full_blocks`` how many of its blocks are full.
        Returns the physical blocks freed (shared blocks still held by others are not)."""
        acc, runs = self.held.pop(req_id, (0, []))
        private = blocks - sum(c for _, c in runs)
        # its later full blocks whose key nobody caches are cached as they are freed
        tail: list[tuple[Node, int]] = []
        end = min(blocks, full_blocks, len(keys))
        if end > acc:
            tail = [(n, pos) for n, pos in self._cover(keys, acc, end, create=True) if n.ref == GHOST]
            if tail and self.listener is not None:
                for group in contiguous(tail):
                    first = group[0][1]
                    self.listener.stored(req_id, first, list(keys[first:group[-1][1] + len(group[-1][0].run)]))
        freed: list[tuple[Node, int]] = []
        for lo, count in runs:
            for node, pos in self._cover(keys, lo, lo + count, create=False):
                node.ref -= 1
                node.owner = None
                if not node.ref:
                    freed.append((node, pos))
        anon = private - sum(len(n.run) for n, _ in tail)
        if anon > 0:
            self._queue.append(AnonRun(anon))
            self._anon_blocks += anon
        for nodes in (tail, freed):
            for group in reversed(contiguous(nodes)):  # the last blocks go first
                self._push(group)
        self._trim()
        return private + sum(len(n.run) for n, _ in freed)

    def free_blocks(self) -> int:
        """Blocks in the free queue (cached or not): total minus the physical blocks in use."""
        return self._free_keys + self._anon_blocks

    def cached_keys(self) -> list[int]:
        """Keys of the cached free blocks, next to be evicted first."""
        out: list[int] = []
        for entry in self._queue:
            if entry.__class__ is FreeRun and entry.count:
                node, left = entry.bottom, entry.count
                while left:
                    take = min(left, len(node.run))
                    out.extend(reversed(node.run[len(node.run) - take:]))
                    left -= take
                    node = node.parent
        return out

    @property
    def active(self) -> dict[int, int]:
        """Keys held by running requests -> how many hold each."""
        out, stack = {}, [self._root]
        while stack:
            node = stack.pop()
            if node.ref > 0:
                out.update(dict.fromkeys(node.run, node.ref))
            stack.extend(node.children.values())
        return out

    def holds(self, req_id: Any) -> int:
        """How many shared blocks the request holds."""
        return sum(c for _, c in self.held.get(req_id, (0, []))[1])

    # --- the tree -----------------------------------------------------------------------
    def _cover(self, keys: Sequence[int], lo: int, hi: int, create: bool) -> list[tuple[Node, int]]:
        """The nodes holding ``keys[lo:hi]`` in chain order, each with the index of its
        first key, split so that they cover exactly that range; a missing part of the
        chain up to ``hi`` is created as ghosts (``create``), else the cover stops there."""
        out, node, pos = [], self._root, 0
        while pos < hi:
            child = node.children.get(keys[pos])
            if child is None:
                if not create:
                    break
                child = node.children[keys[pos]] = Node(list(keys[pos:hi]), node, GHOST)
            else:
                run = child.run
                t = len(run) if len(run) <= hi - pos else hi - pos
                if run[t - 1] != keys[pos + t - 1]:  # the chain leaves the run before: bisect
                    t = shared_length(run, keys, pos)
                if t < len(run):
                    self._split(child, t)
            if pos < lo < pos + len(child.run):
                child = self._split(child, lo - pos)
                pos = lo
            if pos >= lo:
                out.append((child, pos))
            node, pos = child, pos + len(child.run)
        return out

    def _split(self, node: Node, t: int) -> Node:
        """Cut ``node`` after ``t`` keys; the lower part keeps its state (and entry: it is
        the deeper part, so an entry whose bottom the node was now starts from it)."""
        lower = hang_below(node, t, Node(node.run[t:], node, node.ref))
        lower.entry, lower.owner = node.entry, node.owner
        if node.entry is not None and node.entry.bottom is node:
            node.entry.bottom = lower
        return lower

    def _extendable(self, req_id: Any, keys: Sequence[int], start: int) -> Node | None:
        """The run the request registered last, when its next keys can simply extend it:
        it ends at ``start``, it alone holds it, no run hangs below it, and none of the
        new keys is cached yet (they would hang below it)."""
        runs = self.held[req_id][1]
        if not runs or runs[-1][0] + runs[-1][1] != start:
            return None
        node, pos = self._root, 0
        while pos < start:  # the node holding key start - 1, read without splitting
            node = node.children.get(keys[pos])
            if node is None:
                return None
            pos += len(node.run)
        if pos != start or node.children or node.ref != 1 or node.owner != req_id:
            return None
        return node

    def _evict(self, entry: FreeRun, n: int, evicted: list[int] | None) -> int:
        """Evict up to ``n`` keys from the bottom of ``entry``; returns how many."""
        done = 0
        while done < n and entry.count:
            node = entry.bottom
            take = min(n - done, entry.count, len(node.run))
            cut = len(node.run) - take
            if evicted is not None:
                evicted.extend(reversed(node.run[cut:]))
            entry.count -= take
            done += take
            if cut:  # its upper part stays free, in the entry
                if node.children:  # the evicted keys stay as a ghost: runs hang below them
                    lower = self._split(node, cut)
                    lower.ref, lower.entry = GHOST, None
                    entry.bottom = node
                else:
                    del node.run[cut:]
                continue
            entry.bottom = node.parent
            node.entry = None
            if node.children:
                node.ref = GHOST
            else:
                self._detach(node)
        return done

    def _detach(self, node: Node) -> None:
        """Take ``node`` (no children) out of the tree, and ghosts left with no child."""
        parent = node.parent
        del parent.children[node.run[0]]
        node.parent = None
        if parent is not self._root and parent.ref == GHOST and not parent.children:
            self._detach(parent)

    def _push(self, group: list[tuple[Node, int]]) -> None:
        """Queue a run of consecutive nodes of a chain (free now), to be evicted last key first."""
        count = sum(len(n.run) for n, _ in group)
        entry = FreeRun(group[-1][0], count)
        for node, _ in group:
            node.ref, node.entry, node.owner = 0, entry, None
        self._queue.append(entry)
        self._free_keys += count

    def _trim(self) -> None:
        """Drop the entries hits emptied once they outnumber the live ones."""
        if self._dead > len(self._queue) // 2 + 1024:
            self._queue = deque(e for e in self._queue if e.__class__ is AnonRun or e.count)
            self._dead = 0
