"""Keep-alive connections to engines that are reused only when each response ended
exactly at its HTTP framing.

aiohttp returns a connection to its pool the moment a response's body reaches its end
(``Content-Length`` bytes, or the last chunk), from inside the parser: the rest of that
read is parsed *afterwards*, on a connection already in the pool. Bytes an engine writes
after a complete response, in the same write as its body's end or later while the
connection idles, are parsed as the *next* response and handed to the next request sent
on that connection: another client's (measured on aiohttp 3.14: with a 50 ms delayed
duplicate answer, every second request got the previous one's body). aiohttp only
refuses a connection with such bytes when they arrived in the same read as the whole
response (it sees the queued message at release); the pool itself checks nothing but
that the socket is open.

``FramedHandler`` is aiohttp's response protocol with one rule: after a request's
response has ended, any byte from the engine before the next request is sent closes the
connection (the pool then never hands it out: it checks ``is_connected()``), and so does
a second response to one request. Bytes after the end that do not make a whole response
head are dropped with that response's parser (aiohttp makes a new one per request) or,
if more follow while idle, close the connection too. Well-behaved engines keep their
keep-alive connections.

It relies on ``TCPConnector._factory`` (the protocol factory, private) and on the
protocol's ``feed_data`` receiving each parsed ``(message, payload)``; where either is
missing or changed, connections are closed after every response instead of reused
(``should_close`` holds until a response's end has been seen).
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import aiohttp
from aiohttp.client_proto import ResponseHandler

log = logging.getLogger("baton.gateway")


class FramedHandler(ResponseHandler):
    """aiohttp's client protocol, closed on any byte outside one response per request."""

    _expecting = False  # a request was sent on this connection (set_response_params ran)
    _answer: Any = None  # that request's response payload (a StreamReader), once parsed
    _spoiled = False

    def set_response_params(self, *args: Any, **kwargs: Any) -> None:
        # aiohttp calls this for every request, before sending it: a new exchange starts
        self._expecting, self._answer = True, None
        super().set_response_params(*args, **kwargs)

    def _answered(self) -> bool:
        """The current request's response has been read to its end."""
        answer = self._answer
        return answer is not None and answer.is_eof()

    def data_received(self, data: bytes) -> None:
        if data and (self._spoiled or not self._expecting or self._answered()):
            self._spoil("bytes outside a response")
            return  # never parsed: they would become the next request's response
        super().data_received(data)

    def feed_data(self, data: Any, *args: Any) -> None:
        """Each parsed response, as ``(message, payload)``: the first final one is this
        request's answer; another before the next request is an engine writing past it."""
        message, payload = data if isinstance(data, tuple) and len(data) == 2 else (None, None)
        code = getattr(message, "code", None)
        if isinstance(code, int) and 100 <= code < 200 and code != 101:
            return super().feed_data(data, *args)  # informational: the final answer follows
        if self._answer is not None or not self._expecting or payload is None:
            self._spoil("a second response to one request")
            return
        self._answer = payload
        super().feed_data(data, *args)

    @property
    def should_close(self) -> bool:
        # a response whose end was never seen (or a spoiled connection) is never pooled
        return self._spoiled or not self._answered() or super().should_close

    def is_connected(self) -> bool:
        return not self._spoiled and super().is_connected()

    def _spoil(self, why: str) -> None:
        if not self._spoiled:
            log.warning("closing an engine connection: %s", why)
        self._spoiled = True
        transport = self.transport
        if transport is not None:
            # a response already parsed stays readable (aiohttp's queue returns buffered
            # messages before the disconnect); the pool drops the closed socket
            transport.close()


def upstream_connector(**kwargs: Any) -> aiohttp.TCPConnector:
    """A ``TCPConnector(**kwargs)`` whose connections are ``FramedHandler``s; if this
    aiohttp builds its protocols another way, one that closes every connection after
    its response (``force_close``) rather than risk a desynchronised one."""
    connector = aiohttp.TCPConnector(**kwargs)
    factory = getattr(connector, "_factory", None)
    if isinstance(factory, functools.partial) and factory.func is ResponseHandler:
        connector._factory = functools.partial(FramedHandler, *factory.args, **factory.keywords)
        return connector
    log.warning("aiohttp %s: cannot check engine responses' framing; engine connections are not reused",
                aiohttp.__version__)
    return aiohttp.TCPConnector(force_close=True, **kwargs)
