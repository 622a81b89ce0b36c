"""Stop strings on the emulator's known output: the plan equals a search of the whole text
(the planner keeps only the text a new match can span)."""

import random

from baton.emulator.stops import plan_stop
from baton.emulator.tokens import token_text


def reference(stops, first, n, keep):
    text = ""
    for k in range(n):
        text += token_text(first + k)
        hits = [(text.find(s), s) for s in stops if text.find(s) >= 0]
        if hits:
            at, s = min(hits)
            return k + 1, at + len(s) if keep else at, s
    return None


def test_a_stop_longer_than_the_text_before_it_is_found():
    plan = plan_stop(["was with be"], 4, 60)  # " in is that for it as was with be": tokens of 3-5 characters
    assert (plan.tokens, plan.text_chars) == (9, len(" in is that for it as "))


def test_plans_equal_a_whole_text_search():
    rng = random.Random(1)
    for trial in range(2000):
        first, n = rng.randint(0, 500), rng.randint(1, 80)
        full = "".join(token_text(first + i) for i in range(n))
        stops = [full[a:a + rng.randint(1, 25)] for a in (rng.randint(0, len(full) - 1) for _ in range(2))]
        stops.append(f"zq{trial}")
        keep = rng.random() < 0.5
        got = plan_stop(stops, first, n, keep)
        assert ((got.tokens, got.text_chars, got.stop_str) if got else None) == reference(stops, first, n, keep)
