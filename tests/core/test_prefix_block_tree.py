"""The run-based per-block LRU against the per-block LRU it represents (an OrderedDict of
keys per instance, held keys touched before new ones, the oldest keys evicted one by one),
with capacities small enough that eviction leaves holes in prompts."""

from __future__ import annotations

import random
from collections import OrderedDict

import pytest

from baton.core.prefix import token_block_keys
from baton.core.prefix_block_tree import BlockLruTree
from tests.core.test_prefix_index import scan


class PerBlockLru:
    """The reference: one OrderedDict of keys per instance, matched block by block."""

    def __init__(self) -> None:
        self.lru: dict[int, OrderedDict] = {}

    def record(self, iid: int, keys, capacity: int) -> None:
        lru = self.lru.setdefault(iid, OrderedDict())
        held = [k for k in keys if k in lru]
        for k in held:
            lru.move_to_end(k)
        for k in keys:
            if k not in held:
                lru[k] = None
        while len(lru) > capacity:
            lru.popitem(last=False)

    def matches(self, keys) -> dict[int, int]:
        return scan(self.lru, keys)


def keys_of(*blocks: int) -> list[int]:
    """Chained keys of a prompt whose blocks are the given ids (one token each)."""
    return token_block_keys(list(blocks), 1)


def prompt(rng: random.Random, stems: list[list[int]]) -> list[int]:
    """A prompt that continues a stem drawn before (a conversation's next turn, another
    request on a shared system prompt) or starts a new one; stems grow as prompts do."""
    stem = list(rng.choice(stems)) if stems and rng.random() < 0.8 else []
    stem = stem[:rng.randrange(len(stem) + 1)] if rng.random() < 0.4 else stem
    stem += [rng.randrange(4) for _ in range(rng.randrange(0, 6))]
    stems.append(stem)
    return keys_of(*stem)


def attached(tree: BlockLruTree):
    stack, out = [tree._root], []
    while stack:
        node = stack.pop()
        for c in node.children.values():
            assert c.parent is node and (c.stamps or c.children)  # nothing dead stays attached
            out.append(c)
            stack.append(c)
    return out


@pytest.mark.parametrize("seed", range(16))
def test_matches_and_sizes_agree_with_a_per_block_lru(seed):
    rng = random.Random(seed)
    tree, ref = BlockLruTree(), PerBlockLru()
    caps = {i: rng.choice([3, 8, 20, 60]) for i in range(4)}
    stems: list[list[int]] = []
    for step in range(500):
        keys = prompt(rng, stems)
        assert tree.matches(keys) == ref.matches(keys), (seed, step)
        iid = rng.randrange(4)
        tree.record(iid, keys, caps[iid])
        ref.record(iid, keys, caps[iid])
        assert tree.matches(keys) == ref.matches(keys), (seed, step)
        for i in caps:
            assert tree.size(i) == len(ref.lru.get(i, ())), (seed, step, i)
    nodes = attached(tree)
    for i in caps:  # a group's held keys: the run from its offset on
        assert tree.size(i) == sum(len(n.run) - n.stamps[i][1] for n in nodes if i in n.stamps)
    assert all(len(h) <= 2 * tree.size(i) + 1025 for i, h in tree._heaps.items())


def test_a_prompts_first_blocks_go_first_and_leave_a_hole():
    tree = BlockLruTree()
    p = keys_of(1, 2, 3, 4)
    tree.record(0, p, 4)
    tree.record(0, keys_of(9), 4)  # one over: p's first block goes, the other three stay
    assert tree.size(0) == 4 and tree.matches(p) == {}
    assert tree.matches(keys_of(9)) == {0: 1}
    tree.record(0, p, 4)  # held 2-4 touched first, then 1 (new again); then 9 goes
    assert tree.matches(p) == {0: 4} and tree.matches(keys_of(9)) == {}
    tree.record(0, keys_of(5), 4)  # the oldest key is now 2 (held, touched first): a hole at 2
    assert tree.matches(p) == {0: 1}


def test_instances_share_runs_but_evict_separately():
    tree = BlockLruTree()
    tree.record(0, keys_of(1, 2, 3), 10)
    tree.record(1, keys_of(1, 2, 7), 3)
    assert tree.matches(keys_of(1, 2, 3)) == {0: 3, 1: 2}
    tree.record(1, keys_of(8), 3)  # 1 drops its key 1 only
    assert tree.matches(keys_of(1, 2, 7)) == {0: 2}
    assert tree.size(0) == 3 and tree.size(1) == 3


def test_a_run_nobody_holds_is_detached():
    tree = BlockLruTree()
    tree.record(0, keys_of(1, 2, 3), 3)
    tree.record(0, keys_of(4, 5, 6), 3)
    assert attached(tree) and all(n.run[0] == keys_of(4)[0] for n in tree._root.children.values())
    assert tree.matches([]) == {}
