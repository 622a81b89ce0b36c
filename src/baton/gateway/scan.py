"""The per-token fast path: a run of ordinary stream events read by byte searches, never
decoded.

An ordinary event is one output chunk as vLLM (and the emulator) writes it for the
gateway, which always asks for token ids: ``data: {...}`` and a blank line, with a
``"finish_reason":null`` and a ``"token_ids":[...]`` list. A run of them needs nothing but
its token count (the ids' count) and its ids (kept as bytes, turned into integers only
when a continuation needs them); the client gets the bytes as they came, with the id lists
nulled when it did not ask for them. A region that does not scan (another framing,
whitespace inside the JSON, an event without its id list) is parsed event by event as
before, and so are the few events at its end that finish a stream.

The counts run in StringZilla (SIMD byte searches, about 16 bytes a nanosecond here):
CPython's own ``bytes.count`` reads 3-4 bytes a nanosecond, and three counts over a
512-token read (120 KB) took about 110 us of the scan's 290 (``benchmarks/gateway_overhead.py``'s
profile: the scan was a third of the relay's CPU on long streams). The id lists are split
out with one regular expression: they must become objects anyway (ids kept, lists nulled).

The searches rely on JSON's escaping: inside a string every quote is escaped (``\\"``) and
a newline is ``\\n``, so a needle that starts or ends with a bare quote, such as
``"token_ids":[``, can only match a key, and a raw newline only framing, never text a
model wrote.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from stringzilla import Str

from baton.protocol.requests import CHAT, COMPLETIONS

EVENT_END = b"\n\n"
_EVENT_START = b"data: {"
_NEXT_EVENT = EVENT_END + _EVENT_START  # a raw newline cannot be inside JSON: this is framing
_NO_FINISH = b'"finish_reason":null'
_IDS_KEY = b'"token_ids":['
_IDS = re.compile(rb'"token_ids":\[([0-9,]*)\]')
_LEADING_ZERO = re.compile(rb'(?:^|,)0[0-9]')  # not a JSON integer
_NULL_IDS = b'"token_ids":null'
_NOT_ORDINARY = (b'"usage":{', b'"error"')
TAIL_EVENTS = 8  # at most this many events at a region's end are parsed (finish, usage, [DONE])
# counting without ids: every event's text is a string (one token unless empty), as the parser counts
_TEXT = {COMPLETIONS: b'"text":"', CHAT: b'"content":"'}
_EMPTY_TEXT = {COMPLETIONS: b'"text":""', CHAT: b'"content":""'}
_PARSER_JUDGES = (b'"tool_calls"', b'"function_call"', b'"reasoning')  # output besides the text


@dataclass(slots=True)
class Run:
    """A run of ordinary events: ``events`` of them holding ``tokens`` output tokens
    whose ids are ``ids`` (comma-separated decimal bytes, empty lists included);
    ``client`` is the run as the client gets it (verbatim, or id lists nulled)."""

    client: bytes
    events: int
    tokens: int
    ids: bytes


def _ordinary(event: bytes, with_ids: bool = True) -> bool:
    return event.startswith(_EVENT_START) and _NO_FINISH in event and (_IDS_KEY in event or not with_ids) \
        and not any(n in event for n in _NOT_ORDINARY)


def _framed(fast: Str, events: int) -> bool:
    """Whether ``fast`` (whole events, starting ``data: {`` and ending with a blank line)
    is ``events`` events of one line each, every one with ``"finish_reason":null``."""
    return events > 0 and fast.count(b"\n") == 2 * events and fast.count(_NEXT_EVENT) == events - 1 \
        and fast.count(_NO_FINISH) == events


def scan(region: bytes, null_ids: bool) -> Run | None:
    """``region`` (whole events, ending with a blank line) as a Run, or None when any
    event in it is not ordinary: each event is ``data: {`` framed by blank lines, has a
    ``"finish_reason":null`` and one id list, so an event without them (a finish, usage
    alone, an error, ``[DONE]``, a comment) makes a count disagree, and id lists orjson
    would not read make it give up. Three counts and one split over the bytes in C, none
    per event in Python. (A chunk with two choices, or prompt ids after the first chunk,
    would pass: neither is in the one-choice format the gateway asks engines for.)"""
    if not region.startswith(_EVENT_START) or not region.endswith(EVENT_END):
        return None
    parts = _IDS.split(region)
    lists = parts[1::2]
    events = len(lists)
    if not _framed(Str(region), events):  # Str: a view, no copy
        return None
    ids = b",".join(x for x in lists if x) if b"" in lists else b",".join(lists)  # empty lists are rare
    if not _json_integers(ids):
        return None
    return Run(_NULL_IDS.join(parts[0::2]) if null_ids else region, events, ids.count(b",") + 1 if ids else 0, ids)


def _json_integers(ids: bytes) -> bool:
    """Whether comma-separated ``ids`` are integers as JSON writes them (no empty element,
    no leading zero), by byte searches on the ids alone (a regular expression over them
    cost 0.17 us a token). Integers past 64 bits are not caught: orjson would refuse them,
    and a continuation carrying one is refused by the engine."""
    if b",," in ids or ids[:1] == b"," or ids[-1:] == b",":
        return False
    return not ((b",0" in ids or ids[:1] == b"0") and _LEADING_ZERO.search(ids))


def count(region: bytes, kind: str) -> Run | None:
    """``region``'s output tokens for a reader that relays nothing (an endpoint picker's
    view of a response Envoy relays): by its id lists when every event has one
    (``scan``), else one token per event whose text is not empty, as the parser counts
    chunks without ids (``upstream.piece_of``). None when any event is not ordinary, has
    no string text, or may hold output besides the text (tool calls, reasoning: the
    parser judges those). The Run's ``client`` and ``ids`` are empty."""
    if not region.startswith(_EVENT_START) or not region.endswith(EVENT_END):
        return None
    fast = Str(region)
    if fast.count(_IDS_KEY):
        return scan(region, False)
    events = fast.count(EVENT_END)
    if not _framed(fast, events) or fast.count(_TEXT[kind]) != events or any(fast.contains(n) for n in _PARSER_JUDGES):
        return None
    return Run(b"", events, events - fast.count(_EMPTY_TEXT[kind]), b"")


def split(region: bytes, null_ids: bool, counting: str | None = None) -> tuple[Run | None, bytes]:
    """(the ordinary events ``region`` starts with as a Run, the events after them); a
    stream's last read usually holds a long run and then its finish, usage and
    ``[DONE]``: only those few are parsed. (None, region) when the run does not scan.
    ``counting``: the request kind of a reader that only counts (``count``)."""
    cut = len(region)
    for _ in range(TAIL_EVENTS):
        start = region.rfind(EVENT_END, 0, cut - len(EVENT_END)) + len(EVENT_END)
        start = 0 if start < len(EVENT_END) else start
        if _ordinary(region[start:cut], counting is None):
            break
        cut = start
        if not cut:
            return None, region
    else:
        return None, region
    run = scan(region[:cut], null_ids) if counting is None else count(region[:cut], counting)
    return (run, region[cut:]) if run is not None else (None, region)


def ids_of(blobs: list[bytes]) -> list[int]:
    """The integers in Runs' ``ids`` (each comma-separated, empty fields skipped)."""
    return [int(x) for x in b",".join(blobs).split(b",") if x]


class IdLog:
    """A request's output token ids in arrival order: lists as pieces bring them, Runs'
    bytes kept as they are until someone reads ``all()`` (a continuation)."""

    def __init__(self) -> None:
        self._ids: list[int] = []
        self._raw: list[bytes] = []

    def add(self, ids: list[int]) -> None:
        if self._raw:
            self._settle()
        self._ids.extend(ids)

    def add_raw(self, ids: bytes) -> None:
        self._raw.append(ids)

    def all(self) -> list[int]:
        if self._raw:
            self._settle()
        return self._ids

    def _settle(self) -> None:
        self._ids.extend(ids_of(self._raw))
        self._raw.clear()
