"""Chained block keys (core/prefix.py)."""

import numpy as np
import pytest

from baton.core.prefix import token_block_keys


def reference_keys(token_ids, block_size, parent=0):
    """The definition: each full block's key hashes its parent's key and its tokens."""
    out = []
    for i in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash((parent, tuple(token_ids[i:i + block_size])))
        out.append(parent)
    return out


@pytest.mark.parametrize("n", [0, 1, 15, 16, 17, 32, 2000, 2007])
@pytest.mark.parametrize("block_size", [1, 16, 512])
def test_token_block_keys_are_the_chained_hashes_of_the_full_blocks(n, block_size):
    ids = np.random.default_rng(n).integers(0, 50_000, n).tolist()
    keys = token_block_keys(ids, block_size)
    assert keys == reference_keys(ids, block_size)
    assert len(keys) == n // block_size
    assert token_block_keys(tuple(ids), block_size, parent=7) == reference_keys(ids, block_size, parent=7)
    assert token_block_keys(np.array(ids, dtype=np.int64), block_size) == keys  # numpy ints hash as ints


def test_a_block_key_names_its_whole_prefix():
    a = token_block_keys([1] * 16 + [2] * 16, 16)
    b = token_block_keys([3] * 16 + [2] * 16, 16)
    assert a[1] != b[1] and a == token_block_keys([1] * 16 + [2] * 16 + [9] * 5, 16)


@pytest.mark.parametrize("ids", [tuple(range(50)), (-1, 3, -7), (2**63 - 1, -(2**63), 2**61, -1),
                                 tuple(range(-2**64, 2**64, 2**59)), (True, 5)])
def test_salted_prefix_sums_key_every_prefix_apart(ids):
    """Equal prefixes get equal keys whatever follows them (also when later ids are wider
    than 64 bits), and every prefix of a prompt its own key."""
    from baton.core.prefix import _salted_prefix_sums
    keys = _salted_prefix_sums(ids)
    assert len(set(keys)) == len(ids)
    for n in range(1, len(ids)):
        assert _salted_prefix_sums(ids[:n]) == keys[:n]
        assert _salted_prefix_sums(ids[:n] + (2**70,)) [:n] == keys[:n]
    assert _salted_prefix_sums(ids[1:2] + ids[:1]) != keys[:2] or ids[0] == ids[1]
