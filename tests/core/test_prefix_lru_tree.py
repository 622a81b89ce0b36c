"""SGLang's approximate tree over block keys: leaf-LRU eviction per instance, sizes, and
matches that stay whole leading runs."""

from __future__ import annotations

import random

import pytest

from baton.core.prefix import token_block_keys
from baton.core.prefix_lru_tree import LruPrefixTree


def keys_of(*blocks: int) -> list[int]:
    """Chained keys of a prompt whose blocks are the given ids (one token each)."""
    return token_block_keys(list(blocks), 1)


def test_the_least_recently_used_leaf_goes_first_and_an_access_renews_it():
    tree = LruPrefixTree()
    p1, p2, p3 = keys_of(1, 2, 3, 4, 5, 6), keys_of(1, 2, 3, 4, 7, 8), keys_of(9, 9, 9, 9)
    tree.record(0, p1, 10)
    tree.record(0, p2, 10)
    assert tree.size(0) == 8  # the shared four blocks count once
    tree.record(0, p3, 10)  # 12 > 10: p1's own leaf (5, 6) is the oldest
    assert tree.size(0) == 10 and tree.matches(p1) == {0: 4} and tree.matches(p2) == {0: 6}
    tree.record(0, p1, 10)  # p1 is back; now p2's leaf is the oldest
    assert tree.matches(p1) == {0: 6} and tree.matches(p2) == {0: 4} and tree.size(0) == 10


def test_a_parent_left_without_children_becomes_a_leaf():
    tree = LruPrefixTree()
    tree.record(0, keys_of(1, 2, 3, 4, 5, 6), 100)
    tree.record(1, keys_of(1, 2, 3, 4), 100)  # splits the run: (1-4) held by both, (5, 6) by 0
    tree.record(0, keys_of(7, 8, 9), 5)  # 9 > 5: (5, 6) goes, then (1-4), now a leaf of 0
    assert tree.matches(keys_of(1, 2, 3, 4, 5, 6)) == {1: 4}
    assert tree.matches(keys_of(7, 8, 9)) == {0: 3} and tree.size(0) == 3 and tree.size(1) == 4


def test_instances_are_evicted_separately_and_sizes_read_as_a_column():
    tree = LruPrefixTree()
    tree.record(0, keys_of(1, 2), 2)
    tree.record(1, keys_of(1, 2, 3), 10)
    tree.record(0, keys_of(4, 5), 2)  # evicts 0's (1, 2) only
    assert tree.matches(keys_of(1, 2, 3)) == {1: 3}
    assert tree.sizes([0, 1, 2]).tolist() == [2, 3, 0]


def held_nodes(tree: LruPrefixTree, iid: int):
    stack, out = [tree._root], []
    while stack:
        node = stack.pop()
        for c in node.children.values():
            assert c.parent is node and c.stamps  # attached nodes have holders
            if iid in c.stamps:
                assert node is tree._root or iid in node.stamps  # whole leading runs only
                out.append(c)
            stack.append(c)
    return out


@pytest.mark.parametrize("seed", range(10))
def test_invariants_hold_over_random_prompts(seed):
    rng = random.Random(seed)
    tree, caps = LruPrefixTree(), {0: 6, 1: 15, 2: 40}
    for _ in range(600):
        prompt = keys_of(*[rng.randrange(3) for _ in range(rng.randrange(1, 10))])
        iid = rng.randrange(3)
        tree.record(iid, prompt, caps[iid])
        if len(prompt) <= caps[iid]:  # the newest prompt is never what makes room
            assert tree.matches(prompt)[iid] == len(prompt)
        for i, cap in caps.items():
            nodes = held_nodes(tree, i)
            assert tree.size(i) == sum(len(n.run) for n in nodes) <= cap
        for i, m in tree.matches(prompt).items():
            assert 0 < m <= len(prompt)
    assert all(len(h) <= 2 * tree.size(i) + 1025 for i, h in tree._leaves.items())
