"""The stamped prefix tree against a per-block model of the same semantics: a block is
held by an instance until the latest stamp of any prompt recorded there that covers it."""

from __future__ import annotations

import random

import pytest

from baton.core.prefix import token_block_keys
from baton.core.prefix_tree import StampedPrefixTree


class PerBlock:
    """The reference: (instance, key) -> latest stamp, matched block by block."""

    def __init__(self) -> None:
        self.stamps: dict[tuple[int, int], float] = {}

    def record(self, iid: int, keys, stamp: float) -> None:
        for k in keys:
            self.stamps[iid, k] = stamp

    def matches(self, keys, above: float, instances) -> dict[int, int]:
        out = {}
        for iid in instances:
            run = 0
            while run < len(keys) and self.stamps.get((iid, keys[run]), above) > above:
                run += 1
            if run:
                out[iid] = run
        return out


def prompt(rng: random.Random, branches: int) -> list[int]:
    """Chained keys of a prompt drawn from a few shared stems, so prompts share prefixes
    of every length and end inside each other's runs."""
    blocks = [rng.randrange(branches) for _ in range(rng.randrange(1, 12))]
    return token_block_keys([t for b in blocks for t in (b,) * 2], 2)


@pytest.mark.parametrize("seed", range(12))
def test_matches_agree_with_a_per_block_model_under_expiry(seed):
    rng = random.Random(seed)
    tree, ref = StampedPrefixTree(), PerBlock()
    ttl, now = rng.choice([0.5, 2.0, 10.0]), 0.0
    for _ in range(400):
        now += rng.expovariate(4.0)
        keys = prompt(rng, 3)
        tree.expire(now)
        assert tree.matches(keys, now) == ref.matches(keys, now, range(4)), (seed, now)
        iid = rng.randrange(4)
        tree.record(iid, keys, now + ttl)
        ref.record(iid, keys, now + ttl)
    assert tree.matches([], now) == {}


def test_expired_prompts_leave_no_nodes_behind():
    tree = StampedPrefixTree()
    for t in range(50):
        tree.record(t % 3, token_block_keys(list(range(t % 7 + 1)) * 4, 2), float(t))
    tree.expire(49.0)
    assert len(tree) == 0 and tree._root.children == {}


def test_a_refreshed_prompt_outlives_its_first_recording():
    tree = StampedPrefixTree()
    keys = token_block_keys(list(range(40)), 4)
    tree.record(1, keys[:6], 1.0)
    tree.record(1, keys, 5.0)  # the longer prompt refreshes the shared six blocks
    tree.expire(2.0)
    assert tree.matches(keys, 2.0) == {1: 10}
    assert tree.matches(keys[:3] + [7], 2.0) == {1: 3}  # leaves the run after three blocks
    tree.expire(5.0)
    assert tree.matches(keys, 5.0) == {}
