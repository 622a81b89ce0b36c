"""The per-token fast path (gateway.scan) against the event-by-event parser it stands for."""

from __future__ import annotations

import random

import pytest

from baton.gateway.scan import IdLog, count, ids_of, scan, split
from baton.gateway.upstream import StreamLeg
from baton.protocol.chunks import DONE, sse, stream_chunk, usage_chunk, without_token_ids
from baton.protocol.requests import CHAT, COMPLETIONS


def chunk(kind: str, text: str, ids: list[int] | None, finish: str | None = None, first: bool = False) -> bytes:
    return sse(stream_chunk(kind, "cmpl-1", "m", 1, text, finish, ids, first))


@pytest.mark.parametrize("kind", [COMPLETIONS, CHAT])
def test_a_run_of_ordinary_events_counts_ids_and_nulls_them_for_the_client(kind):
    events = [chunk(kind, " a", [7]), chunk(kind, ' "token_ids":[1,2]', [8, 9]), chunk(kind, "", [])]
    run = scan(b"".join(events), null_ids=False)
    assert run is not None and (run.events, run.tokens, ids_of([run.ids])) == (3, 3, [7, 8, 9])
    assert run.client == b"".join(events)
    assert scan(b"".join(events), null_ids=True).client == \
        b"".join(b"data: " + without_token_ids(e[6:-2], 1) + b"\n\n" for e in events)


@pytest.mark.parametrize("region", [
    b"",
    chunk(COMPLETIONS, "a", None),                       # no ids: the text decides the count
    chunk(COMPLETIONS, "a", [1], finish="stop"),         # a finish
    chunk(COMPLETIONS, "a", [1]).replace(b":", b": "),   # another JSON layout
    chunk(COMPLETIONS, "a", [1]).replace(b"data: ", b"data:"),
    chunk(COMPLETIONS, "a", [1]).replace(b"\n\n", b"\r\n\r\n"),
    b": keep-alive\n\n" + chunk(COMPLETIONS, "a", [1]),  # an SSE comment
    chunk(COMPLETIONS, "a", [1]) + sse(usage_chunk(COMPLETIONS, "cmpl-1", "m", 1, 3, 4)),
    chunk(COMPLETIONS, "a", [1]) + sse({"error": {"message": "boom"}}) + chunk(COMPLETIONS, "b", [2]),
    chunk(COMPLETIONS, "a", [1]) + DONE,
    chunk(COMPLETIONS, "a", [1]) + chunk(COMPLETIONS, "a", [1], finish="stop"),
    chunk(COMPLETIONS, "a", [1]).replace(b"[1]", b"[1,,2]"),    # not JSON: the parser refuses it
    chunk(COMPLETIONS, "a", [1]).replace(b"[1]", b"[007]"),
    chunk(COMPLETIONS, "a", [1]).replace(b"[1]", b"[5,01]"),
    chunk(COMPLETIONS, "a", [1]).replace(b"[1]", b"[1,]"),
])
def test_anything_but_ordinary_events_is_left_to_the_parser(region):
    assert scan(region, null_ids=True) is None


def test_split_parses_only_the_tail_from_the_first_event_that_may_not_be_ordinary():
    head = b"".join(chunk(COMPLETIONS, f" w{i}", [i]) for i in range(5))
    tail = chunk(COMPLETIONS, "", [], finish="length") + sse(usage_chunk(COMPLETIONS, "c", "m", 1, 4, 5)) + DONE
    run, rest = split(head + tail, False)
    assert run is not None and run.tokens == 5 and run.client == head and rest == tail
    assert split(tail, False) == (None, tail)
    assert split(head, False) == (scan(head, False), b"")
    broken = head + sse({"error": {"message": "boom"}}) + head + tail  # not at the end: no run at all
    assert split(broken, False) == (None, broken)


def _stream(rng: random.Random, kind: str) -> tuple[bytes, list[int]]:
    ids, events = [], [chunk(kind, "", [], first=True)]
    for _ in range(rng.randrange(1, 40)):
        new = [rng.randrange(0, 200_000) for _ in range(rng.choice((1, 1, 1, 2, 5)))]
        ids += new
        text = rng.choice(['x', ' "token_ids":[3]', '\\"', '"finish_reason":"stop"', "data: {", "\n\n"])
        events.append(chunk(kind, text, new))
    events += [chunk(kind, "", [], finish="length"), sse(usage_chunk(kind, "c", "m", 1, 4, len(ids))), DONE]
    return b"".join(events), ids


@pytest.mark.parametrize("seed", range(12))
def test_a_leg_read_fast_relays_what_the_parser_would(seed):
    """Random streams (texts that look like keys, events, framing) cut at random points:
    the fast leg gives the same tokens, ids, finish and client bytes as the parser."""
    rng = random.Random(seed)
    kind = rng.choice((COMPLETIONS, CHAT))
    raw, ids = _stream(rng, kind)
    results = []
    for mode in ("parse", "fast", "decided"):  # "decided": the leg turns fast at its first chunk
        leg = StreamLeg(0, kind, "http://x", {}, {})
        leg.fast = mode == "fast"
        if mode == "decided":
            leg.verbatim, leg.client_model = None, "m"
        cuts = sorted(rng.sample(range(1, len(raw)), 6))
        pieces = []
        for a, b in zip([0, *cuts], [*cuts, len(raw)]):
            leg._feed(raw[a:b], pieces)
        log, out, tokens = IdLog(), [], 0
        for p in pieces:
            tokens += p.tokens
            if p.run is not None:
                log.add_raw(p.run.ids)
                out.append(p.run.client)
            else:
                log.add(p.token_ids or [])
                out.append(b"data: " + without_token_ids(p.raw, 2) + b"\n\n")
        results.append((tokens, log.all(), b"".join(out), leg.done, leg.finished))
        assert any(p.run is not None for p in pieces) == (mode != "parse")
        if mode != "parse":  # per read at most one event whose blank line is still to come, and the first
            assert sum(1 for p in pieces if p.run is None and p.tokens) <= len(cuts) + 2
        assert [p.opens for p in pieces].count(True) == (mode == "decided")
    assert results[0] == results[1] == results[2]
    assert results[0][0] == len(ids) and results[0][1] == ids


def test_a_leg_in_another_framing_is_parsed_line_by_line():
    """CRLF framing never scans (no blank line in the fast path's form): every event is
    parsed, none is held back waiting for one."""
    raw = b"".join(chunk(COMPLETIONS, "a", [i]).replace(b"\n", b"\r\n") for i in range(4)) + DONE
    leg = StreamLeg(0, COMPLETIONS, "http://x", {}, {})
    leg.verbatim, leg.client_model = None, "m"
    pieces = []
    leg._feed(raw, pieces)
    assert leg.fast and leg.done and [p.token_ids for p in pieces] == [[0], [1], [2], [3]]


def test_the_id_log_keeps_arrival_order_across_both_paths():
    log = IdLog()
    log.add([1, 2])
    log.add_raw(b"3,4")
    log.add_raw(b"")
    log.add([5])
    log.add_raw(b"6")
    assert log.all() == [1, 2, 3, 4, 5, 6]


def _counting_stream(rng: random.Random, kind: str) -> bytes:
    """A stream as an engine answers a client that did not ask for ids (or did): empty
    texts, texts that look like keys, and now and then a chunk the parser must judge."""
    with_ids = rng.random() < 0.3
    events = [chunk(kind, "", [] if with_ids else None, first=True)]
    for i in range(rng.randrange(1, 40)):
        text = rng.choice(["x", "", ' "text":""', '\\"', '"content":""', '"finish_reason":"stop"', "\n\n"])
        events.append(chunk(kind, text, [i] if with_ids else None))
        if rng.random() < 0.08:  # output the bytes cannot judge: the parser counts it
            extra = {"tool_calls": [{"index": 0}]} if kind == CHAT else {"text": None}
            obj = stream_chunk(kind, "cmpl-1", "m", 1, "", None)
            (obj["choices"][0]["delta"] if kind == CHAT else obj["choices"][0]).update(extra)
            events.append(sse(obj))
    events += [chunk(kind, "", [] if with_ids else None, finish="stop"), sse(usage_chunk(kind, "c", "m", 1, 4, 9)), DONE]
    return b"".join(events)


@pytest.mark.parametrize("seed", range(16))
def test_a_counting_reader_counts_what_the_parser_counts(seed):
    """An endpoint picker's reader (relays nothing, counts tokens by bytes): the same
    tokens and finish as the parser on random streams with and without ids, cut at random
    points, and most of it by byte counts."""
    rng = random.Random(seed)
    kind = rng.choice((COMPLETIONS, CHAT))
    raw = _counting_stream(rng, kind)
    results = []
    for counting in (False, True):
        leg = StreamLeg(0, kind, "http://x", {}, {})
        leg.fast = leg.counting = counting
        pieces = []
        cuts = sorted(rng.sample(range(1, len(raw)), 4))
        for a, b in zip([0, *cuts], [*cuts, len(raw)]):
            pieces += leg.feed(raw[a:b])
        results.append((sum(p.tokens for p in pieces), leg.finished, leg.done))
        if counting:
            assert any(p.run is not None for p in pieces)
    assert results[0] == results[1]


@pytest.mark.parametrize("kind", [COMPLETIONS, CHAT])
def test_counting_without_ids_takes_one_token_per_non_empty_text(kind):
    events = [chunk(kind, "", None, first=True), chunk(kind, " a", None), chunk(kind, "", None), chunk(kind, "b", None)]
    run = count(b"".join(events), kind)
    assert run is not None and (run.events, run.tokens) == (4, 2)
    assert count(b"".join(events[:2] + [chunk(kind, "c", [1])]), kind) is None  # ids on some events only
    assert count(chunk(kind, "a", None) + chunk(kind, "", None, finish="stop"), kind) is None
