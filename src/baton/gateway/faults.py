"""Whose fault a request's failed legs are: the engine's, or the request's own.

An engine answering an HTTP error is not yet known to be broken: the request may be one
no engine can serve (a chat part that crashes the engine's template, say). Such an
answer makes the request a *suspect* of that engine and the leg is sent again elsewhere.
Then:

- the request succeeds elsewhere: the engines that failed it are to blame (outlier
  ejection counts it: ``Control.blame``);
- it fails with an HTTP error on a second engine, and every engine that failed it serves
  other requests well: the request is probably at fault, but two transient errors look
  the same, so it is sent once more to one of those engines. Failing a third time there,
  it is *quarantined* (a 422 to its client, not tried again) and no engine is blamed, so a
  stream of such requests cannot take engines out of service;
- it fails on a second engine that fails other requests too: an outage, not the
  request; those engines are blamed and the request goes on as far as recovery allows.

An engine that did not answer at all (refused connection, hang, broken or malformed
answer) is to blame at once, as before. A 404 is the engine's fault too (the gateway
chose the model name it sent; the engine has probably restarted under another one).
A 4xx other than 404 is the engine refusing this request: its answer goes to the client.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from baton.gateway.flow_parts import FlowParts
from baton.gateway.upstream import UpstreamError
from baton.protocol.errors import ApiError


class LegFaults:
    """Failed legs of one request and what they mean for it and for the engines.
    ``rediscover(iid)`` asks an engine that answered 404 for its model names again."""

    def __init__(self, parts: FlowParts, rediscover: Callable[[int], None]) -> None:
        self.control, self.rediscover = parts.control, rediscover
        self.config, self.metrics, self.cluster = parts.config, parts.metrics, parts.cluster
        self.failed_on: set[int] = set()  # instances whose leg failed for this request
        self.deaths = 0                   # engine faults while the request was in flight
        self.hung_on: set[int] = set()    # instances whose leg failed only by a read deadline
        self.suspects: dict[int, UpstreamError] = {}  # HTTP error answers not yet attributed
        self.second_chance = True  # one more leg before a quarantine (errors may be transient)

    async def failed(self, iid: int, err: UpstreamError, what: str, leg_age_s: float = 0.0) -> None:
        """Book a failed leg on ``iid`` that was sent ``leg_age_s`` seconds ago. Returns
        when the leg may be sent again elsewhere; raises ApiError when the request must end
        (the engine's own 4xx, a quarantine, or ``max_engine_deaths`` engine faults that
        came within ``death_window_s`` of their leg's start)."""
        self.failed_on.add(iid)
        if err.timed_out:
            self.hung_on.add(iid)
        if err.status is None or err.malformed:
            return self._engine_fault(iid, err, leg_age_s)
        if err.status == 404:
            self.control.backend_error(iid, err)
            self.rediscover(iid)
            return None
        self.control.backend_error(iid, err, blame=False)
        if err.status < 500:
            raise err.client_error(what)
        again = iid in self.suspects  # the second chance failed on an engine that failed it before
        self.suspects[iid] = err
        if len(self.suspects) >= 2 or again:
            await self._second_opinion(err, what)
        return None

    def _engine_fault(self, iid: int, err: UpstreamError, leg_age_s: float) -> None:
        self.control.backend_error(iid, err)
        if not err.connect and leg_age_s <= self.config.death_window_s:
            self.deaths += 1
        if self.deaths >= self.config.max_engine_deaths:
            raise ApiError(502, f"engines failed {self.deaths} times while serving this request; "
                                "not retrying it", err_type="server_error", code="backend_error")

    async def _second_opinion(self, err: UpstreamError, what: str) -> None:
        engines = sorted(self.suspects)
        if await self.control.at_fault(engines):
            if self.second_chance:  # once more on one of them (``elsewhere`` may choose them again)
                self.second_chance = False
                self.failed_on -= set(engines)
                return
            self.suspects.clear()
            self.metrics.quarantined.inc()
            names = ", ".join(self.cluster.engines[i].spec.name for i in engines)
            raise ApiError(422, f"the request failed on {len(engines)} engines ({names}) that serve other "
                                f"requests; it is not tried again. Last answer: {err}",
                           err_type="invalid_request_error", code="request_failed_on_engines")
        self.settle()  # engines failing everything: an outage, theirs

    def succeeded(self, iid: int) -> None:
        """A leg on ``iid`` was answered with 200: the suspects were the engines' fault."""
        self.control.leg_ok(iid)
        self.settle()

    def settle(self) -> None:
        """Blame the engines of every unattributed error (also when the request ends:
        it never proved itself at fault)."""
        for iid in self.suspects:
            self.control.blame(iid)
        self.suspects.clear()

    async def elsewhere(self, err: UpstreamError, what: str,
                        choose: Callable[[frozenset[int]], Awaitable[int]]) -> int:
        """Another instance for a failed leg (``choose(exclude)``). When every instance is
        excluded, those whose legs only missed a deadline are tried again (an engine stalled
        by a burst is better than none); when none is left at all, the client gets the
        engine's own answer rather than "no healthy instance"."""
        try:
            return await choose(frozenset(self.failed_on))
        except ApiError as none_left:
            hard = self.failed_on - self.hung_on
            if hard != self.failed_on:
                try:
                    return await choose(frozenset(hard))
                except ApiError:
                    pass
            raise self.last_answer(err, none_left, what) from None

    def last_answer(self, err: UpstreamError, fallback: ApiError, what: str) -> ApiError:
        """What the client gets when no other instance can take the leg: the engine's own
        HTTP error if it answered one, else ``fallback``."""
        if err.status is not None and not err.malformed and err.status != 404:
            return err.client_error(what)
        return fallback
