"""Reading request bodies, judged by their rate rather than by how many are in flight.

A body that arrived with its head (almost every API request) is taken at once and counts
nowhere: a burst from one address (a load balancer, a benchmark, a proxy every client
shares) is never refused for it. A body still arriving after ``slow_body_after_s`` is
*slow*: it counts towards ``max_body_reads`` (all addresses) and
``max_body_reads_per_client`` (its address). While an address is at its cap, new bodies
from there are refused (429). While the gateway is at its cap, a body turning slow takes
the place of the slowest slow body (the lowest average rate so far), which is dropped with
408, when it arrives faster than that one; else it is refused (429): bodies trickling from
many addresses cannot lock a faster one out. A slow body must keep arriving at
``min_body_bytes_per_s`` on average or it is dropped (408), and it has ``body_timeout_s``
in all: a trickling connection holds a slot for about ``slow_body_after_s`` plus a check,
not for the whole body timeout.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from baton.protocol.errors import ApiError
from baton.protocol.requests import ParsedRequest, parse_json, parse_request, split_fields

CHECK_EVERY_S = 0.25  # how often a slow body's rate is judged


@dataclass(frozen=True, slots=True)
class BodyLimits:
    """The caps on bodies being received (sizes in bytes, times in seconds)."""

    max_body_bytes: int
    body_timeout_s: float
    max_slow: int                 # slow bodies in all
    max_slow_per_client: int      # slow bodies per client address
    slow_after_s: float = 1.0     # a body still arriving after this is slow
    min_bytes_per_s: float = 4096.0  # a slow body's average rate below this: dropped (408)


class BodyReads:
    """The bodies being received and the slow ones among them, per client address."""

    def __init__(self, limits: BodyLimits, on_refused: Callable[[str], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limits, self.on_refused, self.clock = limits, on_refused, clock
        self.slow = 0
        self.slow_by: dict[str, int] = {}
        self._slow_reads: dict[asyncio.Future, tuple[web.Request, float]] = {}  # reading -> (request, start)
        self._evicted: set[asyncio.Future] = set()

    def _refuse(self) -> ApiError:
        self.on_refused("body_reads")
        return ApiError(429, "too many slow request bodies being received; retry later",
                        err_type="rate_limit_exceeded", code="429")

    def check_room(self, client: str) -> None:
        """429 when this address is at its cap of slow bodies (the gateway's own cap is
        judged by rate when a body turns slow: ``_make_room``)."""
        if self.slow_by.get(client, 0) >= self.limits.max_slow_per_client:
            raise self._refuse()

    def _make_room(self, request: web.Request, start_s: float) -> None:
        """At the gateway's cap: drop the slowest slow body if this one arrives faster, or
        refuse this one (429)."""
        if self.slow < self.limits.max_slow:
            return
        now = self.clock()
        rate = lambda req, t0: req.content.total_bytes / max(now - t0, 1e-9)  # noqa: E731
        slowest = min(self._slow_reads, key=lambda f: rate(*self._slow_reads[f]), default=None)
        if slowest is None or rate(*self._slow_reads[slowest]) >= rate(request, start_s):
            raise self._refuse()
        self.on_refused("slow_body")
        self._evicted.add(slowest)
        slowest.cancel()

    async def read(self, request: web.Request, client: str) -> bytes:
        """The body's bytes: 413 beyond ``max_body_bytes`` (at once when the declared length
        says so), 408 when it arrives too slowly or not within ``body_timeout_s``."""
        lim = self.limits
        if request.content_length is not None and request.content_length > lim.max_body_bytes:
            raise self.too_large()
        if request.content.is_eof():  # it came with the head: nothing to wait for
            return await self._whole(request.read())
        self.check_room(client)
        reading = asyncio.ensure_future(request.read())
        try:
            return await self._watch(reading, request, client)
        finally:
            if not reading.done():
                reading.cancel()

    async def _watch(self, reading: asyncio.Future, request: web.Request, client: str) -> bytes:
        lim, start_s = self.limits, self.clock()
        done, _ = await asyncio.wait({reading}, timeout=lim.slow_after_s)
        if done:
            return await self._whole(reading)
        self.check_room(client)  # bodies that started together turn slow together: the caps hold then too
        self._make_room(request, start_s)
        self._count(client, +1)
        self._slow_reads[reading] = (request, start_s)
        try:
            while True:
                done, _ = await asyncio.wait({reading}, timeout=CHECK_EVERY_S)
                if reading in self._evicted:
                    raise ApiError(408, "request body arriving slower than the others while the gateway was at "
                                        "max_body_reads: dropped for a faster one", code="request_timeout")
                if done:
                    return await self._whole(reading)
                elapsed_s = self.clock() - start_s
                if elapsed_s >= lim.body_timeout_s:
                    raise ApiError(408, f"request body not received within {lim.body_timeout_s} s",
                                   code="request_timeout")
                if request.content.total_bytes < lim.min_bytes_per_s * elapsed_s:
                    self.on_refused("slow_body")
                    raise ApiError(408, f"request body arriving slower than {lim.min_bytes_per_s:.0f} "
                                        "bytes/s (min_body_bytes_per_s)", code="request_timeout")
        finally:
            self._count(client, -1)
            self._slow_reads.pop(reading, None)
            self._evicted.discard(reading)

    async def _whole(self, reading) -> bytes:
        try:
            return await reading
        except web.HTTPRequestEntityTooLarge:
            raise self.too_large() from None

    def _count(self, client: str, step: int) -> None:
        self.slow += step
        n = self.slow_by.get(client, 0) + step
        if n:
            self.slow_by[client] = n
        else:
            self.slow_by.pop(client, None)

    def too_large(self) -> ApiError:
        return ApiError(413, f"request body exceeds {self.limits.max_body_bytes} bytes (max_body_bytes)",
                        code="request_too_large")


def decode_body(kind: str, raw: bytes) -> tuple[ParsedRequest, list[str]]:
    """(the validated request with only the allowed fields, the names of those dropped);
    ApiError 400 if the body is not a valid request. Runs on any thread."""
    parsed = parse_request(kind, parse_json(raw))
    parsed.body, dropped = split_fields(parsed.body)
    return parsed, dropped
