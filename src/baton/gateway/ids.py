"""Request ids the gateway makes: unique and unguessable, each 128 random bits from the
operating system's CSPRNG (``secrets``). The response id a client sees and the
``X-Request-Id`` legs carry to engines (which key KV handoffs and aborts by it) were a
random per-process prefix plus a counter: one response id told a client every other
request's id, past and future. A fresh ``secrets`` draw costs about a microsecond, a
few per request."""

from __future__ import annotations

import secrets


class IdSource:
    """``next()`` gives a fresh 32-hex-digit id."""

    def next(self) -> str:
        return secrets.token_hex(16)
