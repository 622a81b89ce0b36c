"""Replay prompts: token ids made from prefix identity share exactly the blocks the ids
share; without identity, no two requests share a prefix (engines cache prefixes)."""

from baton.core.request import Request
from baton.gateway.replay import prompt_for


def test_equal_prefix_ids_give_equal_token_blocks_and_the_prompt_length():
    a = Request(0, 0.0, 40, 5, (7, 8, 9), 16)
    b = Request(1, 0.0, 40, 5, (7, 8, 10), 16)
    pa, pb = prompt_for(a), prompt_for(b)
    assert len(pa) == len(pb) == 40 and pa[:32] == pb[:32] and pa[32:] != pb[32:]


def test_requests_without_identity_share_no_first_block_even_5000_apart():
    # cache keys are chained: with distinct first blocks, no later block is shared either
    firsts = [tuple(prompt_for(Request(i, 0.0, 64, 1))[:16]) for i in (0, 1, 5000, 10000)]
    assert len(set(firsts)) == 4
