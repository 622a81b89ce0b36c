"""The prefix cache against a plain reference model of vLLM's block pool: one ordered dict
as the free queue, one reference count per cached block, every step a loop per block. The
cache keeps runs of keys in a tree and its queue as entries of runs, for speed; random
operation sequences must give the same hits, evictions, freed counts, KV events and queue
order as the reference."""

from collections import OrderedDict

import numpy as np
import pytest

from baton.engine_model.prefix_cache import PrefixCache


class ReferencePool:
    """The free queue as an OrderedDict of keys and ("anon", n) runs; refs for held keys."""

    def __init__(self, total: int) -> None:
        self.free: OrderedDict = OrderedDict({("anon", 0): total})
        self.active: dict[int, int] = {}
        self.held: dict[int, list] = {}
        self.anons = 1
        self.evicted: list[int] = []
        self.stored: list[tuple] = []  # (request, first index, keys), consecutive indices merged

    def _store(self, req, indexed: list[tuple[int, int]]) -> None:
        for j, k in indexed:
            last = self.stored[-1] if self.stored else None
            if last is not None and last[0] == req and last[1] + len(last[2]) == j and last[3]:
                last[2].append(k)
            else:
                self.stored.append([req, j, [k], True])
        if self.stored:
            self.stored[-1][3] = False  # one call's runs never merge with the next call's

    def cached(self, k: int) -> bool:
        return k in self.active or k in self.free

    def hit_blocks(self, keys, limit: int) -> int:
        n = 0
        while n < min(limit, len(keys)) and self.cached(keys[n]):
            n += 1
        return n

    def take_hits(self, req: int, keys) -> int:
        out = 0
        for k in keys:
            if k in self.free:
                del self.free[k]
                out += 1
            self.active[k] = self.active.get(k, 0) + 1
        self.held.setdefault(req, []).extend(keys)
        return out

    def allocate(self, n: int) -> None:
        while n:
            head, count = next(iter(self.free.items()))
            if isinstance(head, tuple):
                used = min(n, count)
                n -= used
                if used == count:
                    del self.free[head]
                else:
                    self.free[head] = count - used
            else:
                del self.free[head]
                self.evicted.append(head)
                n -= 1

    def register(self, req: int, keys) -> int:
        mine = self.held.setdefault(req, [])
        new = []
        for j, k in enumerate(keys[len(mine):], len(mine)):
            if self.cached(k):
                mine.append(None)
            else:
                self.active[k] = 1
                mine.append(k)
                new.append((j, k))
        self._store(req, new)
        return len(new)

    def _anon(self, n: int) -> None:
        if n > 0:
            self.free[("anon", self.anons)] = n
            self.anons += 1

    def release(self, req: int, blocks: int, keys, full: int) -> int:
        held = self.held.pop(req, [])
        mine = [k for k in held if k is not None]
        private = blocks - len(mine)
        tail = [k for k in keys[len(held):min(len(mine) + private, full)] if not self.cached(k)]
        self._store(req, [(j, k) for j, k in enumerate(keys[len(held):min(len(mine) + private, full)], len(held))
                          if k in tail])
        self._anon(private - len(tail))
        for k in reversed(tail):
            self.free[k] = 1
        freed = private
        for k in reversed(mine):
            self.active[k] -= 1
            if not self.active[k]:
                del self.active[k]
                self.free[k] = 1
                freed += 1
        return freed

    def free_blocks(self) -> int:
        return sum(self.free.values())

    def cached_keys(self) -> list[int]:
        return [k for k in self.free if not isinstance(k, tuple)]


class Recorder:
    def __init__(self) -> None:
        self.removed_keys: list[int] = []
        self.stored_runs: list[tuple] = []

    def stored(self, req_id, first_index, keys) -> None:
        self.stored_runs.append((req_id, first_index, list(keys)))

    def removed(self, keys) -> None:
        self.removed_keys += keys

    def flush(self) -> None:
        pass


def _chain(ids: tuple[int, ...]) -> tuple[int, ...]:
    out, parent = [], 0
    for i in ids:
        parent = hash((parent, i))
        out.append(parent)
    return tuple(out)


def _drive(seed: int, total: int, steps: int) -> None:
    """Random requests over a few shared prefixes: admit (hit, take, allocate, register
    chunk by chunk), grow, and release, checking every answer against the reference."""
    rng = np.random.default_rng(seed)
    cache, ref, rec = PrefixCache(total), ReferencePool(total), Recorder()
    cache.listener = rec
    prefixes = [tuple(int(x) for x in rng.integers(0, 10**9, 40)) for _ in range(4)]
    # chained, as block keys are: a key names its whole prefix, so suffixes of few ids
    # still collide across requests only where their prefixes agree
    running: dict[int, list] = {}  # req -> [keys, blocks, computed blocks]
    for req in range(steps):
        if running and (rng.random() < 0.45 or cache.free_blocks() < 60):
            victim = int(rng.choice(list(running)))
            keys, blocks, done = running.pop(victim)
            assert cache.release(victim, blocks, keys, done) == ref.release(victim, blocks, keys, done)
        elif cache.free_blocks() >= 60:
            base = prefixes[int(rng.integers(0, len(prefixes)))][:int(rng.integers(1, 41))]
            ids = base + tuple(int(x) for x in rng.integers(0, 3, int(rng.integers(0, 12))))
            keys = _chain(ids)
            hit = cache.hit_blocks(keys, len(keys) - 1)
            assert hit == ref.hit_blocks(keys, len(keys) - 1)
            assert cache.free_hits(keys[:hit]) == sum(1 for k in keys[:hit] if k in ref.free)
            assert cache.take_hits(req, keys[:hit]) == ref.take_hits(req, keys[:hit])
            blocks, done = hit, hit
            for chunk in (5, 7, len(keys)):  # chunked prefill registers as chunks end
                upto = min(len(keys), done + chunk)
                cache.allocate(upto - done)
                ref.allocate(upto - done)
                blocks, done = blocks + upto - done, upto
                assert cache.register(req, keys[:done]) == ref.register(req, keys[:done])
            extra = int(rng.integers(0, 4))  # decode growth: full blocks (cached when freed), a partial one
            cache.allocate(extra)
            ref.allocate(extra)
            full = int(rng.integers(0, extra + 1))
            keys = _chain(ids + (9,) * full)  # the answer's full blocks follow the prompt's
            running[req] = [keys, blocks + extra, done + full]
        if rng.random() < 0.05 and running:  # preempted: freed, then admitted again on its own blocks
            victim = int(rng.choice(list(running)))
            keys, blocks, done = running.pop(victim)
            assert cache.release(victim, blocks, keys, done) == ref.release(victim, blocks, keys, done)
            hit = cache.hit_blocks(keys, len(keys) - 1)
            assert hit == ref.hit_blocks(keys, len(keys) - 1)
            if cache.free_blocks() >= hit + 5:
                assert cache.take_hits(victim, keys[:hit]) == ref.take_hits(victim, keys[:hit])
                cache.allocate(1)
                ref.allocate(1)
                running[victim] = [keys, hit + 1, hit]
        assert cache.free_blocks() == ref.free_blocks()
        assert cache.cached_keys() == ref.cached_keys()
        assert cache.active == ref.active
    assert rec.removed_keys == ref.evicted and len(ref.evicted) > 50  # eviction was exercised
    assert rec.stored_runs == [tuple(r[:3]) for r in ref.stored]
    assert sum(1 for r in ref.stored if r[1] >= 40) > 5  # answers' blocks were cached as they were freed


@pytest.mark.parametrize("seed", range(16))
def test_the_cache_matches_the_reference_pool_on_random_operations(seed):
    _drive(seed, total=400, steps=300)


def _drive_concurrent(seed: int, total: int, steps: int) -> dict[str, int]:
    """Batches of requests on one prefix admitted together, their chunks registered in
    turn: the later ones compute blocks the first already cached (duplicates, kept private)
    and register what follows under them, so evicting the first's blocks leaves cached runs
    below evicted ones. Returns how much of that happened (most ghost keys at once, and
    ghost keys cached again by a registration)."""
    rng = np.random.default_rng(seed)
    cache, ref, rec = PrefixCache(total), ReferencePool(total), Recorder()
    cache.listener = rec
    stems = [tuple(int(x) for x in rng.integers(0, 10**9, 12)) for _ in range(3)]
    running: dict[int, list] = {}
    seen = {"ghosts": 0, "revived": 0}
    for step in range(steps):
        req = 100 * step
        if running and (rng.random() < 0.4 or cache.free_blocks() < 120):
            for victim in rng.permutation(list(running))[:int(rng.integers(1, 3))]:
                keys, blocks, done = running.pop(int(victim))
                assert cache.release(int(victim), blocks, keys, done) == ref.release(int(victim), blocks, keys, done)
        elif cache.free_blocks() >= 120:
            stem = stems[int(rng.integers(0, len(stems)))]
            batch = []
            for j in range(int(rng.integers(2, 5))):
                ids = stem[:int(rng.integers(2, 13))] + tuple(int(x) for x in rng.integers(0, 2, int(rng.integers(0, 8))))
                keys = _chain(ids)
                hit = cache.hit_blocks(keys, len(keys) - 1)
                assert hit == ref.hit_blocks(keys, len(keys) - 1)
                assert cache.take_hits(req + j, keys[:hit]) == ref.take_hits(req + j, keys[:hit])
                batch.append([req + j, keys, hit, hit])
            for chunk in (2, 3, 20):  # chunks end in turn: later requests duplicate earlier blocks
                for item in batch:
                    rid, keys, blocks, done = item
                    upto = min(len(keys), done + chunk)
                    cache.allocate(upto - done)
                    ref.allocate(upto - done)
                    ghosts_before = _ghosts(cache)
                    assert cache.register(rid, keys[:upto]) == ref.register(rid, keys[:upto])
                    seen["revived"] += max(0, ghosts_before - _ghosts(cache))
                    item[2:] = [blocks + upto - done, upto]
            for rid, keys, blocks, done in batch:
                running[rid] = [keys, blocks, done]
        seen["ghosts"] = max(seen["ghosts"], _ghosts(cache))
        assert cache.free_blocks() == ref.free_blocks()
        assert cache.cached_keys() == ref.cached_keys()
        assert cache.active == ref.active
    assert rec.removed_keys == ref.evicted
    assert rec.stored_runs == [tuple(r[:3]) for r in ref.stored]
    return seen


def _ghosts(cache: PrefixCache) -> int:
    """Keys of the ghost runs in the cache's tree (evicted keys kept as the path to cached ones)."""
    stack, n = [cache._root], 0
    while stack:
        node = stack.pop()
        for c in node.children.values():
            assert c.parent is node and (c.ref >= 0 or c.children)  # a ghost always leads somewhere
            n += len(c.run) if c.ref < 0 else 0
            stack.append(c)
    return n


def test_duplicated_blocks_and_runs_below_evicted_ones_match_the_reference():
    seen = [_drive_concurrent(seed, total=150, steps=250) for seed in range(12)]
    assert sum(s["ghosts"] for s in seen) > 10


def test_an_evicted_block_with_cached_blocks_below_is_a_ghost_until_computed_again():
    cache, ref = PrefixCache(15), ReferencePool(15)
    k1, k2, k3 = _chain((1, 2, 3)), _chain((1, 2, 4)), _chain((1, 2, 4, 5))

    def both(method, *args):
        got = getattr(cache, method)(*args)
        assert got == getattr(ref, method)(*args), method
        assert cache.free_blocks() == ref.free_blocks() and cache.cached_keys() == ref.cached_keys()
        assert cache.active == ref.active
        return got

    for blocks in (3, 3, 5):  # 1 and 2 admitted together (neither hits), and 4 without keys
        both("allocate", blocks)
    assert both("register", 1, k1) == 3
    assert both("register", 2, k2) == 1  # its first two blocks duplicate 1's; its third hangs below them
    assert both("release", 1, 3, k1, 3) == 3
    both("allocate", 6)  # the free run goes, then 1's last two blocks: the second has 2's below it
    assert both("release", 4, 5, (), 0) == 5
    assert _ghosts(cache) == 1 and both("hit_blocks", k3, 3) == 1
    assert both("take_hits", 3, k3[:1]) == 1
    both("allocate", 3)
    assert both("register", 3, k3) == 2  # the ghost is cached again; 2's block stays 2's
    assert _ghosts(cache) == 0 and both("hit_blocks", k3, 4) == 4
    assert both("release", 2, 3, k2, 3) == 3 and both("release", 3, 4, k3, 4) == 4


def test_the_log_is_compacted_and_still_matches_over_a_long_run():
    _drive(11, total=200, steps=3000)
    cache = PrefixCache(50)
    for req in range(4000):  # take and free one hot block over and over: emptied entries pile up
        if req == 0:
            cache.allocate(1)
            cache.register(0, [7])
        else:
            cache.take_hits(req, [7])
        cache.release(req, 1, [7], 1)
    assert cache.cached_keys() == [7] and cache.free_blocks() == 50
    assert len(cache._queue) < 2 * 1024 + 16  # entries hits emptied are dropped, not kept forever
