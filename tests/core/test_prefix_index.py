"""The block index's matches against a per-instance scan: leading runs with holes, runs
whose holders are all the same (the fast path) and runs where holders drop out."""

from __future__ import annotations

import random

import pytest

from baton.core.prefix import token_block_keys
from baton.core.prefix_index import PrefixIndex


def scan(held, keys) -> dict[int, int]:
    """Instance -> leading ``keys`` found in its container of ``held`` (absent when none):
    the block-by-block answer every prefix structure is checked against."""
    out = {}
    for i, ks in held.items():
        run = 0
        while run < len(keys) and keys[run] in ks:
            run += 1
        if run:
            out[i] = run
    return out


@pytest.mark.parametrize("seed", range(20))
def test_matches_agree_with_a_per_instance_scan(seed):
    rng = random.Random(seed)
    instances = rng.choice([3, 70, 1024])
    keys = token_block_keys(list(range(40)), 2)
    index, held = PrefixIndex(), {}
    for i in rng.sample(range(instances), k=min(instances, rng.randrange(1, 6))):
        start, stop = rng.choice([0, 0, 0, rng.randrange(20)]), rng.randrange(1, 21)
        ks = keys[start:stop]
        if rng.random() < 0.3 and len(ks) > 2:  # a hole inside the run
            del ks[rng.randrange(1, len(ks))]
        index.add(i, ks)
        held[i] = set(ks)
    for n in (0, 1, 5, 20):
        assert index.matches(keys[:n]) == scan(held, keys[:n]), (seed, n)


def test_the_same_holders_all_along_give_every_one_the_whole_run():
    index, keys = PrefixIndex(), token_block_keys(list(range(30)), 3)
    for i in (5, 700, 1023):
        index.add(i, keys[:7])
    assert index.matches(keys) == {5: 7, 700: 7, 1023: 7}
    index.remove(700, keys[3:4])
    assert index.matches(keys) == {5: 7, 700: 3, 1023: 7}
